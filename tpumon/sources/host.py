"""Host memory and the RSS of the processes that own TPU chips (psutil).

Host-side growth (a dataloader, a Python list of metrics, pinned buffers) ends in the
kernel's OOM killer rather than a TPU "Resource Exhausted", and looks the same from outside:
the job dies. So the owners' RSS is watched beside HBM.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

import psutil

from tpumon.common.samples import HostSample, ProcessSample, chip_sort_key


class HostSource:
    """Polls host memory and, for each chip-owning PID, that process's RSS.

    At most every ``min_interval`` seconds (the last sample stands in between) unless the
    chips' owners changed: host memory is read at scrape resolution, and reading it costs
    ~0.4 ms of CPU, more than the rest of a poll but the runtime's call."""

    def __init__(self, owners: Callable[[], Mapping[str, int]],
                 clock: Callable[[], float] = time.time, min_interval: float = 0.0) -> None:
        self._owners = owners
        self._clock = clock
        self._min_interval = min_interval
        self._processes: dict[int, psutil.Process] = {}
        self._last: tuple[float, Mapping[str, int], HostSample] | None = None

    def poll(self) -> HostSample:
        owners = self._owners()
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self._min_interval \
                and self._last[1] == owners:
            return self._last[2]
        vm = psutil.virtual_memory()
        sample = HostSample(self._clock(), vm.total, vm.available, vm.total - vm.available,
                            self._owner_processes(owners))
        self._last = (now, dict(owners), sample)
        return sample

    def _owner_processes(self, owners: Mapping[str, int]) -> tuple[ProcessSample, ...]:
        chips_by_pid: dict[int, list[str]] = {}
        for chip, pid in owners.items():
            chips_by_pid.setdefault(pid, []).append(chip)
        samples = []
        for pid, chips in sorted(chips_by_pid.items()):
            sample = self._process_sample(pid, tuple(sorted(chips, key=chip_sort_key)))
            if sample is not None:
                samples.append(sample)
        # Forget processes that no longer own chips, so PIDs do not pile up across jobs.
        self._processes = {pid: p for pid, p in self._processes.items() if pid in chips_by_pid}
        return tuple(samples)

    def _process_sample(self, pid: int, chips: tuple[str, ...]) -> ProcessSample | None:
        """The process's RSS, or None if it exited or may not be read (a normal race)."""
        try:
            proc = self._processes.get(pid)
            if proc is None or not proc.is_running():
                proc = self._processes[pid] = psutil.Process(pid)
            with proc.oneshot():
                return ProcessSample(pid, proc.name(), proc.memory_info().rss, chips)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._processes.pop(pid, None)
            return None

