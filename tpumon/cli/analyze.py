"""``tpumon analyze``: replay the agent's leak detector over a recorded trace."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from tpumon.cli.prometheus_source import (check_prometheus_options, prometheus_options,
                                          prometheus_rows)
from tpumon.detect import describe_growth
from tpumon.detect.replay import SeriesResult, analyze_file, replay_series
from tpumon.trace import TraceFormatError


def _when(unix: float | None) -> str:
    return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(unix))


def _with_step(point: dict | None) -> str:
    if point is None:
        return "-"
    step = f" (step {point['step']:,})" if point.get("step") is not None else ""
    return _when(point["time"]) + step


def render_table(results: list[SeriesResult], console: Console) -> None:
    table = Table(title="tpumon analyze (times UTC)", title_justify="left")
    for column in ("Host", "Chip", "Verdict", "Growth", "Leak alert", "OOM forecast"):
        table.add_column(column)
    for r in results:
        style = {"leak": "bold red", "step_change": "yellow"}.get(r.verdict, "")
        table.add_row(r.host, r.chip, f"[{style}]{r.verdict}[/]" if style else r.verdict,
                      describe_growth(r.slope_bytes_per_step, r.slope_bytes_per_hour),
                      _with_step(r.alert), _with_step(r.predicted_oom))
    console.print(table)
    for r in results:
        console.print(f"{r.host} chip {r.chip}: {r.assessment.reason}", highlight=False)


@click.command("analyze")
@click.argument("trace", required=False, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format; json is the contract's shape.")
@prometheus_options
@click.option("--since", default=None, metavar="WHEN",
              help="With --prometheus: from then on [default: 24h ago].")
@click.option("--until", default=None, metavar="WHEN",
              help="With --prometheus: up to then [default: now].")
def command(trace: str | None, fmt: str, prometheus: str | None, slice_name: str | None,
            resolution: float, since: str | None, until: str | None) -> None:
    """Replay the agent's streaming leak detector over a trace file (CSV, or JSON Lines
    for .jsonl; '-' reads stdin) and report, per (host, chip): the verdict at the end,
    the growth rate, the OOM forecast, and the first moment the leak alert would have
    fired. Same code and defaults as the agent.

    A malformed file stops with one line naming the line number and the problem, and
    prints nothing on stdout. With --prometheus URL --slice NAME, replays every chip of
    the slice from what Prometheus scraped instead of a trace.
    """
    if check_prometheus_options(prometheus, slice_name, trace is not None):
        assert prometheus is not None and slice_name is not None
        from tpumon.report.data import series_from_rows

        columns = series_from_rows(prometheus_rows(prometheus, slice_name, since, until,
                                                   resolution))
        _print([replay_series(host, chip, c.times, c.steps, c.used, c.total)
                for (host, chip), c in columns.items()], fmt)
        return
    if trace is None:
        raise click.UsageError("give a TRACE file, or --prometheus URL --slice NAME")
    try:
        results = analyze_file(trace)
    except TraceFormatError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{trace}: {exc.strerror or exc}") from None
    _print(results, fmt)


def _print(results: list[SeriesResult], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps({"series": [r.to_json() for r in results]}, indent=2))
    else:
        render_table(results, Console())
