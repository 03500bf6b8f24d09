"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Callable

import functools

import click

from tpumon.client.http import ClientAuth
from tpumon.common.config import ConfigError, parse_ports

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

def agent_client_options(command: Callable) -> Callable:
    """--agent-ca-file, --agent-cert-file, --agent-key-file, --agent-user,
    --agent-password-file: what a Prometheus scrape job has for an agent behind
    exporter.web_config_file; the command gets them as one ``auth`` (a ClientAuth)."""
    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> object:
        auth = ClientAuth(**{field: kwargs.pop(f"agent_{field}") for field in  # type: ignore
                             ("ca_file", "cert_file", "key_file", "user", "password_file")})
        return command(*args, auth=auth, **kwargs)

    path = click.Path(dir_okay=False)
    for option in reversed((
            click.option("--agent-ca-file", type=path, default=None, metavar="FILE",
                         help="CA certificate(s) that sign the agent's TLS certificate "
                              "[default: the system's]."),
            click.option("--agent-cert-file", type=path, default=None, metavar="FILE",
                         help="Client certificate (PEM) for an agent that asks for one."),
            click.option("--agent-key-file", type=path, default=None, metavar="FILE",
                         help="The client certificate's key [default: in --agent-cert-file]."),
            click.option("--agent-user", default=None, help="Basic-auth user at the agent."),
            click.option("--agent-password-file", type=path, default=None, metavar="FILE",
                         help="File whose first line is --agent-user's password."))):
        wrapper = option(wrapper)
    return wrapper


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
                              "a zone is given) or an age such as 6h or 2d [default: the "
                              "whole store; with --prometheus, 24h ago]."),
            click.option("--until", default=None, metavar="WHEN",
                         help="Only samples up to then."),
            click.option("--host", "hosts", multiple=True, help="Only this host (repeatable)."),
            click.option("--chip", "chips", multiple=True,
                         help="Only this chip (repeatable)."))):
        command = option(command)
    return command
