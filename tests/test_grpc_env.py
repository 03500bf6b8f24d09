"""tpumon's gRPC defaults (tpumon/agent/grpc_env.py): set before grpc is imported, operator's
values kept; and the agent itself never imports grpcio (its client is libcurl's HTTP/2)."""

import os
import subprocess
import sys

from tpumon.agent import grpc_env


def test_defaults_are_set_only_where_the_operator_set_nothing():
    env: dict[str, str] = {}
    grpc_env.apply(env)
    assert env == {"GRPC_VERBOSITY": "ERROR"}
    mine = {"GRPC_VERBOSITY": "DEBUG"}
    grpc_env.apply(mine)
    assert mine == {"GRPC_VERBOSITY": "DEBUG"}


AGENT = """
import sys
sys.argv = ["tpumon"]
import click
from tpumon.cli import main
main.get_command(click.Context(main), "agent")  # what running `tpumon agent` loads first
import tpumon.agent.loop, tpumon.agent.bootstrap
import tpumon.sources.tpu_runtime, tpumon.sources.pod_resources
import os
print(os.environ.get("GRPC_VERBOSITY"), "grpc" in sys.modules, "tpu_info.metrics" in sys.modules)
"""


def test_the_agent_sets_verbosity_for_its_simulator_and_never_loads_grpcio():
    """grpcio is ~16 MiB of RSS and 6-7 threads the agent has no use for (docs/benchmarks.md);
    its simulator child (grpcio's server) inherits the verbosity."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    out = subprocess.run([sys.executable, "-c", AGENT], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert out == ["ERROR", "False", "False"]
