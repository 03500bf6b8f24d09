"""The ``tpumon`` command: one click group, one module per command.

A command's module is imported only when that command runs (or shows its own help), so
``tpumon --help``, ``--version`` and ``status`` do not pay for the agent, gRPC and numpy
(docs/benchmarks.md, start-up); gRPC's settings (grpc_env) are made just before that. The
group's help lists the commands from :data:`COMMANDS`, whose summaries
tests/test_startup.py checks against each command's own help.

Errors the user can fix (bad configuration, a port in use, a bad file) are caught here
once and printed as a single ``Error: ...`` line with exit status 1, never a traceback.
"""

from __future__ import annotations

import importlib
import os

import click

from tpumon import __version__
from tpumon.agent import grpc_env

#: command name -> (module under tpumon.cli, summary: the first sentence of its help)
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("agent", "Poll every TPU chip's HBM, detect slow leaks, serve Prometheus "
                       "metrics until SIGTERM."),
    "status": ("status", "Show each chip's HBM, duty cycle, owner and leak verdict."),
    "watch": ("watch", "Live full-screen view of every chip: HBM bar, floor, growth, time to "
                       "OOM, verdict, duty cycle, and the training "
                       "processes' step, step rate and live tensors."),
    "snapshot": ("snapshot", "Diff two live-tensor snapshots of a training process: what "
                             "grew, by shape, dtype and creation site, and how much of the "
                             "HBM growth it explains."),
    "analyze": ("analyze", "Replay the agent's streaming leak detector over a trace file "
                           "(CSV, JSON Lines for .jsonl, Parquet for .parquet; '-' reads CSV "
                           "or JSON Lines from stdin), or over every trace file in a directory "
                           "(one per host of a slice, say), and report, per (host, chip): the "
                           "verdict at the end, the growth rate, the OOM forecast with its "
                           "interval, and the first moment the leak alert would have fired, "
                           "with the forecast made then."),
    "report": ("report", "Draw what the leak detector saw, per host: tpumon-report-HOST.png "
                         "(one panel per chip: raw samples, the floor, the fitted trend and "
                         "its 95% band, the OOM forecast, restarts, level jumps, the leak "
                         "alert) and tpumon-report-HOST.html (the picture and a summary "
                         "table per chip, in one self-contained file)."),
    "export": ("export", "Write the agent's stored HBM history as a trace (the format "
                         "'tpumon analyze' reads), for a post-mortem after the job died."),
    "sim": ("sim", "Simulate a TPU VM's chips for a training workload, on loopback, with "
                   "no TPU."),
    "config": ("config_cmd", "Inspect configuration (file, TPUMON_* environment, defaults)."),
    "version": ("version", "Print tpumon's version and those of the pieces it is built on."),
}


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors a user can fix. Imported only once something failed: they live in
    modules that most commands never load."""
    from tpumon.common.config import ConfigError
    from tpumon.web.http import ListenError
    from tpumon.sim.process import SimulatorStartError

    return (ConfigError, ListenError, SimulatorStartError)


class TpumonGroup(click.Group):
    """Loads a command's module on first use, and turns user errors raised anywhere below
    into one clean line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        grpc_env.apply(os.environ)  # before the command's module (or anything) imports grpc
        command: click.Command = importlib.import_module(
            f"tpumon.cli.{COMMANDS[cmd_name][0]}").command
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        """A mistyped command gets the nearest names ('tpumon stauts': "Did you mean
        'status'?"), one usage line as click writes any other error."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            import difflib  # on a mistyped command only: the agent never loads it

            near = difflib.get_close_matches(name, list(COMMANDS), n=2, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their summaries, without importing any of them."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.Abort, click.exceptions.Exit):
            raise
        except Exception as exc:
            if isinstance(exc, _user_errors()):
                raise click.ClickException(str(exc)) from None
            raise


@click.group(cls=TpumonGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tpumon")
def main() -> None:
    """tpumon watches the HBM of every TPU chip on this VM, exports it to Prometheus and
    warns about slow leaks before a long training run dies of OOM."""
