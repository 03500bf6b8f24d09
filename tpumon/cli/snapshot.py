"""``tpumon snapshot``: which tensors does a training process keep alive? Ask it now.

The agent asks the process's reporter for two live-tensor snapshots ``--steps`` apart
(at step boundaries, inside the training loop) and diffs them; this command starts that
and waits for the answer. The agent does the same by itself when a chip's leak alert is
raised (reporter.snapshot_on_leak).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Mapping

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tpumon.cli.options import agent_client_options, agent_option, config_option
from tpumon.cli.agent_choice import agent_url
from tpumon.cli.format import output_console, snapshot_line
from tpumon.client.http import AgentClient, AgentError, ClientAuth
from tpumon.common.config import load_config
from tpumon.common.units import format_bytes

MAX_WAIT_SECONDS = 900.0
SITES_HINT = ("creation sites were not recorded: for PyTorch/XLA set TPUMON_TRACK_SITES=1 in "
              "the training process (or TorchXlaReporter(track_sites=True)); JAX records them by "
              "default")


@click.command("snapshot")
@config_option
@agent_option
@agent_client_options
@click.option("--pid", type=click.IntRange(1), default=None,
              help="The training process [default: the only one that reports].")
@click.option("--steps", type=click.IntRange(1, 1_000_000), default=None,
              help="Steps between the two snapshots [default: reporter.snapshot_steps, or "
                   "about two minutes of the job's steps].")
@click.option("--timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds to wait for both snapshots [default: three times what the "
                   "process's step rate needs for --steps, plus a minute; at most 15 min].")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Output format.")
def command(config_path: str | None, agent: str | None, auth: ClientAuth, pid: int | None,
            steps: int | None, timeout: float | None, fmt: str) -> None:
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
    result = _wait(client, asked, timeout)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    elif result.get("error"):
        raise click.ClickException(f"pid {asked['pid']}: {snapshot_line(result)}")
    else:
        _render(asked["pid"], result, output_console())
    if result.get("error"):
        raise SystemExit(1)


def _wait(client: AgentClient, asked: Mapping[str, Any],
          timeout: float | None) -> dict[str, Any]:
    """The process's snapshot state once this request ended; one clear error when the
    process exits, stops reporting, or the wait runs past ``timeout`` (a progress bar on
    a terminal meanwhile, quiet when piped)."""
    pid, request_id, steps = asked["pid"], asked["request_id"], asked["steps"]
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"pid {pid}: {steps} steps between two snapshots",
                                 total=steps)
        while True:
            process = _process(client, pid)
            found = process.get("tensor_snapshot") or {}
            if found.get("request_id") == request_id and not found["pending"]:
                return found
            if process.get("exited"):
                raise click.ClickException(f"process {pid} exited before answering")
            limit = timeout or _default_timeout(steps, process.get("steps_per_second"))
            if time.monotonic() - started >= limit:
                raise click.ClickException(
                    f"no answer from process {pid} within {limit:.0f} s (at step "
                    f"{process.get('step')}; the request stays open in the agent)")
            _show(progress, task, found, process)
            time.sleep(1.0)


def _process(client: AgentClient, pid: int) -> dict[str, Any]:
    """The process's entry in the agent's status; an error once it is gone."""
    try:
        doc: dict[str, Any] = dict(client.status(timeout=5.0))
    except AgentError as exc:
        raise click.ClickException(f"the agent stopped answering: {exc}") from None
    process = next((p for p in doc.get("processes", []) if p["pid"] == pid), None)
    if process is None:
        raise click.ClickException(f"process {pid} is no longer reporting")
    return process


def _default_timeout(steps: int, rate: float | None) -> float:
    """Three times the time ``steps`` take at the process's rate, plus a minute; 15 min
    at most, and that when the rate is not known."""
    if not rate:
        return MAX_WAIT_SECONDS
    return min(MAX_WAIT_SECONDS, 3 * steps / rate + 60.0)


def _show(progress: Progress, task: Any, found: dict[str, Any], process: dict[str, Any]) -> None:
    first = found.get("from_step")
    if first is not None and process.get("step") is not None:
        progress.update(task, completed=max(0, process["step"] - first))


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
    if not any(g["sites"] for g in result["grown"]):
        console.print(SITES_HINT, highlight=False)
