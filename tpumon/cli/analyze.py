"""``tpumon analyze``: replay the agent's leak detector over a recorded trace."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from tpumon.detect import describe_growth
from tpumon.detect.replay import SeriesResult, analyze_file
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
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format; json is the contract's shape.")
def command(trace: str, fmt: str) -> None:
    """Replay the agent's streaming leak detector over a trace file (CSV, or JSON Lines
    for .jsonl; '-' reads stdin) and report, per (host, chip): the verdict at the end,
    the growth rate, the OOM forecast, and the first moment the leak alert would have
    fired. Same code and defaults as the agent.

    A malformed file stops with one line naming the line number and the problem, and
    prints nothing on stdout.
    """
    try:
        results = analyze_file(trace)
    except TraceFormatError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{trace}: {exc.strerror or exc}") from None
    if not results:  # like `report` and `export`: nothing selected is an error
        raise click.ClickException(f"{trace}: no samples to analyze (only a header?)")
    if fmt == "json":
        click.echo(json.dumps({"series": [r.to_json() for r in results]}, indent=2))
    else:
        render_table(results, Console())
