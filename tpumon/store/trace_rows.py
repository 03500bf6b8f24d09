"""The stored history as trace rows (contracts.md section 1), for ``tpumon export``.

Where raw samples have been rolled up, each minute gives two rows: its floor at the
minute's first poll and its peak at its last. That is what the detector reads of a
minute (buckets are whole minutes), so ``tpumon analyze`` of an export sees the floors
the agent saw; only the in-minute shape is gone.
"""

from __future__ import annotations

import math
from typing import Collection, Iterator

from tpumon.common.samples import StoredEnd
from tpumon.store.database import HistoryDB
from tpumon.trace.schema import TraceRow


def export_rows(db: HistoryDB, since: float = -math.inf, until: float = math.inf,
                hosts: Collection[str] = (), chips: Collection[str] = ()) -> Iterator[TraceRow]:
    """Rows of every selected (host, chip) series, one series after another, in time order."""
    for series, host, chip in db.series():
        if (hosts and host not in hosts) or (chips and chip not in chips):
            continue
        for s in db.read_series(series, since, until):
            yield TraceRow(s.time, host, chip, s.step, s.used, s.total)


def end_rows(db: HistoryDB, hosts: Collection[str] = (),
             chips: Collection[str] = ()) -> tuple[StoredEnd | None, Iterator[TraceRow]]:
    """The latest kept job end (of ``hosts``, when given) and the raw samples of the hour
    before it, kept whatever the retention: the trace of a post-mortem."""
    end = next((e for e in db.job_ends() if not hosts or e.host in hosts), None)
    if end is None:
        return None, iter(())
    rows = (TraceRow(s.time, end.host, chip, s.step, s.used, s.total)
            for chip, s in db.end_samples(end.id) if not chips or chip in chips)
    return end, rows
