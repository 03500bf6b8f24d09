"""``tpumon status``: a one-shot per-chip table, like tpu-info's, or JSON.

Rich reads every string it prints as markup, and the terminal obeys escape sequences:
each field of the status document (a process's name, a framework, a summary that quotes
them, an error a peer wrote) is printed through
:func:`~tpumon.common.untrusted_text.for_terminal`; only the markup written here is Rich's.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tpumon.cli.agent_choice import agent_to_ask, ask_agent
from tpumon.cli.format import format_eta, format_pct, output_console, snapshot_line
from tpumon.cli.options import (agent_client_options, agent_option, config_option,
                                direct_option, ports_value, runtime_ports_option)
from tpumon.client.http import (ClientAuth)
from tpumon.cli.slice_view import show_slice, slice_options
from tpumon.common.config import Config, load_config
from tpumon.common.describe import describe_growth, verdict_label
from tpumon.agent.logs import setup_logging
from tpumon.common.units import format_bytes
from tpumon.common.untrusted_text import for_terminal as shown


#: The verdicts a person must see first: the page in red, the warning in yellow.
VERDICT_MARKUP = {"leak": "[bold red]leak[/]", "growing": "[yellow]growing[/]"}


def render_table(doc: dict[str, Any], console: Console) -> None:
    ident = doc["identity"]
    title = " ".join(f"{k}={shown(str(v))}" for k, v in ident.items() if v) or "tpumon status"
    table = Table(title=f"{title} ({shown(doc['source'])})", title_justify="left")
    for column in ("Chip", "HBM used", "Duty", "Verdict", "Growth", "OOM in", "Owner"):
        table.add_column(column, justify="right" if column in ("HBM used", "Duty") else "left",
                         no_wrap=column != "Owner", overflow="fold")  # never cut a verdict
    for chip in doc["chips"]:
        owner = "-"
        if chip["owner_pid"] is not None:
            rss = f" {format_bytes(chip['owner_rss_bytes'])}" if chip["owner_rss_bytes"] else ""
            owner = f"{chip['owner_pid']} {shown(chip['owner_process'] or '')}{rss}".strip()
        used = "[yellow]no data[/]" if not chip["up"] else \
            f"{format_bytes(chip['hbm_used_bytes'])} {format_pct(chip['hbm_used_ratio'])}"
        verdict = chip.get("verdict")
        verdict = VERDICT_MARKUP.get(verdict or "", shown(verdict_label(verdict)))
        table.add_row(shown(chip["chip"]), used, format_pct(chip["duty_cycle"]), verdict,
                      describe_growth(chip.get("growth_bytes_per_step"),
                                      chip.get("growth_bytes_per_hour")),
                      format_eta(chip, doc["time"]), owner)
    console.print(table)
    # one poll here: no detector history, no verdict yet
    once = doc["source"] == "runtime" and bool(doc["chips"])
    if once:
        console.print("verdicts need the agent's history: this is one reading of the "
                      "runtime (start 'tpumon agent' for leak verdicts)", highlight=False)
    for chip in doc["chips"]:
        if chip.get("reason") and not once:
            said = f"chip {chip['chip']}: {verdict_label(chip['verdict'])}: {chip['reason']}"
            console.print(shown(said), highlight=False)
        if chip.get("diagnosis"):
            console.print(shown(f"chip {chip['chip']}: likely cause: {chip['diagnosis']}"),
                          highlight=False)
    render_processes(doc.get("processes") or [], console)
    render_job_ends(doc.get("job_ends") or [], console)
    for name, source in doc["sources"].items():
        if not source["up"]:
            down = shown(f"{name}: down: {source['error']}")
            console.print(f"[yellow]{down}[/]", highlight=False)
    render_runtime_servers(doc.get("runtime_servers") or {}, console)
    host = doc["host"]
    if host:
        console.print(f"host memory: {format_bytes(host['memory_used_bytes'])} used of "
                      f"{format_bytes(host['memory_total_bytes'])}", highlight=False)
    store = doc.get("store")
    if store:
        state = "writing" if store["up"] else f"[yellow]not writing: {shown(store['error'])}[/]"
        console.print(f"history: {shown(store['path'])} ({format_bytes(store['size_bytes'])}), "
                      f"{state}", highlight=False)
    render_notifications(doc.get("notifications"), console)


def render_runtime_servers(servers: dict[str, dict[str, Any]], console: Console) -> None:
    """Who serves each runtime port that someone listens on: its pid and uid, and whether
    its figures are believed (a squatter's are not: docs/security.md)."""
    for port, s in servers.items():
        if s["uid"] is None:
            continue
        who = shown(f"runtime port {port}: pid "
                    f"{'unknown' if s['pid'] is None else s['pid']}, uid {s['uid']}")
        if s["trusted"]:
            console.print(f"{who} ({shown(s['reason'])})", highlight=False)
        else:
            console.print(f"[yellow]{who}: untrusted, figures ignored: {shown(s['reason'])}[/]",
                          highlight=False)


def render_notifications(notes: dict[str, Any] | None, console: Console) -> None:
    """Active alerts and each notifier's delivery state (never its URL or key)."""
    if not notes:
        return
    for alert in notes["active_alerts"]:
        color = "red" if alert["severity"] == "critical" else "yellow"
        console.print(f"[{color}]{shown(alert['severity'])}[/] "
                      f"{shown(alert['name'])}: {shown(alert['summary'])}", highlight=False)
    for c in notes["channels"]:
        state = "ok" if c["up"] else f"[yellow]failing: {shown(c['last_error'])}[/]"
        console.print(f"{c['name']}: {state}, {c['pending']} waiting, "
                      f"{c['delivered_total']} sent", highlight=False)


def render_processes(processes: list[dict[str, Any]], console: Console) -> None:
    """The reporting training processes (tpumon.instrument), when there are any."""
    if not processes:
        return
    table = Table(title="training processes (reporters)", title_justify="left")
    for column in ("PID", "Framework", "Rank", "Step", "Steps/s", "Live", "RSS", "Compiles",
                   "Verdict"):
        table.add_column(column)
    for p in processes:
        growth = p["live_tensors_per_step"]
        live = "-" if p["live_tensors"] is None else f"{p['live_tensors']:,}" + (
            f" {growth:+.1f}/step" if growth else "")
        rate = "-" if p["steps_per_second"] is None else f"{p['steps_per_second']:.1f}"
        compiles = f"{p['compiles_uncached'] if p['compiles_uncached'] is not None else '-'}" + (
            " [yellow]recompiling[/]" if p["recompiling"] else "")
        table.add_row(str(p["pid"]), shown(p["framework"]),
                      "-" if p["rank"] is None else str(p["rank"]),
                      f"{p['step']:,}", rate, live, _rss_cell(p), compiles, _process_verdict(p))
    console.print(table)
    for p in processes:
        if p.get("verdict_reason") and not p.get("exited"):
            said = f"pid {p['pid']}: {verdict_label(p['verdict'])}: {p['verdict_reason']}"
            console.print(shown(said), highlight=False)
        if p["diagnosis"]:
            console.print(shown(f"pid {p['pid']}: {p['diagnosis']}"), highlight=False)
        line = snapshot_line(p.get("tensor_snapshot"))
        if line:
            console.print(shown(f"pid {p['pid']}: {line}"), highlight=False)


def render_job_ends(ends: list[dict[str, Any]], console: Console) -> None:
    """Jobs that ended on this host in the last hour, newest first (docs/job-ends.md)."""
    for end in ends:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(end["time"]))
        console.print(f"[bold]{when}[/] {shown(end['summary'])}", highlight=False)


def _rss_cell(p: dict[str, Any]) -> str:
    if p.get("rss_bytes") is None:
        return "-"
    growth = p.get("rss_growth_bytes_per_step")
    grows = f" {format_bytes(growth)}/step" if growth and growth > 0 else ""
    return format_bytes(p["rss_bytes"]) + grows


def _process_verdict(p: dict[str, Any]) -> str:
    """Device and host verdicts in one cell: an exited process says so first."""
    if p.get("exited"):
        return "[dim]exited[/]"
    verdict = VERDICT_MARKUP["leak"] if p["verdict"] == "leak" else \
        shown(verdict_label(p["verdict"]))
    if p.get("host_verdict") == "leak":
        verdict += ", [bold red]host leak[/]"
    return verdict


def from_runtime(config: Config) -> dict[str, Any]:
    """One poll of the runtime and the host, as the agent would do it (no history)."""
    from tpumon.agent.bootstrap import build  # the agent, gRPC, numpy: only for this path
    from tpumon.web.status import status_document

    assembly = build(config, history=False)
    try:
        return status_document(assembly.agent.poll_once(), source="runtime")
    finally:
        assembly.close()


@click.command("status")
@config_option
@runtime_ports_option
@agent_option
@agent_client_options
@direct_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format.")
@click.option("--metric", metavar="NAME", help="Show one of the runtime's other metrics "
              "instead, read from the runtime like tpu-info: its name in tpu-info "
              "(hlo_exec_timing, buffer_transfer_latency, ...), in tpumon or in libtpu.")
@click.option("--list-metrics", is_flag=True, help="List the metrics the runtime serves "
              "and the tpumon metric each is exported as.")
@slice_options
def command(config_path: str | None, runtime_ports: str | None, agent: str | None,
            auth: ClientAuth, direct: bool, fmt: str, metric: str | None,
            list_metrics: bool, slice_: bool, **slice_opts: Any) -> None:
    """Show each chip's HBM, duty cycle, owner and leak verdict.

    Asks the local agent (which has the history behind the verdicts); if none answers, or
    it is protected by exporter.web_config_file and no --agent-* option says how to talk
    to it, reads the runtime once, like tpu-info. An agent named with --agent that cannot
    be asked is an error. A runtime that is not running (between jobs) is shown as such,
    with exit status 0. With --slice, every chip of the slice: every worker's agent asked
    at once.
    """
    config = load_config(config_path, {"runtime.ports": ports_value(runtime_ports)})
    setup_logging("warning")
    if slice_:
        return show_slice(config, fmt, slice_opts, auth)
    if metric is not None or list_metrics:
        from tpumon.cli.runtime_view import show  # lazy: only for these options
        show(config, metric, fmt)
        return
    client = agent_to_ask(config, agent, direct, auth)
    doc: Any = None if client is None else ask_agent(client, named=agent is not None)
    if doc is None:
        doc = from_runtime(config)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        render_table(doc, output_console())
