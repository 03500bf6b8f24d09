"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Callable

import click

from tpumon.config import ConfigError, parse_ports

config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), default=None,
    help="TOML configuration file [default: $TPUMON_CONFIG, else /etc/tpumon/config.toml "
         "if it exists].")


def ports_value(raw: str | None) -> list[int] | None:
    """--runtime-ports '8431,8432' or '8431-8434' -> [..]; None when not given."""
    if raw is None:
        return None
    try:
        return parse_ports(raw)
    except ValueError:
        raise ConfigError(f"--runtime-ports: cannot read {raw!r} as ports (e.g. 8431,8432 "
                          f"or 8431-8434)") from None


runtime_ports_option = click.option(
    "--runtime-ports", default=None, metavar="LIST",
    help="Runtime metric service ports, e.g. 8431-8434 [default: runtime.ports, "
         "TPU_RUNTIME_METRICS_PORTS, tpu-env metadata, 8431].")

agent_option = click.option(
    "--agent", "agent", default=None, metavar="URL",
    help="The agent to ask [default: this host, at exporter.listen_address].")

direct_option = click.option(
    "--direct", is_flag=True,
    help="Read the runtime directly, even if an agent runs (verdicts then build up from "
         "this command's own polls only).")

state_dir_option = click.option(
    "--state-dir", default=None, metavar="DIR",
    help="Directory of the history store [default: store.state_dir, /var/lib/tpumon].")


def history_selection(command: Callable) -> Callable:
    """--since, --until, --host, --chip: which part of the history (export, report)."""
    for option in reversed((
            click.option("--since", default=None, metavar="WHEN",
                         help="Only samples from then on: Unix seconds, ISO 8601 (UTC unless "
                              "a zone is given) or an age such as 6h or 2d."),
            click.option("--until", default=None, metavar="WHEN",
                         help="Only samples up to then."),
            click.option("--host", "hosts", multiple=True, help="Only this host (repeatable)."),
            click.option("--chip", "chips", multiple=True,
                         help="Only this chip (repeatable)."))):
        command = option(command)
    return command
