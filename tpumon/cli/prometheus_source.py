"""--prometheus URL --slice NAME [--since --until --resolution]: a slice's history from
Prometheus for `tpumon analyze`, `export` and `report` (tpumon/trace/prometheus.py)."""

from __future__ import annotations

import time
from typing import Callable

import click

from tpumon.cli.progress import bars
from tpumon.cli.timespec import parse_when
from tpumon.trace.schema import TraceRow

DEFAULT_SINCE = "24h"


def prometheus_options(command: Callable) -> Callable:
    """The options that name a slice's history in Prometheus."""
    for option in reversed((
            click.option("--prometheus", default=None, metavar="URL",
                         help="Read the slice's history from this Prometheus (e.g. "
                              "http://prometheus:9090) instead of a trace file or the "
                              "agent's history store (whichever this command reads)."),
            click.option("--slice", "slice_name", default=None, metavar="NAME",
                         help="With --prometheus: the slice (its `slice` label)."),
            click.option("--resolution", type=click.FloatRange(min=0.001), default=None,
                         metavar="SECONDS",
                         help="With --prometheus: ask for points this many seconds apart "
                              "(fewer for a long range) [default: every sample Prometheus "
                              "holds, whatever its scrape interval]."))):
        command = option(command)
    return command


def check_prometheus_options(prometheus: str | None, slice_name: str | None,
                             other_source: bool, **only_with: object) -> bool:
    """Whether --prometheus is in use; a usage error when half given or mixed, or when an
    option that only --prometheus reads (``only_with``: option name less its dashes, its
    value) is given without it: ignored, it would look obeyed."""
    if prometheus is None:
        given = ["--slice"] if slice_name is not None else []
        given += [f"--{name}" for name, value in only_with.items() if value is not None]
        if given:
            raise click.UsageError(f"{given[0]} needs --prometheus URL")
        return False
    if not slice_name:
        raise click.UsageError("--prometheus needs --slice NAME")
    if other_source:
        raise click.UsageError("give --prometheus or a trace / --state-dir, not both")
    return True


def prometheus_rows(url: str, slice_name: str, since: str | None, until: str | None,
                    resolution: float | None) -> list[TraceRow]:
    """The slice's rows; one clear error (click) for any failure; a progress bar on a
    terminal while the chunks come in."""
    from tpumon.trace.prometheus import PrometheusError, queries, slice_rows

    now = time.time()
    start = parse_when(since or DEFAULT_SINCE, "--since", now)
    end = parse_when(until, "--until", now) if until else now
    asked = 4 * queries(start, end, resolution)
    with bars() as progress:
        task = progress.add_task(f"asking Prometheus ({asked:,} queries)", total=asked)
        try:
            return slice_rows(url, slice_name, start, end, resolution,
                              progress=lambda: progress.advance(task))
        except PrometheusError as exc:
            raise click.ClickException(str(exc)) from None
