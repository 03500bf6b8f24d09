"""A trace as the client commands read it (``analyze``, ``report``): spilled to a
temporary file, in bounded memory, with a progress bar while it is read. A leaf module: no
command module imports another."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.progress import Progress

from tpumon.detect.early_replay import EarlyReplay
from tpumon.detect.replay import TRACE_SUFFIXES, spilled_path, trace_files
from tpumon.trace.schema import SeriesSource
from tpumon.trace.spill import Keep


@contextmanager
def spilled(trace: str, progress: Progress, keep: Keep | None = None,
            early: EarlyReplay | None = None
            ) -> Iterator[dict[tuple[str, str], SeriesSource]]:
    """The trace's series (a file's, or a directory's files'), spilled to a temporary file
    while the context lasts (bounded memory; ``keep``: the rows kept, as
    :func:`~tpumon.detect.replay.spilled_path` takes it); a bar that pulses (the rows to
    come are not known) and counts the rows. ``analyze`` and ``report`` read traces so;
    ``early``: ``analyze`` replays some jobs while the rest is read."""
    files = len(trace_files(trace))
    if not files:
        raise click.ClickException(f"{trace}: a directory without trace files (names ending "
                                   f"{', '.join(TRACE_SUFFIXES)})")
    what = f"reading {files:,} trace file{'s' * (files != 1)}"
    task = progress.add_task(what, total=None)
    rows = 0

    def read(n: int) -> None:
        nonlocal rows
        rows += n
        progress.update(task, description=f"{what}: {rows:,} samples")

    with spilled_path(trace, read=read, keep=keep, early=early) as series:
        progress.update(task, total=1, completed=1)
        yield dict(series)
