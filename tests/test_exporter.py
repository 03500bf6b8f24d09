"""The exporter scraped over real HTTP, and its output checked by the real promtool."""

import gzip
import os
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_runtime import V4_TOTAL, chips_metrics
from tools import PROMETHEUS_HEADERS, FakeReporter, require_tool, wait_for
from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.web.http import ListenError, MetricsServer
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import Identity
from tpumon.sources.chips import inventory_for
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from tpumon.sources.reports import ReporterSocket
from tpumon.state import AgentState
from tpumon.store.database import Retention, open_database
from tpumon.store.writer import StoreWriter

IDENT = Identity(host="t1v-n-0a1b2c3d-w-3", worker="3", accelerator_type="v4-32", slice="pod-a")


@pytest.fixture
def served(runtime_servers, tmp_path):
    """An agent with a history store that polled a fake runtime once, serving on a free
    loopback port."""
    server = runtime_servers(chips_metrics({0: 2**30, 1: 2 * 2**30, 3: 3 * 2**30}, duty=50.0))
    inventory = inventory_for("v4", 4)
    state = AgentState(IDENT, inventory)
    registry = build_registry(lambda: state.current)
    runtime = TpuRuntimeSource("127.0.0.1", [server.port], 1.0, inventory)
    owners = OwnerScanner(lambda: {"0": os.getpid(), "1": os.getpid()}, 60)
    store = StoreWriter(tmp_path, Retention(), open_database(tmp_path, Retention()))
    store.start()
    reporters = ReporterSocket(tmp_path / "reporter.sock")
    reporters.start()
    sender = FakeReporter(socket=str(reporters.path), min_interval=0)
    for step in range(3):
        sender.step(step)
    wait_for(lambda: reporters.poll().reports_total == 3, 5)
    agent = Agent(AgentInputs(state, runtime, owners, 1.0, registry, store=store,
                              reporters=reporters))
    agent.poll_once()
    http = MetricsServer("127.0.0.1:0")
    host, port = http.start()
    http.attach(registry, lambda: state.current)
    yield SimpleNamespace(base=f"http://{host}:{port}", agent=agent, runtime=server)
    http.stop()
    runtime.close()
    store.stop()
    reporters.stop()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(parsed, name, **labels):
    matches = [v for (n, ls), v in parsed.items()
               if n == name and all(dict(ls).get(k) == want for k, want in labels.items())]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} matches"
    return matches[0]


def test_metrics_over_http(served):
    status, ctype, text = get(served.base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    m = samples(text)
    assert value(m, "tpumon_hbm_used_bytes", chip="1") == 2 * 2**30
    assert value(m, "tpumon_hbm_total_bytes", chip="3") == V4_TOTAL
    assert value(m, "tpumon_tensorcore_duty_cycle_ratio", chip="0") == 0.5
    assert value(m, "tpumon_chip_up", chip="3") == 1
    assert value(m, "tpumon_chip_up", chip="2") == 0  # expected but missing: reported, not dropped
    assert not [k for k in m if k[0] == "tpumon_hbm_used_bytes" and dict(k[1])["chip"] == "2"]
    assert value(m, "tpumon_chips_expected") == 4
    assert value(m, "tpumon_source_up", source="tpu_runtime") == 1
    assert value(m, "tpumon_source_polls_total", source="host") == 1
    assert value(m, "tpumon_chip_owner_info", chip="0", pid=str(os.getpid())) == 1
    rss = value(m, "tpumon_training_process_resident_memory_bytes", pid=str(os.getpid()))
    assert rss > 10 * 2**20
    assert value(m, "tpumon_host_memory_total_bytes") > value(
        m, "tpumon_host_memory_available_bytes")
    assert value(m, "tpumon_build_info", version=__import__("tpumon").__version__) == 1
    assert value(m, "tpumon_poll_duration_seconds_count") == 1
    # every tpumon series carries the identity labels
    for (name, labels) in m:
        if name.startswith("tpumon_"):
            assert dict(labels)["worker"] == "3" and dict(labels)["slice"] == "pod-a", name


def test_prometheus_asking_for_openmetrics_gets_the_text_format(served):
    """What Prometheus 2.42 asks for: OpenMetrics first. It gets the text format (as from
    node_exporter), gzipped, the same families as a plain request."""
    request = urllib.request.Request(served.base + "/metrics", headers=PROMETHEUS_HEADERS)
    with urllib.request.urlopen(request, timeout=5) as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert r.headers["Content-Encoding"] == "gzip"
        text = gzip.decompress(r.read()).decode()
    assert "# EOF" not in text
    assert samples(text).keys() == samples(get(served.base + "/metrics")[2]).keys()


def test_runtime_down_is_exported_as_state(served):
    served.runtime.stop()  # the job ends: nothing listens any more
    served.agent.poll_once()
    m = samples(get(served.base + "/metrics")[2])
    assert value(m, "tpumon_source_up", source="tpu_runtime") == 0
    assert value(m, "tpumon_source_errors_total", source="tpu_runtime") == 1
    assert value(m, "tpumon_chip_up", chip="0") == 0
    assert not [k for k in m if k[0] == "tpumon_hbm_used_bytes"]


@pytest.mark.e2e
def test_promtool_check_metrics_is_clean(served):
    text = get(served.base + "/metrics")[2]
    result = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=30)
    assert result.returncode == 0 and result.stdout + result.stderr == "", \
        result.stdout + result.stderr


def test_landing_page_and_health(served):
    base = served.base
    status, ctype, body = get(base + "/")
    assert status == 200 and "text/html" in ctype
    assert "href='/metrics'" in body and "worker=3" in body and "no data" in body
    # it follows the polls by itself, and shows growth and time to OOM as status does
    assert "<meta http-equiv='refresh' content='10'>" in body
    assert "<th>growth</th><th>OOM in</th>" in body
    assert get(base + "/-/healthy")[:1] == (200,)
    assert get(base + "/nope")[0] == 404


def test_port_in_use_is_one_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"127.0.0.1:{port}.*address already in use"):
            MetricsServer(f"127.0.0.1:{port}").start()


def test_serves_503_until_attached():
    http = MetricsServer("127.0.0.1:0")
    host, port = http.start()
    try:
        assert get(f"http://{host}:{port}/metrics")[0] == 503
    finally:
        http.stop()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("address", ["127.0.0.1:0", ":0", "0.0.0.0:0", "[::]:0"])
def test_stop_wakes_the_serving_loop_and_closes_the_port(address):
    """The serving loop sleeps in select() for an hour between requests (no idle wake-ups);
    stop() must wake it, whatever address it listens on, or the thread would live on."""
    if address.startswith("[") and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    before = set(threading.enumerate())
    http = MetricsServer(address)
    host, port = http.start()
    [served] = [t for t in threading.enumerate() if t.name == "tpumon-http" and t not in before]
    assert get(f"http://{'[::1]' if ':' in host else '127.0.0.1'}:{port}/metrics")[0] == 503
    http.stop()
    assert not served.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("::1" if ":" in host else "127.0.0.1", port), timeout=1)


def test_every_exported_metric_is_documented(served):
    doc = (Path(__file__).resolve().parent.parent / "docs/metrics.md").read_text()
    families = {f.name for f in text_string_to_metric_families(get(served.base + "/metrics")[2])}
    tpumon = {f for f in families if f.startswith("tpumon_")}
    assert len(tpumon) >= 15
    for family in tpumon:
        # the parser strips _total from counters; docs name the series as exported
        assert f"`{family}`" in doc or f"`{family}_total`" in doc, family
