"""Progress bars for the commands that take seconds on a large input (``analyze``,
``report``, ``export``, the Prometheus queries behind ``--prometheus``): on stderr, so that
what goes to stdout stays clean; gone once done; and nothing at all when stderr is not a
terminal (a pipe, a log file, CI)."""

from __future__ import annotations

from typing import Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def bars() -> Progress:
    """A progress display to use as a context manager; ``add_task`` per phase."""
    console = Console(stderr=True)
    # stdout is left alone: `export -o -` writes its trace there while the bar is drawn
    return Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                    TimeElapsedColumn(), console=console, transient=True,
                    disable=not console.is_terminal, redirect_stdout=False,
                    redirect_stderr=False)


def counted(items: Iterable[T], progress: Progress, what: str, every: int = 10_000) -> Iterator[T]:
    """``items`` as they come, with a bar (no total: it pulses) that counts them in its
    description ("exporting: 1,230,000 rows"), updated every ``every`` items."""
    task = progress.add_task(f"{what}: 0", total=None)
    n = 0
    for n, item in enumerate(items, 1):
        if n % every == 0:
            progress.update(task, description=f"{what}: {n:,}")
        yield item
    progress.update(task, description=f"{what}: {n:,}")
