"""When the agent asks a training process for live-tensor snapshots by itself.

A chip whose detector says ``leak`` and whose training process reports (and can answer)
gets its process asked once; again only after ``REPEAT_SECONDS``, so a leak that lasts
days is looked at a few times a day, not at every poll. The two snapshots are ``steps``
apart: configured, or about two minutes of the job's steps (at least 100, so a tensor
kept every few dozen steps shows more than once; at most 10,000).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from tpumon.detect import Assessment, Verdict
from tpumon.diagnose.processes import ProcessState
from tpumon.sources.snapshots import SnapshotResult

REPEAT_SECONDS = 6 * 3600.0
AUTO_SECONDS = 120.0
MIN_STEPS, MAX_STEPS, DEFAULT_STEPS = 100, 10_000, 200


def snapshot_steps(configured: int, steps_per_second: float | None) -> int:
    """Steps between the two snapshots: ``configured``, or two minutes of the job's."""
    if configured > 0:
        return configured
    if not steps_per_second or not math.isfinite(steps_per_second):
        return DEFAULT_STEPS
    return int(min(max(steps_per_second * AUTO_SECONDS, MIN_STEPS), MAX_STEPS))


class LeakSnapshots:
    """Asks through ``request(pid, steps, reason)`` for the chips that newly leak."""

    def __init__(self, request: Callable[[int, int, str], SnapshotResult],
                 configured_steps: int = 0) -> None:
        self._request = request
        self.configured_steps = configured_steps
        self._asked: dict[int, float] = {}  # pid -> when we last asked

    def update(self, assessments: Mapping[str, Assessment], attributed: Mapping[str, int],
               processes: Mapping[int, ProcessState], now: float) -> None:
        for gone in [p for p in self._asked if p not in processes]:
            del self._asked[gone]
        for chip, a in sorted(assessments.items()):
            pid = attributed.get(chip)
            state = processes.get(pid) if pid is not None else None
            if a.verdict is not Verdict.LEAK or pid is None or state is None \
                    or not state.report.snapshots:
                continue
            if now - self._asked.get(pid, -math.inf) < REPEAT_SECONDS:
                continue
            self._asked[pid] = now
            steps = snapshot_steps(self.configured_steps, state.report.steps_per_second)
            self._request(pid, steps, f"leak on chip {chip}")
