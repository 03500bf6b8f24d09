"""``tpumon analyze``: replay the agent's leak detector over a recorded trace."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping

import click
from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tpumon.cli.format import output_console
from tpumon.cli.progress import bars
from tpumon.cli.trace_input import spilled
from tpumon.cli.prometheus_source import (check_prometheus_options, prometheus_options,
                                          prometheus_rows)
from tpumon.common.describe import describe_growth, verdict_label
from tpumon.detect.early_replay import EarlyReplay
from tpumon.detect.job_replay import FULL_FRACTION, SeriesResult, describe_forecast
from tpumon.detect.verdict import Assessment
from tpumon.diagnose.job_ends import TRACE_ENDED_AT_OOM, estimated_peak_ratio, stopped_at_oom
from tpumon.detect.replay import replay_columns, usable_cores
from tpumon.detect.workers import WorkerDied
from tpumon.trace.schema import SeriesSource, TraceFormatError

#: Widest host name shown: the table fits 80 columns with every other column full.
HOST_WIDTH = 18
_WORKER = re.compile(r"-w-\d+$")


def short_host(host: str, width: int = HOST_WIDTH) -> str:
    """A host name cut in the middle to ``width``, keeping its end: the worker suffix
    (``-w-3``) is what tells the hosts of one slice apart (``t1v-n-39f…c0729-w-3``)."""
    if len(host) <= width:
        return host
    worker = _WORKER.search(host)
    tail = max(len(worker.group()) if worker else 0, (width - 1) // 2)
    return host[:width - 1 - tail] + "…" + host[-tail:]


def _when(unix: float | None) -> str:
    return "-" if unix is None else time.strftime("%m-%d %H:%M", time.gmtime(unix))


def _with_step(point: dict | None) -> str:
    """A moment as two short lines: when (UTC), and the step where known."""
    if point is None:
        return "-"
    step = f"\nstep {point['step']:,}" if point.get("step") is not None else ""
    return _when(point["time"]) + step


def post_mortem(r: SeriesResult) -> str | None:
    """The forecast made when the alert fired, against where HBM filled up, if it did:
    "forecast at alert: step 27,500 (26,900-28,200); HBM full at step 27,813"."""
    said = None if r.alert is None else describe_forecast(r.alert)
    if said is None:
        return None
    full, job_end = r.full_after_alert, r.alert_job_end
    if job_end is not None and (full is None or full["time"] >= job_end[1]):
        came = _end_of_job(*job_end)  # the alert's job restarted before any full sample
    elif full is None:
        came = _end_of_trace(r.assessment)
    elif said.startswith("step") and full["step"] is not None:
        came = f"HBM full at step {full['step']:,}"
    else:
        came = f"HBM full at {_when(full['time'])}"
    return f"forecast at alert: {said}; {came}"


def ended_at_oom(r: SeriesResult) -> bool:
    """Whether the trace's last job ended out of HBM, as the agent judges a job's end."""
    full = r.full_after_alert
    return stopped_at_oom(r.assessment, r.alert is not None,
                          None if full is None else full["time"])


def _end_of_trace(a: Assessment) -> str:
    """Where HBM stood at the end of a trace in which no sample was full. The figures are
    the last fit's (fits run every few minutes of samples while a leak grows, so it is
    named: not the trace's last step)."""
    return _judged_end(a, "the detector's last fit", "", "HBM did not fill up in the trace")


def _end_of_job(a: Assessment, restarted: float) -> str:
    """How the alert's job ended where another followed it, on the detector's last fit of
    that job."""
    when = _when(restarted)
    return _judged_end(a, "that job's last fit", f", before it restarted ({when}),",
                       f"HBM did not fill up before the job restarted ({when})")


def _judged_end(a: Assessment, fit: str, after: str, not_full: str) -> str:
    """An alerted job's end judged as the agent judges one (``stopped_at_oom``: the floor
    plus the in-step swing within NEAR_FULL of capacity) at ``fit`` (its step said after
    it, then ``after``), or ``not_full``."""
    if not stopped_at_oom(a, alerted=True):
        return not_full
    swing = estimated_peak_ratio(a.floor_bytes, a.transient_bytes, a.total_bytes)
    at = f" (step {a.step:,.0f})" if a.step is not None and not math.isnan(a.step) else ""
    return (f"no sample {FULL_FRACTION:.0%} full, but at {fit}{at}{after} the floor plus the "
            f"in-step swing came to {swing:.1%} of HBM: an OOM, as the agent judges a job's "
            "end")


def _reason(r: SeriesResult) -> str:
    """The chip's reason at the trace's end; after an OOM, said as the agent says a chip's
    whose job ended ("job ended (...); before it: ..."): "OOM in 22 min" alone read as a
    job still running."""
    if not ended_at_oom(r):
        return r.assessment.reason
    return f"{TRACE_ENDED_AT_OOM}; before it: {r.assessment.reason}"


def render_table(results: list[SeriesResult], console: Console) -> None:
    """One row per series, in 80 columns: host (cut in the middle, so the worker shows),
    chip, verdict, growth, alert and OOM forecast; then each series' reason, its restarts
    (a job restarted in the trace) and the alert's post-mortem."""
    table = Table(title="tpumon analyze (times UTC)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("Host", no_wrap=True, max_width=HOST_WIDTH)
    table.add_column("Chip", no_wrap=True, max_width=6)
    table.add_column("Verdict", max_width=12)
    for column in ("Growth", "Leak alert", "OOM forecast"):
        table.add_column(column)
    for r in results:
        style = {"leak": "bold red", "growing": "yellow", "step_change": "yellow"}.get(
            r.verdict, "")
        verdict = verdict_label(r.verdict)
        table.add_row(short_host(r.host), r.chip, f"[{style}]{verdict}[/]" if style else verdict,
                      describe_growth(r.slope_bytes_per_step, r.slope_bytes_per_hour),
                      _with_step(r.alert), _with_step(r.predicted_oom))
    console.print(table)
    for r in results:
        # one line each, never wrapped mid-sentence (a pipe's console is 80 wide)
        console.print(f"{r.host} chip {r.chip}: {_reason(r)}", highlight=False,
                      soft_wrap=True)
        if r.assessment.restarts:  # what --format json says as "restarts"
            n = r.assessment.restarts
            console.print(f"  {n} restart{'s' if n != 1 else ''} (the trend starts afresh at "
                          "each)", highlight=False, soft_wrap=True)
        said = post_mortem(r)
        if said:
            console.print(f"  {said}", highlight=False, soft_wrap=True)


@click.command("analyze")
@click.argument("trace", required=False, type=click.Path(allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format; json is the contract's shape.")
@prometheus_options
@click.option("--since", default=None, metavar="WHEN",
              help="With --prometheus: from then on [default: 24h ago].")
@click.option("--until", default=None, metavar="WHEN",
              help="With --prometheus: up to then [default: now].")
def command(trace: str | None, fmt: str, prometheus: str | None, slice_name: str | None,
            resolution: float | None, since: str | None, until: str | None) -> None:
    """Replay the agent's streaming leak detector over a trace file (CSV, JSON Lines for
    .jsonl, Parquet for .parquet; '-' reads CSV or JSON Lines from stdin), or over every
    trace file in a directory (one per host of a slice, say), and report, per (host, chip):
    the verdict at the end, the growth rate, the OOM forecast with its interval, and the
    first moment the leak alert would have fired, with the forecast made then. Same code
    and defaults as the agent.

    A trace of any length is read in bounded memory: its series are kept in a temporary
    file (32 bytes a sample, under $TMPDIR) and replayed one at a time. A CSV or JSON Lines
    file that needs the validating parser (names with spaces around them, say), or stdin, is
    read whole in memory.

    A malformed file stops with one line naming the line number and the problem, and
    prints nothing on stdout; samples that use more HBM than their chip has are read, and
    counted in a line on stderr. With --prometheus URL --slice NAME, replays every chip of
    the slice from what Prometheus scraped instead of a trace.
    """
    if check_prometheus_options(prometheus, slice_name, trace is not None,
                                resolution=resolution, since=since, until=until):
        assert prometheus is not None and slice_name is not None
        from tpumon.report.data import series_from_rows

        columns = series_from_rows(prometheus_rows(prometheus, slice_name, since, until,
                                                   resolution))
        with bars() as progress:  # as a directory of the slice's traces
            results = _replay(columns, progress)
        _print(results, fmt)
        return
    if trace is None:
        raise click.UsageError("give a TRACE file, or --prometheus URL --slice NAME")
    try:
        with bars() as progress, EarlyReplay(workers=usable_cores()) as early, \
                spilled(trace, progress, early=early) as series:
            results = _replay(series, progress, early)
    except TraceFormatError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # the trace's, or the spill file's (a full disk: names it)
        raise click.ClickException(f"{exc.filename or trace}: {exc.strerror or exc}") \
            from None
    if not results:  # like `report` and `export`: nothing selected is an error
        raise click.ClickException(f"{trace}: no samples to analyze (only a header?)")
    _print(results, fmt)


def _replay(columns: Mapping[tuple[str, str], SeriesSource], progress: Progress,
            early: EarlyReplay | None = None) -> list[SeriesResult]:
    samples = sum(c.samples for c in columns.values())
    task = progress.add_task(f"replaying {samples:,} samples", total=samples)
    try:
        return replay_columns(columns, workers=usable_cores(),
                              replayed=lambda n: progress.advance(task, n), early=early)
    except WorkerDied as exc:  # the kernel's OOM killer, most likely: one line, no wait
        raise click.ClickException(str(exc)) from None


def _print(results: list[SeriesResult], fmt: str) -> None:
    for r in results:  # taken as they are, but said: on stderr, so json stays json
        if r.over_capacity:
            click.echo(f"tpumon analyze: host {r.host} chip {r.chip}: {r.over_capacity} of "
                       f"{r.samples} samples use more HBM than the chip has", err=True)
    if fmt == "json":
        click.echo(json.dumps({"series": [r.to_json() for r in results]}, indent=2))
    else:
        render_table(results, output_console())
