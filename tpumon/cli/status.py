"""``tpumon status``: a one-shot per-chip table, like tpu-info's, or JSON."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tpumon.bootstrap import build
from tpumon.cli.options import config_option, ports_value, runtime_ports_option
from tpumon.config import load_config
from tpumon.logs import setup_logging
from tpumon.status import status_document


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def render_table(doc: dict[str, Any], console: Console) -> None:
    ident = doc["identity"]
    title = " ".join(f"{k}={v}" for k, v in ident.items() if v) or "tpumon status"
    table = Table(title=title, title_justify="left")
    for column in ("Chip", "HBM used", "HBM total", "Used", "Duty cycle", "Owner", "Owner RSS"):
        table.add_column(column, justify="left" if column in ("Chip", "Owner") else "right")
    for chip in doc["chips"]:
        owner = f"{chip['owner_pid']} {chip['owner_process'] or ''}".strip() \
            if chip["owner_pid"] is not None else "-"
        if not chip["up"]:
            table.add_row(chip["chip"], "[yellow]no data[/]", "-", "-", "-", owner, "-")
            continue
        table.add_row(chip["chip"], _gib(chip["hbm_used_bytes"]), _gib(chip["hbm_total_bytes"]),
                      _pct(chip["hbm_used_ratio"]), _pct(chip["duty_cycle"]), owner,
                      _gib(chip["owner_rss_bytes"]))
    console.print(table)
    for name, source in doc["sources"].items():
        if not source["up"]:
            console.print(f"[yellow]{name}: down: {source['error']}[/]", highlight=False)
    host = doc["host"]
    if host:
        console.print(f"host memory: {_gib(host['memory_used_bytes'])} used of "
                      f"{_gib(host['memory_total_bytes'])}", highlight=False)


@click.command("status")
@config_option
@runtime_ports_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format.")
def command(config_path: str | None, runtime_ports: str | None, fmt: str) -> None:
    """Show each chip's HBM, duty cycle and owning process, read once from the runtime.

    A runtime that is not running (between jobs) is shown as such, with exit status 0.
    """
    config = load_config(config_path, {"runtime.ports": ports_value(runtime_ports)})
    setup_logging("warning")
    assembly = build(config)
    try:
        doc = status_document(assembly.agent.poll_once())
    finally:
        assembly.close()
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        render_table(doc, Console())
