"""Each tpumon command imports what it uses: the group's help and the version load none of
the agent, gRPC, numpy or the exporter (bench/startup.py times them; docs/benchmarks.md).
Checked in a fresh interpreter's sys.modules, since this process has imported them all."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from tpumon.cli import COMMANDS, main

HEAVY = ("grpc", "numpy", "prometheus_client", "tpu_info", "tpumon.agent.loop",
         "tpumon.agent.bootstrap", "tpumon.metrics", "tpumon.web", "tpumon.detect", "matplotlib",
         "rich")

LOADED_BY = """
import sys
from tpumon.cli import main
try:
    main({args!r})
except SystemExit:
    pass
sys.stdout.flush()
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def modules_loaded_by(*args: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``tpumon ARGS``."""
    done = subprocess.run([sys.executable, "-c", LOADED_BY.format(args=list(args))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stderr.split())


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("version",)])
def test_help_and_version_import_nothing_heavy(args):
    loaded = modules_loaded_by(*args)
    assert "click" in loaded  # the check sees what was imported
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY
                   or any(m.startswith(h + ".") for h in HEAVY))
    assert not heavy, f"tpumon {' '.join(args)} imported {heavy}"


def test_status_loads_neither_the_agent_nor_numpy_until_it_polls_the_runtime_itself():
    """`tpumon status` asking an agent only fetches and prints (its --direct path builds
    an agent, and imports it then)."""
    loaded = modules_loaded_by("status", "--help")
    assert "tpumon.cli.status" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in ("grpc", "numpy", "tpu_info")
                   or m.startswith(("tpumon.agent.loop", "tpumon.agent.bootstrap",
                                    "tpumon.detect")))
    assert not heavy, f"tpumon status imported {heavy}"


def test_the_group_help_lists_each_command_with_its_own_summary():
    """COMMANDS gives the group's help without importing the commands: it must say what
    each command's own help says, for every command there is."""
    ctx = click.Context(main)
    for name, (module, summary) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, module
        assert command.get_short_help_str(limit=1000) == summary, name
    out = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    assert [line.split()[0] for line in out.split("Commands:\n")[1].splitlines()] \
        == sorted(COMMANDS)
