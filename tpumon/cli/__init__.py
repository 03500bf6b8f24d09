"""The ``tpumon`` command: one click group, one module per command.

Errors the user can fix (bad configuration, a port in use, a bad file) are caught here
once and printed as a single ``Error: ...`` line with exit status 1, never a traceback.
"""

from __future__ import annotations

import os

from tpumon import grpc_env

grpc_env.apply(os.environ)  # before anything imports grpc

import click  # noqa: E402

from tpumon import __version__  # noqa: E402
from tpumon.config import ConfigError
from tpumon.exporters.http import ListenError
from tpumon.sim.process import SimulatorStartError

USER_ERRORS = (ConfigError, ListenError, SimulatorStartError)


class TpumonGroup(click.Group):
    """Turns user errors raised anywhere below into one clean line."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=TpumonGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tpumon")
def main() -> None:
    """tpumon watches the HBM of every TPU chip on this VM, exports it to Prometheus and
    warns about slow leaks before a long training run dies of OOM."""


def _register() -> None:
    from tpumon.cli import (agent, analyze, config_cmd, export, report, sim, snapshot, status,
                            version, watch)

    for module in (agent, status, watch, snapshot, analyze, report, export, sim, config_cmd,
                   version):
        main.add_command(module.command)


_register()
