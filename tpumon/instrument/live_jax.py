"""Live JAX arrays of a process, grouped, with the Python line that created each.

``snapshot(step)`` groups ``jax.live_arrays()`` by (shape, dtype, sharding). Bytes are
those the array takes on this process's devices (a shard per addressable device; a
replicated array counts once per device it is on), which is what the chips' HBM sees.

Creation sites come free: jaxlib records a Python traceback (code objects and
instruction offsets, no strings) on every array it creates, in C++, including the
outputs of a jitted call's fast path (the recording that
``jax.profiler.device_memory_profile()`` attributes memory with), and it is on by
default (``jaxlib._jax.tracebacks_enabled()``). A snapshot reads ``array.traceback`` and
names the innermost frame outside jax, jaxlib, tpumon and the standard library, once
per distinct traceback. So JAX needs no hook in the training
loop; ``SiteTracker.start()`` only switches the recording on if someone switched it off.
A jitted call's outputs are attributed to the line that called the jitted function (the
computation inside is compiled; it has no Python lines).
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
from jax.sharding import NamedSharding, SingleDeviceSharding

try:  # where jaxlib keeps its traceback switch (a private module: moved between versions)
    import jaxlib._jax as _jaxlib
except ImportError:  # pragma: no cover - older jaxlib
    import jaxlib.xla_extension as _jaxlib

from tpumon.instrument.snapshot import (MAX_DEVICE_CHARS, Counts, SiteNamer, Snapshot,
                                        clean_text, make_snapshot)

FRAMEWORK = "jax"
#: A sharding's description is cut to this many characters.
SHARDING_CHARS = 64


class SiteTracker:
    """The tracker interface over jaxlib's own traceback recording (on by default)."""

    def __init__(self) -> None:
        self._namer = SiteNamer(("jax", "jaxlib"))
        self._was_enabled: bool | None = None

    @property
    def active(self) -> bool:
        enabled = getattr(_jaxlib, "tracebacks_enabled", None)
        return bool(enabled()) if enabled is not None else False

    def start(self) -> bool:
        """Make sure arrays record where they are created; True when they do."""
        if self._was_enabled is None and hasattr(_jaxlib, "set_tracebacks_enabled"):
            self._was_enabled = self.active
            _jaxlib.set_tracebacks_enabled(True)
        return self.active

    def stop(self) -> None:
        """Back to how it was before ``start()`` (on, unless it had been switched off)."""
        if self._was_enabled is not None:
            _jaxlib.set_tracebacks_enabled(self._was_enabled)
            self._was_enabled = None

    def site_of(self, array: Any) -> str | None:
        return self.site_of_traceback(getattr(array, "traceback", None))

    def site_of_traceback(self, traceback: Any) -> str | None:
        """The innermost user frame of a jaxlib Traceback (innermost frame first)."""
        if traceback is None:
            return None
        codes, offsets = traceback.raw_frames()
        internal = self._namer.internal
        for code, lasti in zip(codes, offsets, strict=True):
            if not internal(code.co_filename):
                return self._namer.name(code.co_filename,
                                        _jaxlib.Traceback.code_addr2line(code, lasti))
        return None


def snapshot(step: int, tracker: SiteTracker | None = None) -> Snapshot:
    """This process's live arrays now, with creation sites when ``tracker`` is given and
    jaxlib records tracebacks. Metadata only: nothing waits for a computation and nothing
    is copied; no reference to an array is kept."""
    started = time.perf_counter()
    sites = tracker is not None and tracker.active
    raw: dict[tuple[Any, ...], int] = {}
    arrays = jax.live_arrays()
    a = None
    try:
        for a in arrays:
            key = (a.shape, a.dtype, a.sharding, getattr(a, "traceback", None) if sites else None)
            raw[key] = raw.get(key, 0) + 1
    finally:
        arrays.clear()
        del a
    return make_snapshot(FRAMEWORK, step, started, sites,
                         _to_groups(raw, tracker if sites else None))


def _to_groups(raw: dict[tuple[Any, ...], int], tracker: SiteTracker | None) -> Counts:
    """Raw keys (JAX objects) to the snapshot's plain ones, with bytes; each sharding
    described and each traceback resolved once."""
    default = _default_device()
    shardings: dict[Any, str] = {}
    counts: Counts = {}
    for (shape, dtype, sharding, traceback), n in raw.items():
        where = shardings.get(sharding)
        if where is None:
            where = shardings[sharding] = describe_sharding(sharding, default)
        site = tracker.site_of_traceback(traceback) if tracker is not None else None
        entry = counts.setdefault((tuple(shape), dtype.name, where, site), [0, 0])
        entry[0] += n
        entry[1] += n * addressable_bytes(shape, dtype.itemsize, sharding)
    return counts


def _default_device() -> Any:
    try:
        return jax.local_devices()[0]
    except Exception:  # noqa: BLE001 - no backend: nothing is on a default device
        return None


def describe_sharding(sharding: Any, default_device: Any = None) -> str:
    """"" on the default device; "tpu:3" on another single device; for a sharded array
    its partition spec and mesh ("P('data',None) data=4,model=2"), or XLA's own notation;
    cut to SHARDING_CHARS. A memory kind other than device memory is appended."""
    try:
        if isinstance(sharding, SingleDeviceSharding):
            (device,) = sharding.device_set
            text = "" if device == default_device else f"{device.platform}:{device.id}"
        elif isinstance(sharding, NamedSharding):
            axes = ",".join(f"{k}={v}" for k, v in sharding.mesh.shape.items())
            text = f"{str(sharding.spec).replace(' ', '')} {axes}"
        else:
            text = str(sharding).replace(" ", "")
        kind = getattr(sharding, "memory_kind", None)
        if kind not in (None, "device"):
            text = f"{text} {kind}".strip()
    except Exception:  # noqa: BLE001 - a sharding type from another JAX version
        text = type(sharding).__name__
    return clean_text(text, min(SHARDING_CHARS, MAX_DEVICE_CHARS))


def addressable_bytes(shape: tuple[int, ...], itemsize: int, sharding: Any) -> int:
    """Bytes of the array's shards on this process's devices."""
    full = math.prod(shape) * itemsize
    if isinstance(sharding, SingleDeviceSharding):
        return full
    try:
        shard = math.prod(sharding.shard_shape(tuple(shape))) * itemsize
        return shard * len(sharding.addressable_devices)
    except Exception:  # noqa: BLE001 - a sharding that cannot say: the logical size
        return full
