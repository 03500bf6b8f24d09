"""Reporter for PyTorch/XLA: live XLA tensors, compile counters and, outside SPMD, HBM.

``torch_xla.debug.metrics`` counters cost about half a microsecond to read and need no
graph sync: ``CreateXlaTensor - DestroyXlaTensor - VirtualDeviceUsage`` is the number of
live XLA tensors (flat in a healthy loop, +1 per step for ``losses.append(loss)``);
``UncachedCompile`` growing after warm-up is recompilation.

Why ``VirtualDeviceUsage``: under SPMD, ``xs.mark_sharding`` on a tensor whose data is
still on the host (a batch just moved to the device, the usual per-step input) replaces
its data with sharded data and registers the *same* tensor again
(``ShardingUtil::XlaMarkSharding`` ends in ``RegisterTensor(xtensor->data())``). The
registry is keyed by the tensor's id, so nothing new is alive, but ``CreateXlaTensor``
counts one more, and the tensor's death counts one ``DestroyXlaTensor``: without the
correction a healthy SPMD loop seems to keep one tensor per step. That path, and only that
path, counts ``VirtualDeviceUsage``; marks of IR values (activations,
``MarkShardingFunction``, which clones) count ``XlaAnnotateCustomSharding`` and register
nothing. A mark of an unsharded tensor whose data is already on the device registers it again too,
with no counter of its own; a loop doing that every step would still seem to gain one
tensor a step, which is one reason the agent never calls a leak on a live count that rises
while no memory grows with it. ``xm.get_memory_info`` raises on CPU and under
SPMD (the multi-host TPUv4 case); it is tried once and then left alone, since the
runtime's own metrics (tpu-info) give HBM for every chip anyway.

Usage, after each step's ``torch_xla.sync()`` (or ``xm.mark_step()``)::

    reporter = TorchXlaReporter()
    ...
    reporter.step(step)

Live-tensor snapshots (``take_snapshot``) and creation-site tracking (``start_tracking``,
opt-in: ``track_sites=True`` or ``TPUMON_TRACK_SITES=1``) are in ``live_torch_xla``; the
agent asks for them through ``step()``, so tracking runs on the thread that calls it.
"""

from __future__ import annotations

from typing import Any, Callable

from tpumon.instrument.reporter import Reporter


class TorchXlaReporter(Reporter):
    framework = "torch_xla"
    live_module = "tpumon.instrument.live_torch_xla"

    def __init__(self, every: int = 1, socket: str | None = None, min_interval: float = 0.05,
                 device: Any = None, track_sites: bool | None = None,
                 last_words: bool = True) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
        import torch_xla.runtime as xr

        super().__init__(every, socket, min_interval, track_sites, last_words)
        self._counter = met.counter_value
        self._xm = xm
        self._device = device if device is not None else torch_xla.device()
        self._rank = _call(xr.global_ordinal)
        self._ordinal = _call(xr.local_ordinal)
        self._memory = True  # until get_memory_info raises once

    def add_step_closure(self, step: int | None = None) -> None:
        """Report from inside the step instead: ``xm.add_step_closure`` runs the closure at
        the next sync. A closure runs once, so call this every step."""
        self._xm.add_step_closure(self.step, args=(step,))

    def framework_version(self) -> str | None:
        import torch_xla

        return getattr(torch_xla, "__version__", None)

    def framework_fields(self) -> dict[str, Any]:
        counter = self._counter
        created = counter("CreateXlaTensor")
        fields: dict[str, Any] = {
            "rank": self._rank, "ordinal": self._ordinal,
            "live": None if created is None else live_tensors(counter),
            "compiles": {"cached": counter("CachedCompile") or 0,
                         "uncached": counter("UncachedCompile") or 0},
        }
        if self._memory:
            fields["devices"] = self._device_memory()
        return fields

    def _device_memory(self) -> dict[str, dict[str, int | None]] | None:
        try:
            info = self._xm.get_memory_info(self._device)
        except Exception:  # noqa: BLE001 - CPU and SPMD raise; HBM then comes from libtpu
            self._memory = False
            return None
        return {str(self._ordinal or 0): {"used": info.get("bytes_used"),
                                          "limit": info.get("bytes_limit"),
                                          "peak": info.get("peak_bytes_used")}}


def live_tensors(counter: Callable[[str], int | None]) -> int:
    """Live XLA tensors from torch_xla's counters, less SPMD's re-registrations of tensors
    marked while their data was on the host (see the module's docstring)."""
    created = counter("CreateXlaTensor") or 0
    return created - (counter("DestroyXlaTensor") or 0) - (counter("VirtualDeviceUsage") or 0)


def _call(fn: Any) -> int | None:
    try:
        return int(fn())
    except Exception:  # noqa: BLE001 - not initialised, or another version's API
        return None
