"""``tpumon version``."""

from __future__ import annotations

import platform

import click

from tpumon import __version__, package_version


@click.command("version")
def command() -> None:
    """Print tpumon's version and those of the pieces it is built on."""
    click.echo(f"tpumon {__version__} (tpu-info {package_version('tpu-info')}, "
               f"grpcio {package_version('grpcio')}, python {platform.python_version()})")
