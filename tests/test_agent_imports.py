"""The agent imports only what it runs: page templates (jinja2), web configuration parsing
(PyYAML), basic auth (bcrypt) and the simulator's server and workloads (run in the
simulator's own process) are loaded when first needed, each worth 0.4-1.9 MiB of the
agent's RSS (docs/benchmarks.md, issue 25); so are importlib.metadata (tpu-info's version
is read from its own METADATA), statistics, tomli_w and difflib; and the notification
delivery code (notifier, outbox, HTTP posts, Slack and PagerDuty channels, 0.3-0.6 MiB) where
no channel is configured."""

from __future__ import annotations

import subprocess
import sys

ON_DEMAND = ("jinja2", "yaml", "bcrypt", "tpumon.sim.server", "tpumon.sim.workload",
             "tpumon.sim.scenarios",
             "tpumon.sim.pod", "importlib.metadata", "statistics", "tomli_w", "difflib",
             "tpumon.notify.notifier", "tpumon.notify.outbox", "tpumon.notify.post",
             "tpumon.notify.slack", "tpumon.notify.pagerduty")

PROBE = f"""
import sys
import tpumon.cli, tpumon.cli.agent, tpumon.agent.bootstrap, tpumon.web.http
from tpumon.agent.bootstrap import notification_channels
from tpumon.common.config import load_config
from tpumon.metrics.collectors import BuildInfoCollector
config = load_config(None, env={{}})
assert notification_channels(config, env={{}}) == []  # no Slack, no PagerDuty
BuildInfoCollector(lambda: None)  # tpu-info's version, for tpumon_build_info
print(sorted(m for m in {ON_DEMAND!r} if m in sys.modules))
"""


def test_the_agent_modules_leave_on_demand_libraries_unloaded():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_a_page_and_a_web_config_still_load_them(tmp_path):
    from tpumon.web.http import _templates
    from tpumon.web.webconfig.live import load_web_config
    assert _templates().get_template("index.html.j2") is not None
    path = tmp_path / "web.yml"
    path.write_text("http_server_config:\n  http2: true\n")
    assert load_web_config(path).http2 is True


DETECTOR_PROBE = """
import sys
from tpumon.detect import ChipDetector
from tpumon.detect.verdict import DetectorSettings
detector = ChipDetector(DetectorSettings())
for i in range(30):
    detector.update((1000.0 + i,), (float(i),), (2.0**30 + i * 4096,), (2.0**34,))
print(detector.width, "numpy.ma" in sys.modules)
"""


def test_a_detector_settling_its_bucket_width_leaves_numpy_ma_unloaded():
    """np.median imports numpy.ma (~0.65 MiB): the detector's one median is robust.median."""
    width, masked = subprocess.run([sys.executable, "-c", DETECTOR_PROBE], capture_output=True,
                                   text=True, check=True).stdout.split()
    assert float(width) > 0
    assert masked == "False"


def test_a_version_read_beside_its_package_is_what_importlib_metadata_says():
    from importlib import metadata

    from tpumon import _installed_beside, package_version
    assert _installed_beside("tpu-info") == metadata.version("tpu-info")
    assert package_version("grpcio") == metadata.version("grpcio")
    assert package_version("no-such-distribution") == "unknown"
