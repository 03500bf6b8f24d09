"""The slice as the unit, end to end: `tpumon sim --hosts 4` (a v4-32 slice, a leak in
every chip), 4 agents attached to it (each with its history store and the PagerDuty
notifier pointed at one fake endpoint), and a real Prometheus with the shipped rules
scraping them. Checked, each wait bounded and saying what it waited for:

- `tpumon status --slice` lists the 16 chips, all leaking, and the slice's first OOM;
- the direct notifiers open one PagerDuty incident for the slice, not four;
- every query of the pod dashboard returns data;
- `tpumon analyze --prometheus`, with its default options (every sample Prometheus holds,
  none of its scrape interval given), alerts on every chip exactly where `tpumon analyze`
  of the agents' exported traces, cut to the polls Prometheus scraped, does; and, when it
  scraped every poll, where the whole traces do, within one scrape interval (simulated
  time). `report --prometheus` draws the slice's heatmap with no empty column;
- the same `analyze --prometheus` pointed at VictoriaMetrics, which Prometheus feeds by
  `remote_write` (a store that scales out, with Prometheus' query API), gives the same
  replay: the same samples, verdicts and alerts.

Time runs 240x; the agents poll every 0.2 s (48 simulated seconds apart) and Prometheus
scrapes every 0.1 s, so every poll has two scrapes to be seen by (a scrape missed on a
loaded host must not leave a hole: the detector's alert moves with the samples it gets),
and the replay sees what the agents saw: the alerts agree to the millisecond (the CSV's
rounding). About 85 s here, most of it waiting for the leak to be called on 16 chips.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import yaml

from fake_alert_apis import FakeAlertAPI
from test_grafana import FOR, queries
from tools import (TPUMON, Processes, clean_env, free_port, get, prometheus_config, ready,
                   require_tool, wait_for)
from tpumon.client.slice import ClientOptions, ask_all, build_view
from tpumon.sim.naming import worker_hostname

SLICE = "e2e-pod"
HOSTS = 4
ACCELERATION = 240
POLL = 0.2  # seconds: 48 simulated seconds
SCRAPE = 0.1  # seconds: each poll has two scrapes to be seen by
ROUTING_KEY = "R0UT1NGKEY0123456789012345678901"


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


def bounded(what: str, predicate, timeout: float, processes: Processes, interval=0.5):
    """wait_for that says what it waited for, with the logs' tails, when it times out."""
    try:
        return wait_for(lambda: processes.check_alive() or predicate(), timeout, interval)
    except AssertionError:
        logs = "".join(f"--- {n}\n{processes.log(n)[-1200:]}\n" for n in processes.procs)
        raise AssertionError(f"waited {timeout} s for {what}\n{logs}") from None


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, *args], capture_output=True, text=True, env=clean_env(),
                          timeout=timeout)


def scraped_after(prom: str, when: float) -> int:
    """How many agents Prometheus holds a scrape of taken after ``when``."""
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode(
        {"query": f'count(timestamp(up{{job="tpumon"}}) > {when!r})'})
    result = json.loads(get(url))["data"]["result"]
    return int(result[0]["value"][1]) if result else 0


def heatmap_filled(prom: str, since: float) -> None:
    """The slice's heatmap, read as `report --prometheus` reads it: every chip coloured
    from its first sample to its last (no white column between)."""
    from tpumon.trace.prometheus import slice_rows
    from tpumon.report.data import series_from_rows
    from tpumon.report.slice_heatmap import heatmap

    series = series_from_rows(slice_rows(prom, SLICE, since, time.time()))
    keys, edges, ratios = heatmap(series)
    for row, key in zip(ratios, keys, strict=True):
        inside = (edges[1:] > series[key].times[0]) & (edges[:-1] < series[key].times[-1])
        assert not np.isnan(row[inside]).any(), key


def scrape_faster(path: Path, remote_write: str) -> None:
    """Scrape every SCRAPE seconds and send every sample on to ``remote_write`` (the block
    docs/pods.md gives, its batches flushed each second rather than each 5)."""
    config = yaml.safe_load(path.read_text())
    config["global"].update(scrape_interval=f"{int(SCRAPE * 1000)}ms",
                            scrape_timeout=f"{int(SCRAPE * 1000)}ms")
    config["remote_write"] = [{"url": remote_write,
                               "queue_config": {"batch_send_deadline": "1s"}}]
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def start_victoria_metrics(binary: str, data: Path, processes: Processes) -> str:
    """A single-node VictoriaMetrics on loopback, ready; its URL (Prometheus' query API
    is at its root, remote_write at /api/v1/write)."""
    port = free_port()
    processes.start("victoria-metrics", [binary, f"-storageDataPath={data}",
                                         f"-httpListenAddr=127.0.0.1:{port}",
                                         "-loggerLevel=ERROR"])
    url = f"http://127.0.0.1:{port}"
    bounded("VictoriaMetrics to be ready", lambda: ready(f"{url}/health"), 60, processes)
    return url


def start_prometheus(binary: str, tmp_path: Path, agents: list[str], victoria: str,
                     processes: Processes) -> str:
    """Prometheus with the shipped rules scraping ``agents`` every SCRAPE seconds and
    writing every sample on to VictoriaMetrics, ready; its URL."""
    config = prometheus_config(tmp_path, agents, FOR)
    scrape_faster(config, f"{victoria}/api/v1/write")
    prom_port = free_port()
    processes.start("prometheus", [
        binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'prom'}",
        f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
    prom = f"http://127.0.0.1:{prom_port}"
    bounded("Prometheus to be ready", lambda: ready(f"{prom}/-/ready"), 60, processes)
    return prom


def start_sim(tmp_path: Path, processes: Processes) -> list[tuple[str, str, str]]:
    """`tpumon sim` of the slice, ready: (worker, address, metadata) of each host."""
    processes.start("sim", [*TPUMON, "sim", "--hosts", str(HOSTS), "--slice", SLICE,
                            "--scenario", "slice-leak", "--port", "0", "--acceleration",
                            str(ACCELERATION), "--max-lag", "50",
                            "--report-to", str(tmp_path / "reporter-w{worker}.sock")],
                    env=clean_env())
    return bounded("the simulated slice's ready line", lambda: re.findall(
        r"worker=(\d) address=(\S+) ports=\S+ metadata=(\S+)", processes.log("sim"))
        if "TPUMON_SIM_READY" in processes.log("sim") else None, 60, processes)


def start_agents(tmp_path: Path, hosts: list[tuple[str, str, str]], port: int,
                 pagerduty: FakeAlertAPI, processes: Processes) -> None:
    """An agent attached to each simulated host, with its history store, paging
    ``pagerduty``."""
    env = clean_env() | {"TPUMON_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
                         "TPUMON_PAGERDUTY_URL": pagerduty.url,
                         "TPUMON_ALERTS_OOM_HORIZON_HOURS": "168"}
    for (worker, address, metadata) in hosts:
        processes.start(f"agent-w{worker}", [
            *TPUMON, "agent", "--simulate", "--sim-host", metadata,
            "--listen-address", f"{address}:{port}", "--poll-interval", str(POLL),
            "--state-dir", str(tmp_path / f"state-w{worker}"),
            "--reporter-socket", str(tmp_path / f"reporter-w{worker}.sock")], env=env)


def check_status_slice(agents: list[str], port: int, processes: Processes) -> None:
    """status --slice: every chip of the slice leaking, and the first OOM."""
    def all_leaking():
        view = build_view(ask_all(agents, port, ClientOptions(), 3.0))
        return len(view.leaking()) == 16 and view.first_oom() is not None
    bounded("the agents to call the leak on all 16 chips", all_leaking, 120, processes)
    result = run("status", "--slice", "--peers", ",".join(agents), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["chips"]) == 16 and {c["verdict"] for c in doc["chips"]} == {"leak"}
    assert {(c["worker"], c["chip"]) for c in doc["chips"]} == \
        {(str(w), str(c)) for w in range(HOSTS) for c in range(4)}
    assert re.fullmatch(rf"v4-32 slice {SLICE}: 4 of 4 workers answered, 16 chips; "
                        r"16 leaking, first OOM w-\d chip \d in \d+\.\d h", doc["summary"]), \
        doc["summary"]


def check_one_incident(pagerduty: FakeAlertAPI, processes: Processes) -> None:
    """One PagerDuty incident for the slice, though every agent pages."""
    def every_host_paged():
        sources = {r.body["payload"]["source"] for r in pagerduty.accepted
                   if r.body["event_action"] == "trigger"}
        return len(sources) == HOSTS
    bounded("a PagerDuty trigger from each of the 4 agents", every_host_paged, 60,
            processes)
    keys = {r.body["dedup_key"] for r in pagerduty.accepted}
    assert keys == {f"tpumon/slice/{SLICE}/TPUMonOOMForecast"}, keys


def empty_pod_queries(prom: str) -> list[str]:
    """The pod dashboard's queries that return no data from this Prometheus, each with
    where it is."""
    values = {"datasource": "prometheus", "slice": SLICE,
              "host": [worker_hostname(SLICE, w) for w in range(HOSTS)]}
    now = time.time()
    out = []
    for q in queries("tpumon-pod", values):
        if q.kind == "variable":
            url = f"{prom}/api/v1/series?" + urllib.parse.urlencode(
                {"match[]": q.expr, "start": now - 60, "end": now})
        elif q.kind == "instant":
            url = f"{prom}/api/v1/query?" + urllib.parse.urlencode(
                {"query": q.expr, "time": now})
        else:
            url = f"{prom}/api/v1/query_range?" + urllib.parse.urlencode(
                {"query": q.expr, "start": now - 60, "end": now, "step": 2})
        answer = json.loads(get(url))
        data = answer["data"] if q.kind == "variable" else answer["data"]["result"]
        if not data:
            out.append(f"{q.where}: {q.expr}")
    return out


def check_dashboard_queries(prom: str, processes: Processes) -> None:
    """The pod dashboard's every query returns data from this Prometheus."""
    try:
        bounded("every pod dashboard query to return data", lambda: not empty_pod_queries(prom),
                60, processes, interval=2)
    except AssertionError as exc:
        raise AssertionError("\n".join(empty_pod_queries(prom)) + f"\n{exc}") from None


def series_by_chip(result: subprocess.CompletedProcess) -> dict:
    """`analyze --format json`'s series, by (host, chip)."""
    return {(s["host"], s["chip"]): s for s in json.loads(result.stdout)["series"]}


def check_prometheus_replay_and_report(prom: str, began: float, tmp_path: Path,
                                       processes: Processes) -> None:
    """analyze --prometheus, from the test's start on, comes to alert on every chip;
    then report --prometheus writes the slice's report and each host's, and the slice's
    heatmap has no empty column."""
    def prometheus_replay_alerts():
        result = run("analyze", "--prometheus", prom, "--slice", SLICE, "--since",
                     repr(began - 5), "--format", "json")
        assert result.returncode == 0, result.stderr
        series = series_by_chip(result)
        return series if len(series) == 16 and all(
            s["alert"] for s in series.values()) else None
    bounded("analyze --prometheus to alert on all 16 chips", prometheus_replay_alerts, 120,
            processes, interval=3)
    result = run("report", "--prometheus", prom, "--slice", SLICE, "--since",
                 repr(began - 5), "-o", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    written = sorted(Path(p).name for p in result.stdout.split())
    assert written == sorted([f"tpumon-report-slice-{SLICE}.png"] + [
        f"tpumon-report-{worker_hostname(SLICE, w)}.{ext}" for w in range(HOSTS)
        for ext in ("png", "html")])
    heatmap_filled(prom, began - 5)


def wholly_ingested_span(prom: str, began: float, processes: Processes
                         ) -> tuple[list[str], set[tuple[str, str, str]], dict[str, float],
                                    dict[str, float]]:
    """One span for every replay compared, from the test's start to a second ago, once
    Prometheus holds every agent's scrapes up to its end: the span's arguments, the
    (host, chip, time) of every poll Prometheus scraped in it, and each host's first and
    last scraped poll's time."""
    # The pooled replay of a slice's chips shares evidence across the whole series it is
    # given, so the same end matters too. Prometheus is still scraping, and a scrape of a
    # moment inside the span ingested between two of the queries below would give them
    # different series: the queries wait until every agent has a scrape after the span's
    # end in Prometheus (a target's scrapes are appended one after another, so the span's
    # are all in).
    until = time.time() - 1.0
    bounded("Prometheus to hold every agent's scrapes up to the span's end",
            lambda: scraped_after(prom, until) == HOSTS, 30, processes, interval=0.5)
    span = ["--since", repr(began - 5), "--until", repr(until)]
    result = run("export", "--prometheus", prom, "--slice", SLICE, *span, "-o", "-")
    assert result.returncode == 0, result.stderr
    scraped = {(r["host"], r["chip"], r["time"])
               for r in csv.DictReader(io.StringIO(result.stdout))}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for host, _, when in scraped:
        first[host] = min(first.get(host, math.inf), float(when))
        last[host] = max(last.get(host, -math.inf), float(when))
    return span, scraped, first, last


def check_victoria_replay(victoria: str, span: list[str], from_prom: dict,
                          processes: Processes) -> None:
    """The replay of ``span`` from VictoriaMetrics, once remote_write has brought it every
    sample Prometheus holds of the span, has the verdicts and alerts of ``from_prom``, the
    replay from Prometheus."""
    held: dict = {}

    def victoria_replay() -> dict | None:
        """The same replay from VictoriaMetrics, once remote_write has brought it
        every sample of the span."""
        result = run("analyze", "--prometheus", victoria, "--slice", SLICE, *span,
                     "--format", "json")
        if result.returncode != 0:  # e.g. nothing written yet: said if it never comes
            held.update(got=result.stderr.strip())
            return None
        series = series_by_chip(result)
        held.update(got={k: s["samples"] for k, s in series.items()})
        return series if held["got"] == {k: s["samples"] for k, s in from_prom.items()} \
            else None
    try:
        from_victoria = bounded("VictoriaMetrics to hold the span's samples Prometheus "
                                "holds", victoria_replay, 120, processes, interval=2)
    except AssertionError as exc:
        written = get(f"{victoria}/metrics").decode()  # what remote_write brought it
        rows = re.findall(r"^vm_rows_inserted_total\{type=\"promremotewrite\"\} \S+",
                          written, re.M)
        raise AssertionError(f"{rows}; samples per chip in VictoriaMetrics "
                             f"{held.get('got')}, in "
                             f"Prometheus { {k: s['samples'] for k, s in from_prom.items()} }"
                             f"\n{exc}") from None
    # VictoriaMetrics keeps a value to about 16 significant digits: the agent's clock
    # (1.8e9 s) comes back within a microsecond, so the fitted figures may differ in
    # their last digits; the verdicts and the alerts are the replay's
    for key, prom in from_prom.items():
        got = from_victoria[key]
        assert got["verdict"] == prom["verdict"], (key, got["verdict"], prom["verdict"])
        assert (got["alert"]["time"], got["alert"]["step"]) == pytest.approx(
            (prom["alert"]["time"], prom["alert"]["step"]), abs=0.001), (key, got, prom)


def export_host_trace(tmp_path: Path, worker: int, scraped: set, first: dict, last: dict,
                      traces: Path, seen: Path, processes: Processes) -> None:
    """Worker ``worker``'s agent's own record, exported to ``traces`` once its store holds
    every poll Prometheus scraped of it in the span, and of that record the polls
    Prometheus scraped alone, written to ``seen`` (a file per host: a slice each)."""
    path = traces / f"w{worker}.csv"
    host = worker_hostname(SLICE, worker)

    def exported_all_scraped() -> bool:
        """The agent writes its polls a few seconds late (several to a
        transaction): its store holds every poll Prometheus scraped of it? (The
        span is widened by the CSV's rounding of times, a millisecond, each side.)"""
        result = run("export", "--state-dir", str(tmp_path / f"state-w{worker}"),
                     "--since", repr(first[host] - 0.001), "--until",
                     repr(last[host] + 0.001), "-o", str(path))
        assert result.returncode == 0, result.stderr
        with open(path) as full:
            held = {(r["host"], r["chip"], r["time"]) for r in csv.DictReader(full)}
        return {k for k in scraped if k[0] == host} <= held
    bounded(f"{host}'s store to hold the polls Prometheus scraped",
            exported_all_scraped, 30, processes, interval=1)
    with open(path) as full, open(seen / path.name, "w") as kept:
        rows = csv.DictReader(full)
        out = csv.DictWriter(kept, rows.fieldnames or [])
        out.writeheader()
        out.writerows(r for r in rows if (r["host"], r["chip"], r["time"]) in scraped)


def analyzed(directory: Path) -> dict:
    result = run("analyze", str(directory), "--format", "json")
    assert result.returncode == 0, result.stderr
    return series_by_chip(result)


def check_replays_agree(from_prom: dict, from_traces: dict, from_scraped_polls: dict,
                        traces: Path, scraped: set, began: float) -> None:
    """The replay from Prometheus against the replays of the agents' exported traces: of
    the polls Prometheus scraped, exactly; of all the polls, within a scrape interval
    when Prometheus scraped every poll before the alerts."""
    assert set(from_prom) == set(from_traces) == set(from_scraped_polls)
    assert len(from_prom) == 16
    # The replay from Prometheus is the replay of the agents' own record of the polls
    # Prometheus scraped, exactly: dates, values and steps came through whole. Both
    # queries read a span Prometheus had wholly ingested, so they got the same series.
    assert {k: s["samples"] for k, s in from_prom.items()} == \
        {k: s["samples"] for k, s in from_scraped_polls.items()}
    for key, prom in from_prom.items():
        assert (prom["alert"]["time"], prom["alert"]["step"]) == pytest.approx(
            (from_scraped_polls[key]["alert"]["time"], from_scraped_polls[key]["alert"]["step"]),
            abs=0.01), (key, prom["alert"], from_scraped_polls[key]["alert"], prom["samples"],
                        from_scraped_polls[key]["samples"], from_traces[key]["samples"])
    # And of every poll the agents made, within one scrape interval, when Prometheus
    # scraped them all before the alerts (each poll has two scrapes to be seen by). A
    # scrape late by a whole poll on a loaded host leaves a poll out, and an alert can move
    # by more than that poll: said, and left to the strict check above.
    # The slice's chips are pooled as one job, so a poll missed on any chip before the
    # alerts may move every chip's alert.
    polls = [r for f in sorted(traces.iterdir()) for r in csv.DictReader(open(f))]
    latest = max(t["alert"]["time"] for t in from_traces.values() if t["alert"] is not None)
    missed = sum(1 for r in polls if float(r["time"]) <= latest
                 and (r["host"], r["chip"], r["time"]) not in scraped)
    interval = SCRAPE * ACCELERATION  # one scrape interval, in simulated seconds
    differences = []
    for key, trace in from_traces.items():
        assert trace["alert"] is not None, (key, trace)
        differences.append(abs(from_prom[key]["alert"]["time"] - trace["alert"]["time"]))
        if not missed:  # every poll of the slice up to the alerts scraped
            assert differences[-1] <= interval, (key, from_prom[key]["alert"], trace["alert"])
    print(f"pod e2e: {time.time() - began:.1f} s; polls Prometheus missed before the "
          f"alerts: {missed}; alert "
          f"differences from the full traces (simulated s): {sorted(differences)}")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_slice_wide_leak_seen_as_one_slice(tmp_path, processes):
    prometheus = require_tool("prometheus")
    victoria = start_victoria_metrics(require_tool("victoria-metrics"), tmp_path / "vm",
                                      processes)
    began = time.time()
    # Prometheus first, so that it scrapes the agents from their first poll on; each host
    # of the simulated slice has its own loopback address and all use one agent port.
    port = free_port()
    agents = [f"127.0.0.{w + 1}:{port}" for w in range(HOSTS)]
    prom = start_prometheus(prometheus, tmp_path, agents, victoria, processes)
    hosts = start_sim(tmp_path, processes)
    assert [f"{address}:{port}" for _, address, _ in hosts] == agents
    with FakeAlertAPI("pagerduty") as pagerduty:
        start_agents(tmp_path, hosts, port, pagerduty, processes)
        bounded("4 agents and Prometheus answering", lambda: all(
            ready(f"http://{a}/metrics") for a in agents) and ready(f"{prom}/-/ready"),
            60, processes)
        check_status_slice(agents, port, processes)
        check_one_incident(pagerduty, processes)
        check_dashboard_queries(prom, processes)
        # analyze --prometheus alerts where analyze of the exported traces does, over the
        # same span: the first and last sample Prometheus holds of each host (its first
        # scrape of an agent may come a few polls after the agent's first poll, and the
        # detector's warm-up starts from the first sample), in the agents' clock, which
        # both carry. The traces are exported once the replay from Prometheus has alerted
        # on every chip.
        check_prometheus_replay_and_report(prom, began, tmp_path, processes)
        span, scraped, first, last = wholly_ingested_span(prom, began, processes)
        result = run("analyze", "--prometheus", prom, "--slice", SLICE, *span, "--format",
                     "json")
        assert result.returncode == 0, result.stderr
        from_prom = series_by_chip(result)
        check_victoria_replay(victoria, span, from_prom, processes)
        traces, seen = tmp_path / "traces", tmp_path / "scraped"  # a file per host: a slice
        traces.mkdir()
        seen.mkdir()
        for worker in range(HOSTS):
            export_host_trace(tmp_path, worker, scraped, first, last, traces, seen, processes)
        from_traces, from_scraped_polls = analyzed(traces), analyzed(seen)
    check_replays_agree(from_prom, from_traces, from_scraped_polls, traces, scraped, began)
