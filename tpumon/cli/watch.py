"""``tpumon watch``: what people ran `watch -n0 tpu-info` for, with the trend beside it.

A full-screen view redrawn in place (rich's Live on the alternate screen: the cursor goes
home and lines are overwritten, never a clear-and-repaint, so nothing flickers), sized for
an 80-column terminal. It reads the local agent's status document, which carries the
verdicts; with no agent it polls the runtime itself (verdicts then build up from the
samples of this session). Ctrl-C leaves the screen as it was and exits with status 0.

Every field of the status document is shown through
:func:`~tpumon.common.untrusted_text.for_terminal` (a process's framework, a summary quoting it,
an error a peer wrote): no escape sequence reaches the terminal and no markup in them is
obeyed (``_line`` for whole lines, the table cells one by one).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import click
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tpumon.agent.bootstrap import Assembly, build
from tpumon.cli.options import (agent_client_options, agent_option, config_option,
                                direct_option, ports_value, runtime_ports_option)
from tpumon.cli.slice_view import slice_options, watch_slice
from tpumon.cli.agent_choice import agent_to_ask, ask_agent
from tpumon.cli.format import format_eta, format_pct
from tpumon.client.http import AgentClient, AgentError, ClientAuth
from tpumon.common.config import load_config
from tpumon.agent.logs import setup_logging
from tpumon.web.status import status_document
from tpumon.common.describe import describe_growth, verdict_label
from tpumon.common.units import format_bytes
from tpumon.common.untrusted_text import for_terminal as shown

VERDICT_STYLE = {"leak": "bold red", "growing": "yellow", "step_change": "yellow",
                 "warming_up": "dim",
                 "insufficient_data": "dim", "ok": "green"}
# Chip-table columns, most important first: dropped from the end until the table fits.
COLUMNS = ("Chip", "HBM used", "OOM in", "Verdict", "Growth", "Floor", "Duty")
RIGHT = {"Chip", "Floor", "Growth", "OOM in", "Duty"}


def _hbm(chip: dict[str, Any]) -> RenderableType:
    if not chip["up"]:
        return Text("no data", style="yellow")
    used, total = chip["hbm_used_bytes"], chip["hbm_total_bytes"] or 0
    bar = ProgressBar(total=total or 1, completed=used, width=6,
                      complete_style="red" if total and used / total > 0.9 else "cyan")
    table = Table.grid(padding=(0, 1))
    table.add_row(bar, f"{format_bytes(used)}/{format_bytes(total)}")
    return table


def _cells(chip: dict[str, Any], now: float) -> dict[str, RenderableType]:
    verdict = chip.get("verdict")
    return {"Chip": shown(chip["chip"]), "HBM used": _hbm(chip),
            "Floor": format_bytes(chip.get("floor_bytes")),
            # the figures `status`, the index page and /report show, written alike
            "Growth": describe_growth(chip.get("growth_bytes_per_step"),
                                      chip.get("growth_bytes_per_hour")),
            "OOM in": format_eta(chip, now),
            "Verdict": _line(verdict_label(verdict), VERDICT_STYLE.get(verdict or "", "")),
            "Duty": format_pct(chip["duty_cycle"]).replace(" ", "")}


def chip_table(doc: dict[str, Any], width: int = 80) -> Table:
    """One row per chip: HBM bar, OOM in, verdict, growth, floor, duty cycle (sizes and
    growth as every view writes them); the last columns are left out, in that order, until
    the table fits ``width`` without cutting a cell short."""
    rows = [_cells(chip, doc["time"]) for chip in doc["chips"]]
    for count in range(len(COLUMNS), 1, -1):
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)
        for name in COLUMNS[:count]:
            table.add_column(name, justify="right" if name in RIGHT else "left", no_wrap=True)
        for cells in rows:
            table.add_row(*(cells[name] for name in COLUMNS[:count]))
        if _width(table) <= width:
            break
    return table


def _width(table: Table) -> int:
    """The width the table takes when nothing constrains it."""
    return Console(width=1000).measure(table).maximum


def process_table(doc: dict[str, Any]) -> Table | None:
    """The reporting training processes: step, rate, live tensors, compiles."""
    if not doc.get("processes"):
        return None
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)
    for name in ("PID", "Framework", "Step", "Steps/s", "Live tensors", "Compiles", "Verdict"):
        table.add_column(name, no_wrap=True, justify="left" if name == "Framework" else "right")
    for p in doc["processes"]:
        growth = p["live_tensors_per_step"]
        live = "-" if p["live_tensors"] is None else f"{p['live_tensors']:,}" + (
            f" {growth:+.1f}/st" if growth else "")
        rate = "-" if p["steps_per_second"] is None else f"{p['steps_per_second']:.1f}"
        compiles = "-" if p["compiles_uncached"] is None else str(p["compiles_uncached"])
        table.add_row(str(p["pid"]), shown(p["framework"]), f"{p['step']:,}", rate, live,
                      compiles + (" recompiling" if p["recompiling"] else ""),
                      _line(verdict_label(p["verdict"]), VERDICT_STYLE.get(p["verdict"], "")))
    return table


def screen(doc: dict[str, Any] | None, where: str, problem: str | None = None,
           width: int = 80) -> Group:
    """The whole view for one status document (or a line saying why there is none)."""
    header = Text(f"tpumon watch  {where}  {time.strftime('%H:%M:%S')}  (Ctrl-C to quit)",
                  style="bold")
    if doc is None:
        return Group(header, _line(problem or "waiting for data", "yellow"))
    ident = " ".join(f"{k}={v}" for k, v in doc["identity"].items() if v)
    parts: list[RenderableType] = [header, _line(ident, "dim"), chip_table(doc, width)]
    processes = process_table(doc)
    if processes is not None:
        parts += [Text(""), processes]
    for chip in doc["chips"]:
        if chip.get("diagnosis"):
            parts.append(_line(f"chip {chip['chip']}: {chip['diagnosis']}", "yellow"))
    for alert in (doc.get("notifications") or {}).get("active_alerts", []):
        parts.append(_line(f"{alert['severity']}: {alert['summary']}",
                           "red" if alert["severity"] == "critical" else "yellow"))
    for name, source in doc["sources"].items():
        if not source["up"]:
            parts.append(_line(f"{name}: down: {source['error']}", "yellow"))
    return Group(*parts)


def _line(text: str, style: str = "") -> Text:
    """Text of the status document as Rich shows it: nothing in it obeyed."""
    return Text.from_markup(shown(text), style=style)


class RuntimeFeed:
    """Status documents from polling the runtime in this process (no agent running)."""

    def __init__(self, assembly: Assembly) -> None:
        self.assembly = assembly

    def __call__(self) -> tuple[dict[str, Any] | None, str | None]:
        return status_document(self.assembly.agent.poll_once(), source="runtime"), None


def agent_feed(client: AgentClient) -> Callable[[], tuple[dict[str, Any] | None, str | None]]:
    """Status documents from the agent; a failed read is shown and retried next refresh."""
    def read() -> tuple[dict[str, Any] | None, str | None]:
        try:
            return dict(client.status()), None
        except AgentError as exc:
            return None, f"{exc}; retrying"
    return read


@click.command("watch")
@config_option
@runtime_ports_option
@agent_option
@agent_client_options
@direct_option
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@slice_options
def command(config_path: str | None, runtime_ports: str | None, agent: str | None,
            auth: ClientAuth, direct: bool, interval: float, slice_: bool,
            **slice_opts: Any) -> None:
    """Live full-screen view of every chip: HBM bar, floor, growth, time to OOM, verdict,
    duty cycle, and the training processes' step, step rate and live tensors. Reads the
    local agent; with none running, a protected one (exporter.web_config_file, without
    --agent-* options) or --direct, polls the runtime itself. An agent named with --agent
    is waited for while it does not answer.

    Fits the terminal, 80 columns and up: where it is narrower than every column needs,
    duty cycle, growth per hour, floor and growth per step are left out, in that order.
    Verdicts: ok, growing, leak, warming up (warming_up), collecting (insufficient_data:
    under 30 minutes of floors), stepped up (step_change), as every view writes them.
    Without a terminal (a pipe, a file) it
    prints the same view as plain text every interval. Ctrl-C quits. With --slice, every
    chip of the slice."""
    config = load_config(config_path, {"runtime.ports": ports_value(runtime_ports)})
    setup_logging("error")
    if slice_:
        return watch_slice(config, slice_opts, auth, interval)
    client = agent_to_ask(config, agent, direct, auth)
    assembly = None
    feed: Callable[[], tuple[dict[str, Any] | None, str | None]]
    # a named agent that does not answer yet is waited for (shown, retried); the local
    # one, when none runs, is replaced by this command's own polls of the runtime
    if client is None or (agent is None and ask_agent(client, named=False) is None):
        assembly = build(config, history=False)
        feed, where = RuntimeFeed(assembly), "runtime (no agent)"
    else:
        feed, where = agent_feed(client), client.url
    try:
        _loop(feed, where, interval)
    finally:
        if assembly is not None:
            assembly.close()


def _loop(feed: Callable[[], tuple[dict[str, Any] | None, str | None]], where: str,
          interval: float) -> None:
    console = Console()
    try:
        if not console.is_terminal:
            _plain(feed, where, interval)
            return
        with Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                doc, problem = feed()
                live.update(screen(doc, where, problem, console.width), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


def _plain(feed: Callable[[], tuple[dict[str, Any] | None, str | None]], where: str,
           interval: float) -> None:
    """No terminal (a pipe, a file, a log): the same view as plain text, one snapshot per
    interval, each followed by a blank line and flushed, until interrupted or the reader
    goes away."""
    console = Console(width=80, no_color=True, force_terminal=False, soft_wrap=False)
    try:
        while True:
            doc, problem = feed()
            with console.capture() as captured:
                console.print(screen(doc, where, problem, 80))
            sys.stdout.write(captured.get() + "\n")
            sys.stdout.flush()
            time.sleep(interval)
    except BrokenPipeError:  # the reader left (| head): stop quietly, nothing left to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
