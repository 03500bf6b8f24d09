"""``tpumon status --slice`` and ``tpumon watch --slice``: the slice's options, its table
and its live view (the slice logic itself is tpumon/client/slice.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import click
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tpumon.cli.format import output_console
from tpumon.client.http import ClientAuth
from tpumon.common.config import Config, ConfigError, parse_listen_address
from tpumon.common.describe import describe_growth, oom_cell, verdict_label
from tpumon.common.units import format_bytes
from tpumon.client.slice import (ClientOptions, SliceError, SliceView, ask_all, build_view,
                                 peers_from_metadata, peers_from_service,
                                 split_peers, summary_line)
from tpumon.common.untrusted_text import for_terminal as shown


def slice_options(command: Callable) -> Callable:
    """--slice and where its peers are (the --agent-* options say how to reach agents
    behind TLS or passwords)."""
    for option in reversed((
            click.option("--slice", "slice_", is_flag=True,
                         help="Every chip of the slice: ask every worker's agent."),
            click.option("--peers", default=None, metavar="HOST[:PORT],...",
                         help="With --slice: the workers' agents [default: --service, else "
                              "the TPU VM metadata's worker-network-endpoints]."),
            click.option("--service", default=None, metavar="NAME",
                         help="With --slice: a Kubernetes headless service whose DNS name "
                              "resolves to every agent pod."),
            click.option("--agent-port", type=click.IntRange(1, 65535), default=None,
                         help="With --slice: the agents' port where a peer gives none "
                              "[default: exporter.listen_address's, 9847]."),
            click.option("--deadline", type=click.FloatRange(min=0.1), default=1.0,
                         show_default=True,
                         help="With --slice: seconds to wait for the agents' answers; an "
                              "agent that has not answered by then is shown late."),
            click.option("--tls", is_flag=True,
                         help="With --slice: the agents serve HTTPS (implied by "
                              "--agent-ca-file and --agent-cert-file)."))):
        command = option(command)
    return command


def _peers(config: Config, peers: str | None, service: str | None) -> list[str]:
    if peers:
        found = split_peers(peers)
        if not found:
            raise ConfigError(f"--peers: no peer in {peers!r} (e.g. 10.0.0.2:9847,10.0.0.3)")
        return found
    if service:
        return peers_from_service(service)
    return peers_from_metadata(max(2.0, config["identity.metadata_timeout"]))


def slice_reader(config: Config, opts: dict[str, Any],
                 auth: ClientAuth) -> Callable[[], SliceView]:
    """What asks the slice once: peers found once, agents asked at every call."""
    client = ClientOptions(opts["tls"], auth)
    try:
        client.ssl_context()  # bad client options fail now, once, not per worker
        client.headers()
        peers = _peers(config, opts["peers"], opts["service"])
    except SliceError as exc:
        raise ConfigError(str(exc)) from None
    port = opts["agent_port"] or parse_listen_address(config["exporter.listen_address"])[1]
    return lambda: build_view(ask_all(peers, port, client, opts["deadline"]))


def slice_table(view: SliceView) -> Table:
    """One row per chip, worker by worker; a worker that did not answer is one row."""
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("Worker", "Chip", "HBM used", "Growth", "Verdict", "OOM in"):
        table.add_column(name, justify="right" if name in ("Chip", "HBM used") else "left",
                         no_wrap=True)
    for row in view.chips:
        used = "[yellow]no data[/]" if not row.up or row.hbm_used_bytes is None else \
            format_bytes(row.hbm_used_bytes) + (
                f" {100 * row.hbm_used_bytes / row.hbm_total_bytes:.0f} %"
                if row.hbm_total_bytes else "")
        verdict = "[bold red]leak[/]" if row.verdict == "leak" else \
            shown(verdict_label(row.verdict))
        eta = oom_cell(row.seconds_to_oom, row.growth_bytes_per_hour)  # as status shows it
        table.add_row(shown(row.worker or "?"), shown(row.chip), used,
                      describe_growth(row.growth_bytes_per_step, row.growth_bytes_per_hour),
                      verdict, eta)
    for answer in view.missing:  # the peer where its HBM would be: the widest cell
        table.add_row("?", "-", shown(answer.peer), "-", f"[yellow]{answer.state}[/]", "-")
    return table


def problems(view: SliceView) -> list[str]:
    """Why each worker that did not answer did not ('down: connection refused', 'late: no
    answer within 1 s'), as Rich markup (what the worker answered is shown, not
    obeyed)."""
    return [shown(f"{a.url}: {a.state}: {a.error}") for a in view.missing]


def show_slice(config: Config, fmt: str, opts: dict[str, Any], auth: ClientAuth) -> None:
    """`tpumon status --slice`: the table (or JSON) once."""
    view = slice_reader(config, opts, auth)()
    if fmt == "json":
        click.echo(json.dumps(view.to_json(), indent=2))
    else:
        console = output_console()
        console.print(shown(summary_line(view)), highlight=False, soft_wrap=True)
        console.print(slice_table(view))
        for line in problems(view):
            console.print(f"[yellow]{line}[/]", highlight=False)


def watch_slice(config: Config, opts: dict[str, Any], auth: ClientAuth,
                interval: float) -> None:
    """`tpumon watch --slice`: the slice's table redrawn in place until Ctrl-C; without a
    terminal (a pipe, a file), as plain text every interval, as `tpumon watch` prints."""
    read = slice_reader(config, opts, auth)
    console = Console()
    try:
        if not console.is_terminal:  # a screen-mode Live prints nothing there
            _plain(read, interval)
            return
        with Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                live.update(watch_frame(read()), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


def _plain(read: Callable[[], SliceView], interval: float) -> None:
    """One frame per interval, each followed by a blank line and flushed, until
    interrupted or the reader goes away (| head)."""
    console = Console(no_color=True, force_terminal=False, soft_wrap=True, highlight=False)
    try:
        while True:
            with console.capture() as captured:
                console.print(watch_frame(read()))
            sys.stdout.write(captured.get() + "\n")
            sys.stdout.flush()
            time.sleep(interval)
    except BrokenPipeError:  # nothing left to flush to a reader that left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def watch_frame(view: SliceView) -> Group:
    """One screen of `watch --slice` (bench/slice_fanout.py times a refresh with it)."""
    header = Text(f"tpumon watch --slice  {time.strftime('%H:%M:%S')}  (Ctrl-C to quit)",
                  style="bold")
    lines = [Text.from_markup(line, style="yellow") for line in problems(view)]
    return Group(header, Text.from_markup(shown(summary_line(view))), slice_table(view),
                 *lines)
