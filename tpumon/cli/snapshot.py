"""``tpumon snapshot``: which tensors does a training process keep alive? Ask it now.

The agent asks the process's reporter for two live-tensor snapshots ``--steps`` apart
(at step boundaries, inside the training loop) and diffs them; this command starts that
and waits for the answer. The agent does the same by itself when a chip's leak alert is
raised (reporter.snapshot_on_leak).
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tpumon.cli.options import agent_client_options, agent_option, config_option
from tpumon.cli.status import agent_url, snapshot_line
from tpumon.client import AgentClient, AgentError, ClientAuth
from tpumon.config import load_config
from tpumon.units import format_bytes


@click.command("snapshot")
@config_option
@agent_option
@agent_client_options
@click.option("--pid", type=click.IntRange(1), default=None,
              help="The training process [default: the only one that reports].")
@click.option("--steps", type=click.IntRange(1, 1_000_000), default=None,
              help="Steps between the two snapshots [default: reporter.snapshot_steps, or "
                   "about two minutes of the job's steps].")
@click.option("--timeout", type=click.FloatRange(min=1), default=900.0, show_default=True,
              help="Seconds to wait for both snapshots.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format.")
def command(config_path: str | None, agent: str | None, auth: ClientAuth, pid: int | None,
            steps: int | None, timeout: float, fmt: str) -> None:
    """Diff two live-tensor snapshots of a training process: what grew, by shape, dtype and
    creation site, and how much of the HBM growth it explains.

    Needs the running agent on this machine and a process instrumented with
    tpumon.instrument; creation sites need TPUMON_TRACK_SITES=1 in the process
    (PyTorch/XLA) or come by default (JAX).
    """
    config = load_config(config_path)
    steps = steps or config["reporter.snapshot_steps"] or None
    try:
        client = AgentClient(agent or agent_url(config["exporter.listen_address"]), auth)
        asked = client.request_snapshot(pid, steps)
    except AgentError as exc:
        raise click.ClickException(str(exc)) from None
    result = _wait(client, asked["pid"], asked["request_id"], timeout)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        _render(asked["pid"], result, Console())
    if result.get("error"):
        raise SystemExit(1)


def _wait(client: AgentClient, pid: int, request_id: str, timeout: float) -> dict[str, Any]:
    """The process's snapshot state once this request ended (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            doc: dict[str, Any] = dict(client.status(timeout=5.0))
        except AgentError:
            doc = {}
        process = next((p for p in doc.get("processes", []) if p["pid"] == pid), None)
        if process is None and doc:
            raise click.ClickException(f"process {pid} is no longer reporting")
        found = (process or {}).get("tensor_snapshot") or {}
        if found.get("request_id") == request_id and not found["pending"]:
            return found
        if time.monotonic() >= deadline:
            raise click.ClickException(f"no answer from process {pid} within {timeout:g} s "
                                       "(the request stays open in the agent)")
        time.sleep(1.0)


def _render(pid: int, result: dict[str, Any], console: Console) -> None:
    console.print(f"pid {pid}: {snapshot_line(result)}", highlight=False)
    if not result["grown"]:
        return
    table = Table(title="tensor groups that grew", title_justify="left")
    for column in ("Group", "Per step", "Bytes/step", "Each", "Gained", "Created at"):
        table.add_column(column)
    for g in result["grown"]:
        per_step = "-" if g["count_per_step"] is None else f"{g['count_per_step']:+.3g}"
        per_bytes = "-" if g["bytes_per_step"] is None else format_bytes(g["bytes_per_step"])
        each = "-" if g["bytes_each"] is None else format_bytes(g["bytes_each"])
        sites = "\n".join(f"{site} (+{n})" for site, n in g["sites"].items()) or "-"
        table.add_row(g["group"], per_step, per_bytes, each, f"{g['count_delta']:+,}", sites)
    console.print(table)
