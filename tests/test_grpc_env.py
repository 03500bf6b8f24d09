"""tpumon's gRPC defaults (tpumon/grpc_env.py): set before grpc is imported, operator's
values kept, the client experiment only on grpcio versions it was measured on."""

import os
import subprocess
import sys

import pytest

from tpumon import grpc_env


def test_defaults_are_set_only_where_the_operator_set_nothing():
    env: dict[str, str] = {}
    grpc_env.apply(env, "1.85.1")
    assert env == {"GRPC_VERBOSITY": "ERROR", "GRPC_EXPERIMENTS": "-event_engine_client"}
    mine = {"GRPC_VERBOSITY": "DEBUG", "GRPC_EXPERIMENTS": "event_engine_client"}
    grpc_env.apply(mine, "1.85.1")
    assert mine == {"GRPC_VERBOSITY": "DEBUG", "GRPC_EXPERIMENTS": "event_engine_client"}


@pytest.mark.parametrize("version, legacy", [
    ("1.65.5", True), ("1.85.1", True), ("1.85.0rc1", True), ("1.86.0", False),
    ("2.0.0", False), (None, False)])
def test_the_client_experiment_only_on_measured_grpcio_versions(version, legacy, monkeypatch):
    monkeypatch.setattr(grpc_env, "grpcio_version", lambda: version)
    env: dict[str, str] = {}
    grpc_env.apply(env)
    assert ("GRPC_EXPERIMENTS" in env) == legacy and env["GRPC_VERBOSITY"] == "ERROR"


CONNECT = """
import sys
sys.argv = ["tpumon"]
import click
from tpumon.cli import main
main.get_command(click.Context(main), "agent")  # what running `tpumon agent` loads first
import grpc
channel = grpc.insecure_channel("127.0.0.1:1")
try:
    grpc.channel_ready_future(channel).result(timeout=0.5)
except grpc.FutureTimeoutError:
    pass
"""


def tcp_trace(**env: str) -> str:
    """stderr of a fresh interpreter connecting the way the agent does, gRPC's TCP
    tracer on: the legacy client logs from tcp_client_posix.cc, the EventEngine not."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    full.update(GRPC_VERBOSITY="DEBUG", GRPC_TRACE="tcp", **env)
    return subprocess.run([sys.executable, "-c", CONNECT], env=full, capture_output=True,
                          text=True, timeout=60).stderr


@pytest.mark.e2e
@pytest.mark.skipif(
    grpc_env._version(grpc_env.grpcio_version() or "0") > grpc_env.LEGACY_CLIENT_UNTIL,
    reason="installed grpcio is newer than the client setting was measured on")
def test_tpumon_commands_take_effect_before_grpc_reads_its_environment():
    assert "tcp_client_posix.cc" in tcp_trace()
    assert "tcp_client_posix.cc" not in tcp_trace(GRPC_EXPERIMENTS="event_engine_client")
