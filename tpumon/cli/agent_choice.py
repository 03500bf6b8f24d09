"""Which agent a client command asks (the local one, one named with --agent, or none: the
runtime read directly), and asking it: a local agent that does not answer is a fallback,
a named one an error."""

from __future__ import annotations

import click

from tpumon.client.http import AgentClient, AgentError, AgentUnreachable, ClientAuth, StatusDocument
from tpumon.common.config import Config, parse_listen_address, reachable_host


def agent_url(listen_address: str) -> str:
    """Where the local agent serves, from its listen address (all interfaces -> loopback)."""
    host, port = parse_listen_address(listen_address)
    host = reachable_host(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def agent_to_ask(config: Config, agent: str | None, direct: bool,
                 auth: ClientAuth | None = None) -> AgentClient | None:
    """The agent to ask, or None to read the runtime directly: with --direct, or when the
    local agent serves behind exporter.web_config_file (TLS, passwords) and no --agent-*
    client option says how to talk to it. That is said on stderr, so that verdicts built
    from this command's own polls are not taken for the agent's."""
    if direct:
        return None
    protected = config["exporter.web_config_file"]
    if agent is None and protected and auth == ClientAuth():
        click.echo(f"tpumon: the local agent is protected by {protected} "
                   "(exporter.web_config_file); give --agent https://... with --agent-ca-file "
                   "and --agent-user/--agent-password-file or --agent-cert-file to ask it. "
                   "Reading the runtime directly, without the agent's history", err=True)
        return None
    try:
        return AgentClient(agent or agent_url(config["exporter.listen_address"]), auth)
    except AgentError as exc:
        raise click.ClickException(str(exc)) from None


def ask_agent(client: AgentClient, named: bool) -> StatusDocument | None:
    """The agent's status document; None when the local agent (not one named with --agent)
    does not answer, so the command reads the runtime instead. A named agent that cannot
    be asked, or any agent that refuses, is a one-line error."""
    try:
        return client.status()
    except AgentUnreachable as exc:
        if named:
            raise click.ClickException(str(exc)) from None
        return None
    except AgentError as exc:
        raise click.ClickException(str(exc)) from None
