"""The /metrics exposition of a fixed poll state, compared with a checked-in file (as
node_exporter's end-to-end test keeps its fixtures/e2e-output.txt): a renamed family, a
changed label, help text or value format shows up here as a diff to review.

The state is made by hand, with no clock, pid or host in it, and rendered by the same
collectors and text format the agent serves. After a deliberate change, regenerate the
expected file and review its diff:

    TPUMON_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_metrics_golden.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from tpumon.detect import Assessment, Verdict
from tpumon.sources.runtime_server import RuntimeServer
from tpumon.diagnose.counts import CountTrend
from tpumon.metrics.collectors import register_collectors
from tpumon.common.identity import Identity
from tpumon.diagnose.job_ends import JobEnd, JobView
from tpumon.notify.health import ChannelHealth, NotifierHealth
from tpumon.diagnose.processes import ProcessState
from tpumon.common.samples import ChipSample, HostSample, ProcessSample, RuntimeReading
from tpumon.sources.chips import inventory_for
from tpumon.sources.health import SourceHealth
from tpumon.sources.reports import ProcessReport, ReporterReading
from tpumon.state import PollState
from tpumon.store.writer import StoreHealth

GOLDEN = Path(__file__).parent / "golden" / "metrics.txt"
T = 1_790_000_000.0  # a fixed poll time
GiB = 2**30


STORE = StoreHealth("/var/lib/tpumon/history.sqlite", up=True, polls_written_total=99,
                    size_bytes=3 * 2**20)
NOTIFIER = NotifierHealth(
    channels=(ChannelHealth("slack", False, 1, 4, {"network": 2}, {}, "timed out", T - 60),
              ChannelHealth("pagerduty", True, 0, 1, {}, {"rejected": 1}, None, T - 600)),
    active=({"name": "TPUMonHBMLeak", "severity": "critical", "subject": "chip 0"},))


def fixed_snapshot() -> PollState:
    """Four v4 chips: one leaking (with a forecast), one warming up, one healthy, one the
    runtime did not answer for; a host with one training process. The history store and
    the notifiers (STORE, NOTIFIER) are read from their own health, as the agent does."""
    inventory = inventory_for("v4", 4)
    chips = {str(i): ChipSample(str(i), used, 32 * GiB, duty, i, 8431)
             for i, used, duty in ((0, 20 * GiB, 0.93), (1, 12 * GiB, 0.91),
                                   (2, 9 * GiB, None))}
    leak = Assessment(Verdict.LEAK, "floor grows 150.0 KB/step; OOM in 20.0 h",
                      floor_bytes=18 * GiB, transient_bytes=2 * GiB, total_bytes=32 * GiB,
                      slope_bytes_per_second=170_000.0, slope_bytes_per_second_low=150_000.0,
                      slope_bytes_per_second_high=190_000.0, slope_bytes_per_step=150_000.0,
                      predicted_oom_time=T + 72_000, predicted_oom_step=480_000,
                      window_start=T - 7200, window_seconds=7200.0, z=9.5)
    return PollState(
        time=T,
        identity=Identity(host="t1v-n-golden-w-0", worker="0", accelerator_type="v4-8",
                          slice="golden"),
        inventory=inventory,
        runtime=RuntimeReading(T, chips, missing=("3",)),
        host=HostSample(T, 400 * GiB, 300 * GiB, 100 * GiB,
                        (ProcessSample(4242, "python3", 8 * GiB, ("0", "1", "2")),)),
        owners={"0": 4242, "1": 4242, "2": 4242},
        health=(SourceHealth("runtime", True, None, T, 100, 2, 0.004),
                SourceHealth("host", True, None, T, 100, 0, 0.001)),
        runtime_ports_up={8431: True, 8432: False},
        runtime_servers={8431: RuntimeServer(4242, 1000, True, "the chips' holder"),
                         8432: RuntimeServer(777, 1001, False, "neither root nor the chips' "
                                             "holder: pid 4242 of uid 1000")},
        assessments={"0": leak,
                      "1": Assessment(Verdict.WARMING_UP, "warming up"),
                      "2": Assessment(Verdict.OK, "flat", floor_bytes=8 * GiB,
                                      slope_bytes_per_second=0.0)},
        runtime_malformed_total=1,
        polls_total=100,
        **reporting(),
    )


def reporting() -> dict:
    """A torch_xla process reporting its steps (live tensors flat, RSS growing 256 KiB a
    step: a host leak) on chips 0-2, another that has exited, and one job end."""
    growing = CountTrend(True, 262_144.0, 250_000.0, 8.0, 200, 4000, "+262144.00 per step")
    flat = CountTrend(False, 0.0, 0.0, 0.0, 200, 4000, "flat")
    running = ProcessReport(4242, 1000, "torch_xla", 51_234, T - 1, T - 0.5, rank=0,
                            ordinal=0, live=1_234, compiles_cached=40, compiles_uncached=3,
                            rss=8 * GiB, steps_per_second=2.5, snapshots=True,
                            framework_version="2.9.0")
    gone = ProcessReport(4100, 1000, "jax", 900, T - 200, T - 200, live=10, rss=GiB,
                         exited=True)
    processes = {4242: ProcessState(running, flat, flat, growing, 300 * GiB),
                 4100: ProcessState(gone, CountTrend(False), CountTrend(False))}
    view = JobView(4000, T - 3600, "jax", 20_417, 3.0, (), 290 * GiB, 400 * GiB)
    return {"reporter": ReporterReading({4242: running, 4100: gone}, {}, 5_000,
                                        {"malformed": 2, "forbidden": 0}),
            "processes": processes, "chip_processes": {"0": 4242, "1": 4242, "2": 4242},
            "chip_steps": {"0": 51_234, "1": 51_234, "2": 51_234},
            "job_ends": (JobEnd(T - 3000, view, "host_oom",
                                "the kernel killed pid 4000 for memory"),),
            "job_ends_total": {"host_oom": 1}}


def exposition() -> str:
    registry = CollectorRegistry()
    register_collectors(registry, fixed_snapshot, store_health=lambda: STORE,
                        notifier_health=lambda: NOTIFIER)
    text = generate_latest(registry).decode()
    # the build's versions are the only values that come from the installation
    return re.sub(r'^(tpumon_build_info)\{.*\}', r'\1{VERSIONS}', text, flags=re.M)


def test_metrics_exposition_matches_the_golden_file():
    got = exposition()
    if os.environ.get("TPUMON_UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), (
        "the /metrics exposition changed; if that is meant, regenerate "
        f"{GOLDEN} (see this module's docstring) and review its diff")
