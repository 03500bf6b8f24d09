"""``tpumon report``: a picture and a self-contained HTML page per host, from a trace or
from the agent's history store, of what the leak detector saw."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import click
from rich.progress import Progress

from tpumon import __version__
from tpumon.cli.timespec import parse_when
from tpumon.cli.history_store import history_path, reading_history
from tpumon.cli.options import config_option, history_selection, state_dir_option
from tpumon.cli.progress import bars
from tpumon.cli.trace_input import spilled
from tpumon.cli.prometheus_source import (check_prometheus_options, prometheus_options,
                                          prometheus_rows)
from tpumon.trace.schema import SeriesColumns, SeriesSource, TraceFormatError
from tpumon.trace.spill import Keep


@click.command("report")
@click.argument("trace", required=False, type=click.Path(allow_dash=True))
@config_option
@state_dir_option
@history_selection
@click.option("-o", "--outdir", default=".", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the PNG and HTML files.")
@prometheus_options
@click.option("--worker", default=None, metavar="N",
              help="The host's worker id in its slice (one host drawn) [default: as its "
                   "agent noted it in the history store, else the host name's -w-N].")
def command(trace: str | None, config_path: str | None, state_dir: str | None,
            since: str | None, until: str | None, hosts: tuple[str, ...],
            chips: tuple[str, ...], outdir: str, prometheus: str | None,
            slice_name: str | None, resolution: float | None, worker: str | None) -> None:
    """Draw what the leak detector saw, per host: tpumon-report-HOST.png (one panel per
    chip: raw samples, the floor, the fitted trend and its 95% band, the OOM forecast,
    restarts, level jumps, the leak alert) and tpumon-report-HOST.html (the picture and a
    summary table per chip, in one self-contained file). Reads TRACE (CSV, JSON Lines for
    .jsonl, Parquet for .parquet; '-' is stdin; a directory: every trace file in it, one
    per host of a slice, say) or, without TRACE, the agent's history store. Prints the
    paths written. With --prometheus URL --slice NAME, one report per host of the slice
    from what Prometheus scraped.

    A trace of any length is read in bounded memory, as `tpumon analyze` reads it: its
    series are kept in a temporary file (32 bytes a sample, under $TMPDIR) and replayed one
    at a time, and a report keeps of each chip only what its picture and table show.
    """
    start = parse_when(since, "--since") if since else -math.inf
    end = parse_when(until, "--until") if until else math.inf
    from tpumon.report import write_report
    from tpumon.report.data import host_reports
    from tpumon.report.data import select, selection, series_from_rows

    ends: list = []  # job ends: kept in the history store only
    workers: dict[str, str] = {}  # host -> worker id, as the agent noted it in its store
    series: Mapping[tuple[str, str], SeriesSource]
    scraped: dict[tuple[str, str], SeriesColumns] = {}  # --prometheus: for the heatmap
    written: list[Path] = []
    with ExitStack() as stack:
        progress: Progress | None = None
        if check_prometheus_options(prometheus, slice_name,
                                    trace is not None or state_dir is not None,
                                    resolution=resolution):
            assert prometheus is not None and slice_name is not None
            source = f"{prometheus} slice {slice_name}"
            # the range was Prometheus' question; the samples carry the agents' clocks
            series = scraped = select(series_from_rows(prometheus_rows(
                prometheus, slice_name, since, until, resolution)), hosts, chips)
        elif trace is not None:
            if state_dir is not None:
                raise click.UsageError("give a TRACE or --state-dir, not both")
            source = "standard input" if trace == "-" else str(Path(trace).resolve())
            progress = stack.enter_context(bars())  # reading has a bar too
            series = stack.enter_context(
                _read_trace(trace, progress, selection(hosts, chips, start, end)))
        else:
            state, source = _store(config_path, state_dir)
            series = series_from_rows(_store_rows(state, start, end, hosts, chips))
            ends, workers = _store_ends(state), _store_workers(state)
        if not series:
            raise click.ClickException(f"{source}: no samples" + (
                " for the given --host/--chip/--since/--until"
                if hosts or chips or since or until else ""))
        bar = progress if progress is not None else stack.enter_context(bars())
        drawn = {host for host, _ in series}
        if worker is not None and len(drawn) != 1:
            raise click.UsageError(f"--worker names one host's worker; the selection "
                                   f"has {len(drawn)} hosts (give --host)")
        samples = sum(c.samples for c in series.values())
        task = bar.add_task(f"replaying {samples:,} samples", total=samples)
        reports = host_reports(series, source, __version__, time.time(), ends=ends,
                               replayed=lambda n: bar.advance(task, n))
        drawing = bar.add_task(f"drawing {len(drawn):,} host report"
                               f"{'s' * (len(drawn) != 1)}", total=len(drawn))
        by_host: dict[str, tuple[Path, Path]] = {}
        try:
            Path(outdir).mkdir(parents=True, exist_ok=True)
            if scraped and slice_name is not None:  # the heatmap needs every host's report
                from tpumon.report.slice_heatmap import write_slice_png

                every = sorted(reports, key=lambda r: r.host)
                written.append(write_slice_png(scraped, every, slice_name, outdir))
                reports = iter(every)
            for report in reports:  # each drawn and let go: one job's reports at a time
                report.worker_id = worker if worker is not None else workers.get(report.host)
                by_host[report.host] = write_report(report, outdir)
                bar.advance(drawing)
        except OSError as exc:
            raise click.ClickException(f"{outdir}: {exc.strerror or exc}") from None
        written += [path for host in sorted(by_host) for path in by_host[host]]
    for path in written:
        click.echo(str(path))


@contextmanager
def _read_trace(trace: str, progress: Progress,
                keep: Keep) -> Iterator[dict[tuple[str, str], SeriesSource]]:
    """The trace's series that ``keep`` selects (those it keeps nothing of left out),
    spilled as ``tpumon analyze`` spills them, while the context lasts; a bad trace, or a
    spill file that cannot be written, is one line."""
    with ExitStack() as stack:
        try:
            series = stack.enter_context(spilled(trace, progress, keep))
        except TraceFormatError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:  # the trace's, or the spill file's (a full disk: names it)
            raise click.ClickException(f"{exc.filename or trace}: {exc.strerror or exc}") \
                from None
        yield {key: c for key, c in series.items() if c.samples}


def _store(config_path: str | None, state_dir: str | None) -> tuple[Path, str]:
    """The history store's database (as ``tpumon export`` finds it) and its name."""
    path = history_path(config_path, state_dir, "to report on")
    return path, str(path)


def _store_ends(path: Path) -> list:
    """The job ends the agent kept in its history store (docs/job-ends.md)."""
    with reading_history(path) as db:
        return db.job_ends()


def _store_workers(path: Path) -> dict[str, str]:
    """Each host's worker id as its agent noted it in the store (meta ``worker HOST``)."""
    with reading_history(path) as db:
        return db.meta_prefixed("worker ")


def _store_rows(path: Path, start: float, end: float, hosts: tuple[str, ...],
                chips: tuple[str, ...]) -> list:
    from tpumon.store.trace_rows import export_rows

    with reading_history(path) as db:
        return list(export_rows(db, start, end, set(hosts), set(chips)))
