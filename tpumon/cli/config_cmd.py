"""``tpumon config``: see the effective configuration, or check a file before deploying it."""

from __future__ import annotations

import click

from tpumon.cli.options import config_option
from tpumon.common.config import load_config, render_toml


@click.group("config")
def command() -> None:
    """Inspect configuration (file, TPUMON_* environment, defaults)."""


@command.command("show")
@config_option
@click.option("--bare", is_flag=True, help="Without comments.")
def show(config_path: str | None, bare: bool) -> None:
    """Print the effective configuration as TOML, each key's origin in a comment."""
    click.echo(render_toml(load_config(config_path), with_docs=not bare), nl=False)


@command.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def check(path: str) -> None:
    """Validate a configuration file; exit status 1 and one line naming the problem if bad."""
    from tpumon.sim.pod import check_scenario  # the simulator's own settings, checked there

    check_scenario(load_config(path, env={}))
    click.echo(f"{path}: ok")
