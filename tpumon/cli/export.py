"""``tpumon export``: the agent's stored history as a trace file (contracts.md section 1)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Iterator

import click

from tpumon.cli.history_store import history_path, reading_history
from tpumon.cli.options import config_option, history_selection, state_dir_option
from tpumon.cli.progress import bars, counted
from tpumon.cli.timespec import parse_when
from tpumon.cli.trace_output import output_format, write_whole
from tpumon.cli.prometheus_source import (check_prometheus_options, prometheus_options,
                                          prometheus_rows)
from tpumon.store.database import HistoryDB
from tpumon.store.trace_rows import end_rows, export_rows
from tpumon.trace.schema import TraceRow

def describe_selection(db: HistoryDB, since: str | None, until: str | None) -> str:
    """What there is to select from, so the next try can be right."""
    series = db.series()
    hosts = sorted({h for _, h, _ in series})
    chips = sorted({c for _, _, c in series}, key=lambda c: (len(c), c))
    window = f"; --since {since}" if since else ""
    window += f"; --until {until}" if until else ""
    return (f"stored: host(s) {', '.join(hosts) or 'none'}, chip(s) {', '.join(chips) or 'none'}"
            f"{window}")


def _around_end(db: HistoryDB, path: Path, hosts: set[str],
                chips: set[str]) -> Iterator[TraceRow]:
    """The last end's evidence, said on stderr; one error line when none was kept."""
    kept, rows = end_rows(db, hosts, chips)
    if kept is None:
        raise click.ClickException(f"{path}: no job end kept here (the agent keeps the "
                                   "hour before each end it sees; docs/job-ends.md)")
    click.echo(f"the hour before: {kept.summary}", err=True)
    return rows


@click.command("export")
@config_option
@state_dir_option
@history_selection
@click.option("-o", "--output", default="-", show_default=True, type=click.Path(dir_okay=False,
              allow_dash=True), help="Output file; '-' is stdout.")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), default=None,
              help="Trace format [default: from the output's suffix, .csv, .jsonl or "
              ".parquet; csv on stdout]. A name of another suffix needs --format csv (as "
              "analyze reads it); one of those three must agree with --format; parquet "
              "needs a file of its own.")
@click.option("--around-end", is_flag=True,
              help="The hour of raw samples before the last job end the agent saw (kept at "
                   "full resolution whatever the retention; docs/job-ends.md) instead of the "
                   "history; --host and --chip still select.")
@prometheus_options
def command(config_path: str | None, state_dir: str | None, since: str | None,
            until: str | None, hosts: tuple[str, ...], chips: tuple[str, ...], output: str,
            fmt: str | None, around_end: bool, prometheus: str | None,
            slice_name: str | None, resolution: float | None) -> None:
    """Write the agent's stored HBM history as a trace (the format 'tpumon analyze' reads),
    for a post-mortem after the job died. Raw polls where they are still kept; older
    history as each minute's floor and peak. Safe to run while the agent writes. With
    --prometheus URL --slice NAME, the whole slice's history as Prometheus scraped it.
    """
    fmt = output_format(output, fmt)
    if fmt == "parquet" and output == "-":
        raise click.UsageError("parquet is written to a file: give -o FILE.parquet")
    if check_prometheus_options(prometheus, slice_name, state_dir is not None or around_end,
                                resolution=resolution):
        assert prometheus is not None and slice_name is not None
        _write([r for r in prometheus_rows(prometheus, slice_name, since, until, resolution)
                if (not hosts or r.host in hosts) and (not chips or r.chip in chips)],
               output, fmt)
        return
    start = parse_when(since, "--since") if since else -math.inf
    end = parse_when(until, "--until") if until else math.inf
    path = history_path(config_path, state_dir, "to export")
    try:
        with reading_history(path) as db:
            if around_end:
                selected = _around_end(db, path, set(hosts), set(chips))
            else:
                selected = export_rows(db, start, end, set(hosts), set(chips))
            first = next(selected, None)
            if first is None:
                raise click.ClickException(f"{path}: no samples match the selection "
                                           f"({describe_selection(db, since, until)})")
            with bars() as progress:
                rows = write_whole(counted(itertools.chain([first], selected), progress,
                                           "exporting rows"), output, fmt)
    except OSError as exc:
        raise click.ClickException(f"{output}: {exc.strerror or exc}") from None
    # on stderr, so stdout stays the trace (the README promises the line whatever -o says)
    click.echo(f"{rows} rows written to {'stdout' if output == '-' else output}", err=True)


def _write(rows: list[TraceRow], output: str, fmt: str) -> None:
    try:  # never a truncated file over an older one
        with bars() as progress:
            count = write_whole(counted(rows, progress, "writing rows"), output, fmt)
    except OSError as exc:
        raise click.ClickException(f"{output}: {exc.strerror or exc}") from None
    if output != "-":
        click.echo(f"{count} rows written to {output}", err=True)
