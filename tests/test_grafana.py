"""The Grafana dashboards (grafana/): well-formed JSON models, every query valid PromQL once
Grafana's variables are substituted, drill-down links that carry the variables, and, end to
end, every query of both dashboards returns data from a real Prometheus scraping a simulated
multi-host pod.

The end-to-end test runs a v4-32 slice of 4 workers x 4 chips on loopback:

    4 x tpumon agent --simulate (w-0, w-1, w-3 healthy; w-2 leaking, time accelerated)
      + a fake instrumented training process reporting live tensors and compiles to w-2
        -> prometheus (deploy/prometheus/prometheus.yml and tpumon.rules.yml; 1 s scrapes)

then asks Prometheus every panel query, variable query and annotation query, with the
variables set as a person looking at the pod (all hosts) and drilling down to the leaking
host (all chips) would set them. Last, it stops one agent: the pod dashboard must still
count it as the slice's (down), and list its TPUMonAgentDown alert with the slice's alerts,
though Prometheus' `up` and that alert carry no slice label.

What the copies change: the targets, 1 s scrape and evaluation intervals, no Alertmanager,
and the `for:` of TPUMonHBMLeakSuspected and TPUMonAgentDown (1 s instead of 1 and 5
minutes, so that the alert panels have alerts within the test's minute).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

import promql_parser
import pytest
import yaml

from tools import (DENSE_POLLS, FakeReporter, Processes, clean_env, free_port, get,
                   prometheus_config, ready, require_tool, wait_for)

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
DASHBOARDS = {"tpumon-pod": GRAFANA / "dashboards/tpumon-pod.json",
              "tpumon-host": GRAFANA / "dashboards/tpumon-host.json"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

SLICE = "test-pod"
ACCELERATOR = "v4-32"
HOSTS = [f"t1v-n-pod-w-{n}" for n in range(4)]
LEAKING = 2  # the worker whose job leaks
CHIPS = ["0", "1", "2", "3"]
# Shorter `for:` in the copy of the rules (1 and 5 minutes as shipped), so that the alert
# panels have alerts to show within the test's minute.
FOR = {"TPUMonHBMLeakSuspected": "1s", "TPUMonAgentDown": "1s"}

# Grafana's global variables, as it would set them for a range query over the last two
# minutes with a 2 s step. $__rate_interval is 4x the scrape interval at least (here 1 s);
# 30 s is more, so that a scrape delayed on a loaded machine never leaves rate() empty.
BUILTINS = {"__interval": "2s", "__interval_ms": "2000", "__rate_interval": "30s",
            "__range": "2m", "__range_s": "120", "__range_ms": "120000"}

# The variables as the e2e test sets them: the pod with all its hosts selected, and the
# leaking host with all its chips. Multi-value variables become a regex alternation, as
# Grafana formats them for Prometheus.
VALUES = {
    "tpumon-pod": {"datasource": "prometheus", "slice": SLICE, "host": HOSTS},
    "tpumon-host": {"datasource": "prometheus", "slice": SLICE, "host": HOSTS[LEAKING],
                    "chip": CHIPS},
}

VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)(?::\w+)?\]\]|\$(\w+)")
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$", re.S)


# ------------------------------------------------------------------ the dashboards' model


def load(uid: str) -> dict:
    return json.loads(DASHBOARDS[uid].read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, the ones inside collapsed rows too."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def substitute(expr: str, values: dict[str, str | list[str]]) -> str:
    """Grafana's interpolation of $var, ${var}, ${var:format} and [[var]]; a multi-value
    variable becomes `a|b` (what Grafana writes inside =~"..." for Prometheus). A variable
    the dashboard does not define fails: a typo would leave the panel empty."""
    def one(match: re.Match) -> str:
        name = next(g for g in match.groups() if g)
        if name in BUILTINS:
            return BUILTINS[name]
        assert name in values, f"${name} is not a variable of the dashboard: {expr}"
        value = values[name]
        return "|".join(value) if isinstance(value, list) else value
    return VARIABLE.sub(one, expr)


class Query(NamedTuple):
    where: str   # dashboard, panel and query, for messages
    expr: str    # with the variables substituted
    kind: str    # "range" or "instant" (as the panel asks Prometheus), or "variable"
    title: str = ""  # the panel's, for a panel target
    label: str = ""  # the label a variable lists


def queries(uid: str, values: dict | None = None) -> list[Query]:
    """Every query of the dashboard, variables substituted: panel targets, annotations
    (range queries) and variables (the series selector of label_values)."""
    dashboard = load(uid)
    values = dict(values or VALUES[uid])
    out = []
    for panel in all_panels(dashboard):
        panel_values = dict(values)
        if panel.get("repeat"):  # Grafana repeats the panel with one value each
            value = values[panel["repeat"]]
            panel_values[panel["repeat"]] = value[0] if isinstance(value, list) else value
        for target in panel.get("targets", []):
            kind = "instant" if target.get("instant") and not target.get("range") else "range"
            out.append(Query(f"{uid} panel {panel['id']} {panel['title']!r} {target['refId']}",
                             substitute(target["expr"], panel_values), kind, panel["title"]))
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            out.append(Query(f"{uid} annotation {annotation['name']!r}",
                             substitute(annotation["expr"], values), "range"))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = LABEL_VALUES.match(var["query"])
            assert match, f"{uid} variable {var['name']}: not label_values(...): {var['query']}"
            out.append(Query(f"{uid} variable {var['name']}", substitute(match.group(1), values),
                             "variable", label=match.group(2)))
    return out


def panel_query(uid: str, title: str) -> Query:
    """The first query of the panel with this title."""
    return next(q for q in queries(uid) if q.title == title)


def walk(node, path=""):
    """Every (path, dict) in a JSON document."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def documented_metrics() -> set[str]:
    doc = (ROOT / "docs/metrics.md").read_text()
    names = set(re.findall(r"^\| `(tpumon_\w+)` \|", doc, re.M))
    names |= {f"{h}_{suffix}" for h in re.findall(r"^\| `(tpumon_\w+)` \| histogram \|", doc, re.M)
              for suffix in ("bucket", "sum", "count")}  # a histogram's series
    rules = yaml.safe_load((ROOT / "deploy/prometheus/tpumon.rules.yml").read_text())
    names |= {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    return names | {"up", "ALERTS"}


# ------------------------------------------------------------------ static checks


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_dashboard_model_is_well_formed(uid):
    dashboard = load(uid)
    assert dashboard["uid"] == uid and dashboard["title"]
    assert dashboard["id"] is None  # importable anywhere
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert "tpumon" in dashboard["tags"]
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), f"duplicate panel titles: {titles}"
    assert all(isinstance(i, int) and i > 0 for i in ids)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert grid["h"] > 0 and grid["y"] >= 0, panel["title"]
        assert panel["title"], panel["id"]
        if panel["type"] == "row":
            assert not panel.get("targets")
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel.get("description"), f"{panel['title']}: say what the panel shows"
        targets = panel["targets"]
        assert targets, panel["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for t in targets:
            assert t["datasource"] == DATASOURCE, (panel["title"], t["refId"])
            assert t["expr"].strip(), (panel["title"], t["refId"])
    # No panel, target, variable or annotation names a datasource other than through
    # ${datasource} (the built-in Grafana annotation aside).
    for path, node in walk(dashboard):
        ds = node.get("datasource")
        if ds is None or path.startswith(".annotations.list[0]"):
            continue
        assert ds == DATASOURCE, f"{uid}{path}: datasource {ds!r}"


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_variables(uid):
    dashboard = load(uid)
    vars_ = variables(dashboard)
    expected = {"tpumon-pod": ["datasource", "slice", "host"],
                "tpumon-host": ["datasource", "slice", "host", "chip"]}[uid]
    assert list(vars_) == expected  # in this order: each one filters the next
    ds = vars_["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for name in expected[1:]:
        var = vars_[name]
        assert var["type"] == "query" and var["datasource"] == DATASOURCE
        assert var["refresh"] in (1, 2)  # on load / on time range change
        assert LABEL_VALUES.match(var["query"]).group(2) == name
    assert vars_["slice"]["query"] == "label_values(tpumon_hbm_used_bytes, slice)"
    assert '{slice="$slice"}' in vars_["host"]["query"]  # hosts of the chosen slice
    if uid == "tpumon-pod":
        assert vars_["host"]["multi"] and vars_["host"]["includeAll"]
    else:
        assert not vars_["host"]["multi"]  # one host to drill down to
        chip = vars_["chip"]
        assert chip["multi"] and chip["includeAll"]
        assert 'host="$host"' in chip["query"]


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_every_query_parses_as_promql(uid):
    for values in (VALUES[uid], {**VALUES[uid], **{
            k: ".*" for k, v in variables(load(uid)).items() if v.get("includeAll")}}):
        found = queries(uid, values)
        assert len(found) > 10
        for q in found:
            assert "$" not in q.expr, f"{q.where}: not substituted: {q.expr}"
            try:
                promql_parser.parse(q.expr)
            except ValueError as exc:
                pytest.fail(f"{q.where}: {exc}\n{q.expr}")


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_queries_name_only_metrics_that_exist(uid):
    known = documented_metrics()
    for where, expr, *_ in queries(uid):
        without_strings = re.sub(r'"[^"]*"', '""', expr)
        for name in re.findall(r"(?<![\w:])((?:[a-z_]+:)?tpumon_[\w:]+|ALERTS|up)(?![\w:])",
                               without_strings):
            assert name in known, f"{where}: {name} is neither in docs/metrics.md nor a rule"


def test_dashboards_show_what_the_issue_asks_for():
    """Each required view is there, by the series it must read."""
    pod = " ".join(q.expr for q in queries("tpumon-pod"))
    for needle in ("slice:tpumon_time_to_oom_seconds:min", "slice:tpumon_leaking_chips:count",
                   "tpumon_hbm_used_bytes", "tpumon_hbm_total_bytes",
                   "tpumon_process_steps_per_second",
                   "host:tpumon_hbm_used_ratio:skew_from_slice_median",
                   "slice:tpumon_hbm_used_ratio:skew", 'up{job="tpumon"}', "tpumon_source_up",
                   'ALERTS{alertname=~"TPUMon.*"'):
        assert needle in pod, needle
    host = " ".join(q.expr for q in queries("tpumon-host"))
    for needle in ("tpumon_hbm_floor_bytes", "tpumon_hbm_growth_bytes_per_second",
                   "tpumon_oom_predicted_timestamp_seconds", "tpumon_oom_predicted_step",
                   "tpumon_leak_verdict", "tpumon_hbm_growth_bytes_per_step",
                   "tpumon_tensorcore_duty_cycle_ratio", "tpumon_process_step",
                   "tpumon_process_live_tensors", 'cache="miss"',
                   "tpumon_training_process_resident_memory_bytes",
                   "tpumon_host_memory_used_bytes",
                   # the runtime's other metrics (issue 25)
                   "tpumon_hbm_bandwidth_utilization_ratio", "tpumon_tensorcore_idle_seconds",
                   "tpumon_hlo_queue_size", "rate(tpumon_hlo_execution_seconds_bucket",
                   "rate(tpumon_dcn_transfer_latency_seconds_bucket",
                   "tpumon_collective_end_to_end_latency_seconds_bucket",
                   "host:tpumon_dcn_transfer_latency_seconds:ratio_to_slice_median",
                   "host:tpumon_hlo_execution_seconds:ratio_to_slice_median"):
        assert needle in host, needle
    types = {p["type"] for p in all_panels(load("tpumon-pod"))}
    assert {"stat", "table", "timeseries", "state-timeline"} <= types
    # The hosts x chips view: one row per host, one column per chip.
    [matrix] = [p for p in all_panels(load("tpumon-pod"))
                if any(t["id"] == "groupingToMatrix" for t in p.get("transformations", []))]
    [transform] = matrix["transformations"]
    assert transform["options"]["rowField"] == "host"
    assert transform["options"]["columnField"] == "chip"
    # Alerts of the host as annotations on the drill-down.
    [annotation] = [a for a in load("tpumon-host")["annotations"]["list"] if "expr" in a]
    assert annotation["enable"] and annotation["datasource"] == DATASOURCE
    assert re.search(r'ALERTS\{alertname=~"TPUMon\.\*".*host="\$host"', annotation["expr"])


def links_of(dashboard: dict) -> list[tuple[str, dict]]:
    out = []
    for panel in all_panels(dashboard):
        config = panel.get("fieldConfig", {})
        for link in config.get("defaults", {}).get("links", []):
            out.append((panel["title"], link))
        for override in config.get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "links":
                    out.extend((panel["title"], link) for link in prop["value"])
    return out


def test_pod_dashboard_links_to_the_host_dashboard_with_the_variables():
    pod, host = load("tpumon-pod"), load("tpumon-host")
    host_vars = set(variables(host))
    links = links_of(pod)
    assert len({title for title, _ in links}) >= 5, links
    for title, link in links:
        url = link["url"]
        path, _, query = url.partition("?")
        assert path == f"/d/{host['uid']}/tpumon-host", (title, url)
        params = query.split("&")
        assert "${datasource:queryparam}" in params and "${slice:queryparam}" in params, url
        assert "${__url_time_range}" in params, (title, url)
        host_param = [p for p in params if p.startswith("var-host=")]
        assert len(host_param) == 1 and host_param[0] != "var-host=", (title, url)
        for param in params:
            if param.startswith("var-"):
                assert param[4:].partition("=")[0] in host_vars, (title, url)
    # The matrix cells and the leaking-chips table open the chip itself.
    assert any("var-chip=" in link["url"] for _, link in links)
    # Dashboard links both ways.
    assert any(link["url"].startswith("/d/tpumon-host/") and link["includeVars"]
               for link in pod["links"])
    assert any(link["url"].startswith("/d/tpumon-pod/") for link in host["links"])


def test_provisioning_files():
    [datasource] = yaml.safe_load(
        (GRAFANA / "provisioning/datasources/tpumon.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["access"] == "proxy"
    assert datasource["url"] == "http://prometheus:9090"
    config = yaml.safe_load((GRAFANA / "provisioning/dashboards/tpumon.yml").read_text())
    assert config["apiVersion"] == 1
    [provider] = config["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    readme = (GRAFANA / "README.md").read_text()
    assert path in readme
    for name in ("tpumon-pod.json", "tpumon-host.json", "/api/dashboards/db",
                 "provisioning/datasources/tpumon.yml", "provisioning/dashboards/tpumon.yml"):
        assert name in readme, name


# ------------------------------------------------------------------ end to end


class TrainingProcess(FakeReporter):
    """An instrumented training loop as the agent sees it through its reporter socket:
    keeps one more tensor alive every step and recompiles every 5 steps."""

    def framework_fields(self) -> dict:
        fields = super().framework_fields()
        step = self._last_step
        fields.update(live=100 + step, compiles={"cached": 10 + step, "uncached": 2 + step // 5})
        return fields

    def run(self, stop: threading.Event) -> None:
        self._last_step = 0
        while not stop.wait(0.2):
            self._last_step += 1
            self.step(self._last_step)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()
    assert all(p.poll() is not None for p in procs.procs.values())


@pytest.fixture
def training(tmp_path):
    """Starts a TrainingProcess thread reporting to a socket; stopped at teardown."""
    stop = threading.Event()
    threads = []

    def start(socket: Path) -> None:
        reporter = TrainingProcess(socket=str(socket), min_interval=0)
        thread = threading.Thread(target=reporter.run, args=(stop,), daemon=True)
        thread.start()
        threads.append((thread, reporter))

    yield start
    stop.set()
    for thread, reporter in threads:
        thread.join(5)
        reporter.close()


@pytest.mark.e2e
@pytest.mark.timeout(300)  # about a minute and a half; the waits below bound it when loaded
def test_every_query_returns_data_from_a_simulated_pod(tmp_path, processes, training):
    prometheus = require_tool("prometheus")
    ports = [free_port() for _ in HOSTS]
    prom_port = free_port()
    base_env = clean_env() | DENSE_POLLS
    for worker, (host, port) in enumerate(zip(HOSTS, ports, strict=True)):
        env = {**base_env, "TPUMON_IDENTITY_HOSTNAME": host,
               "TPUMON_IDENTITY_WORKER": str(worker), "TPUMON_IDENTITY_SLICE": SLICE,
               "TPUMON_IDENTITY_ACCELERATOR_TYPE": ACCELERATOR,
               "TPUMON_IDENTITY_METADATA": "off", "TPUMON_SIMULATOR_CHIPS": str(len(CHIPS))}
        # The leaking worker runs 480x (a poll every 0.1 s is 48 simulated seconds, under
        # the detector's 2-minute gap), so its detector calls the leak within a minute; the
        # healthy ones run 30x and poll every second, to leave the 2 cores to it.
        leaking = worker == LEAKING
        processes.start(f"agent-w{worker}", [
            sys.executable, "-m", "tpumon", "agent", "--simulate",
            "--scenario", "linear-leak" if leaking else "healthy",
            "--acceleration", "480" if leaking else "30",
            "--poll-interval", "0.1" if leaking else "1",
            "--listen-address", f"127.0.0.1:{port}",
            "--reporter-socket", str(tmp_path / f"reporter-w{worker}.sock")], env=env)
    agents = [f"127.0.0.1:{port}" for port in ports]
    processes.start("prometheus", [
        prometheus, f"--config.file={prometheus_config(tmp_path, agents, FOR)}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
    api = f"http://127.0.0.1:{prom_port}/api/v1"

    def up() -> bool:
        processes.check_alive()
        return (all(ready(f"http://{a}/metrics") for a in agents)
                and ready(f"http://127.0.0.1:{prom_port}/-/ready"))

    wait_for(up, timeout=60, interval=0.5)
    # The training loop on the leaking host, once its agent listens on the socket.
    training(tmp_path / f"reporter-w{LEAKING}.sock")

    def ask(expr: str, kind: str, now: float) -> list:
        if kind == "instant":
            url = f"{api}/query?" + urllib.parse.urlencode({"query": expr, "time": now})
        else:
            url = f"{api}/query_range?" + urllib.parse.urlencode(
                {"query": expr, "start": now - 120, "end": now, "step": 2})
        body = json.loads(get(url))
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def label_values(selector: str, label: str, now: float) -> list[str]:
        """What Grafana asks Prometheus for label_values(selector, label)."""
        url = f"{api}/label/{label}/values?" + urllib.parse.urlencode(
            {"match[]": selector, "start": now - 120, "end": now})
        return json.loads(get(url))["data"]

    everything = [q for uid in DASHBOARDS for q in queries(uid)]

    # Every question of one check is asked of the same instant, as one dashboard refresh
    # is: the simulated leaking job OOMs ~165 s after its agent starts (480x), and on a
    # loaded machine that can fall between two questions asked at their own "now".
    def answer(query: Query, now: float) -> list:
        return (label_values(query.expr, query.label, now) if query.kind == "variable"
                else ask(query.expr, query.kind, now))

    # A refresh of the whole pod: every agent scraped and its runtime answering at that
    # instant. On a loaded host a scrape can run past its 1 s timeout (or a poll past its
    # runtime deadline), and then that agent's series are stale, or its chips unanswered,
    # for a moment: a gap a dashboard shows as it should, but not the pod this test reads.
    def gaps(now: float) -> list[str]:
        processes.check_alive()
        down = [f"scrape failed: {s['metric']['instance']}"
                for s in ask("up", "instant", now) if s["value"][1] != "1"]
        runtime = [f"runtime not answering: {s['metric']['host']}"
                   for s in ask('tpumon_source_up{source="tpu_runtime"}', "instant", now)
                   if s["value"][1] != "1"]
        return down + runtime + [f"{q.where}: {q.expr}" for q in everything
                                 if not answer(q, now)]

    def whole_pod() -> float | None:
        now = time.time()
        return None if gaps(now) else now

    try:
        at = wait_for(whole_pod, timeout=180, interval=2)
    except AssertionError:
        still = "\n".join(gaps(time.time()))
        logs = "".join(f"--- {n}.log\n{processes.log(n)[-1500:]}\n" for n in processes.procs)
        raise AssertionError(f"no whole refresh of the pod within 180 s:\n{still}\n{logs}"
                             ) from None

    # The variables list the pod as a person picking it would see it.
    assert label_values("tpumon_hbm_used_bytes", "slice", at) == [SLICE]
    assert label_values(f'tpumon_hbm_used_bytes{{slice="{SLICE}"}}', "host", at) == HOSTS
    assert label_values(f'tpumon_hbm_used_bytes{{slice="{SLICE}",host="{HOSTS[LEAKING]}"}}',
                        "chip", at) == CHIPS
    # Answers that say what they should: 16 cells in the hosts x chips matrix, the leak
    # only on the leaking host, its alert firing.
    matrix = answer(panel_query("tpumon-pod", "HBM used / capacity, hosts × chips"), at)
    assert sorted((s["metric"]["host"], s["metric"]["chip"]) for s in matrix) == \
        [(h, c) for h in HOSTS for c in CHIPS]
    assert all(0 <= float(s["value"][1]) <= 1 for s in matrix)
    leaking = answer(panel_query("tpumon-pod", "Leaking chips, nearest OOM first"), at)
    assert {s["metric"]["host"] for s in leaking} == {HOSTS[LEAKING]}
    alerts = answer(panel_query("tpumon-pod", "Firing alerts"), at)
    assert {(a["metric"]["alertname"], a["metric"]["host"]) for a in alerts} == \
        {("TPUMonHBMLeakSuspected", HOSTS[LEAKING])}
    processes.check_alive()

    # An agent goes away: it stays the slice's, as down, and its TPUMonAgentDown alert
    # (labels: instance, job) is listed with the slice's alerts and counted with them.
    gone = processes.procs["agent-w0"]
    gone.terminate()
    gone.wait(timeout=30)

    def agent_down_listed() -> tuple[float, list] | None:
        now = time.time()
        listed = answer(panel_query("tpumon-pod", "Firing alerts"), now)
        down = [a for a in listed if a["metric"]["alertname"] == "TPUMonAgentDown"]
        return (now, listed) if down else None

    at, listed = wait_for(agent_down_listed, timeout=60, interval=1)
    [alert] = [a for a in listed if a["metric"]["alertname"] == "TPUMonAgentDown"]
    assert alert["metric"]["instance"] == agents[0]
    # The count is of the same alerts as the list (the leak's, one per chip, unless its job
    # has OOMed by then, and this one).
    [count] = answer(panel_query("tpumon-pod", "Alerts firing"), at)
    assert float(count["value"][1]) == len(listed)
    up, known = (answer(q, at) for q in queries("tpumon-pod") if q.title == "Agents up")
    assert (float(up[0]["value"][1]), float(known[0]["value"][1])) == (3, 4)
