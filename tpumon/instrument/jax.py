"""Reporter for JAX: live arrays, backend compiles and, on TPU, each device's memory.

``jax.live_arrays()`` lists every live array (on CPU too): flat in a healthy loop, +1 per
step for a loss kept in a list. Backend compiles are counted through ``jax.monitoring``
(each one is an event); a count that keeps growing after warm-up is recompilation.
``Device.memory_stats()`` gives bytes in use, peak and limit on TPU and None on CPU.

Usage, once per step::

    reporter = JaxReporter()
    ...
    reporter.step(step)

``jax.live_arrays()`` builds a list of every live array: ~2 ms at 10k arrays, ~20 ms at
100k. Counted every report, that would slow a small loop several times over just as a
leak makes the list long. So the count is timed, and the next one waits as many steps as
keep its cost at ``count_budget`` seconds per step, amortised (10 us by default): at a
few thousand arrays every report has a count, at 150k about one report in a thousand
steps does; the others carry none (``live`` null), and the agent fits the trend on the
steps that were counted.

Live-array snapshots (``take_snapshot``) are in ``live_jax``. They carry creation sites
whenever jaxlib records tracebacks on arrays (its default, at no cost to the loop);
``track_sites`` (or ``TPUMON_TRACK_SITES=1``) lets ``start_tracking`` switch that
recording on if it was switched off.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tpumon.instrument.reporter import Reporter

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class JaxReporter(Reporter):
    framework = "jax"
    live_module = "tpumon.instrument.live_jax"

    def __init__(self, every: int = 1, socket: str | None = None, min_interval: float = 0.05,
                 track_sites: bool | None = None, count_budget: float = 10e-6,
                 last_words: bool = True) -> None:
        import jax
        import jax.monitoring

        super().__init__(every, socket, min_interval, track_sites, last_words)
        self._jax = jax
        self._compiles = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        self._devices = jax.local_devices()
        self._rank = jax.process_index()
        self._memory = True
        self.count_budget = count_budget
        self._next_count = 0  # the step call (``_calls``) at which to count again

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            self._compiles += 1

    def _snapshot_tracker(self) -> Any:
        """jaxlib records every array's traceback by default: sites come with every
        snapshot, tracking or not."""
        if self._tracker is None:
            self._tracker = self._live().SiteTracker()
        return self._tracker

    def framework_version(self) -> str | None:
        import jax

        return getattr(jax, "__version__", None)

    def framework_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "rank": self._rank, "ordinal": self._devices[0].id if self._devices else None,
            "live": self._live_count(),
            "compiles": {"cached": None, "uncached": self._compiles},
        }
        if self._memory:
            fields["devices"] = self._device_memory()
        return fields

    def _live_count(self) -> int | None:
        """``len(jax.live_arrays())`` when due, else None: see the module's docstring."""
        if self._calls < self._next_count:
            return None
        started = time.perf_counter()
        count = len(self._jax.live_arrays())
        cost = time.perf_counter() - started
        self._next_count = self._calls + math.ceil(cost / self.count_budget)
        return count

    def _device_memory(self) -> dict[str, dict[str, int | None]] | None:
        stats = {}
        for device in self._devices:
            try:
                s = device.memory_stats()
            except Exception:  # noqa: BLE001 - a backend without allocator stats
                s = None
            if s:
                stats[str(device.id)] = {"used": s.get("bytes_in_use"),
                                         "limit": s.get("bytes_limit"),
                                         "peak": s.get("peak_bytes_in_use")}
        if not stats:
            self._memory = False  # CPU: None every time, so stop asking
            return None
        return stats
