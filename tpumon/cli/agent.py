"""``tpumon agent``: the long-running per-VM agent."""

from __future__ import annotations

import signal
import threading

import click

from tpumon.agent.logs import setup_logging
from tpumon.agent.run import run_agent
from tpumon.cli.options import (config_option, ports_value, runtime_ports_option,
                                state_dir_option)
from tpumon.common.config import load_config
from tpumon.common.signals import Stop, signals_to_events


@click.command("agent")
@config_option
@click.option("--listen-address", default=None, metavar="HOST:PORT",
              help="Where to serve /metrics [default: :9847, all interfaces].")
@click.option("--web-config-file", default=None, metavar="FILE",
              help="TLS, client certificates and basic auth, in the exporter-toolkit's web "
                   "configuration format (like node_exporter's --web.config.file) "
                   "[default: exporter.web_config_file; none: plain HTTP].")
@click.option("--poll-interval", type=float, default=None, metavar="SECONDS",
              help="Seconds between polls [default: 5].")
@runtime_ports_option
@state_dir_option
@click.option("--reporter-socket", default=None, metavar="PATH",
              help="Unix socket for the in-process reporters (their connections go to "
                   "NAME-seqpacket.sock beside it); '' for none "
                   "[default: reporter.socket, /run/tpumon/reporter.sock].")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default=None, help="Log level [default: info].")
@click.option("--simulate", is_flag=True,
              help="Run against the built-in TPU simulator instead of libtpu (no TPU needed).")
@click.option("--scenario", default=None,
              help="Simulated workload with --simulate (see 'tpumon sim --list') "
                   "[default: linear-leak].")
@click.option("--acceleration", type=float, default=None,
              help="Simulated seconds per real second with --simulate [default: 60].")
@click.option("--sim-host", default=None, metavar="HOST:PORT",
              help="With --simulate: attach to this host of a running 'tpumon sim --hosts N' "
                   "(its metadata address) instead of starting a simulator "
                   "[default: simulator.host].")
def command(config_path: str | None, listen_address: str | None, web_config_file: str | None,
            poll_interval: float | None, runtime_ports: str | None, state_dir: str | None,
            reporter_socket: str | None, log_level: str | None, simulate: bool,
            scenario: str | None, acceleration: float | None, sim_host: str | None) -> None:
    """Poll every TPU chip's HBM, detect slow leaks, serve Prometheus metrics until SIGTERM.

    Reads libtpu's runtime metric service (the one tpu-info reads) on every port in
    TPU_RUNTIME_METRICS_PORTS and the host's memory, and runs the leak detector on every
    chip (verdict, growth, OOM forecast: see 'tpumon status' and /metrics). Keeps the
    samples and the detectors' state in a history store under --state-dir, so a restart
    resumes every trend and 'tpumon export' has the data after the job died. Never opens
    a TPU device, so it runs beside the training job. With --simulate it runs the same
    agent against the built-in simulator, on any machine.
    """
    flags = {
        "exporter.listen_address": listen_address, "exporter.web_config_file": web_config_file,
        "agent.poll_interval": poll_interval,
        "runtime.ports": ports_value(runtime_ports), "agent.log_level": log_level,
        "store.state_dir": state_dir, "reporter.socket": reporter_socket,
        "simulator.scenario": scenario, "simulator.acceleration": acceleration,
        "simulator.host": sim_host}
    config = load_config(config_path, flags)
    setup_logging(config["agent.log_level"])
    stop, reload = Stop(), threading.Event()
    with signals_to_events({signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: reload}):
        run_agent(config, simulate, stop, reload, lambda: load_config(config_path, flags))
