"""Small helpers shared by tests: waiting, free ports, external tools."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tpumon.instrument import Reporter

TPUMON = [sys.executable, "-m", "tpumon"]

#: For agents that simulate at 480x and poll every 0.1 s (48 simulated seconds apart): the
#: simulated job waits for any poll held up past 50 simulated seconds, so that on a slow
#: host the detector sees polls as dense as on a quick one, and the leak is called as
#: many simulated hours before the simulated OOM (docs/architecture.md).
DENSE_POLLS = {"TPUMON_SIMULATOR_MAX_LAG": "50"}
# what Prometheus 2.42 (Debian's, deploy/prometheus) sends with each scrape, checked against
# a real one: OpenMetrics first, gzip
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.42.0+ds",
    "X-Prometheus-Scrape-Timeout-Seconds": "10"}


def clean_env() -> dict[str, str]:
    """This process's environment without TPUMON_* variables: a developer's own settings
    must not reach the agents and commands the tests start."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TPUMON_")}


def require_tool(name: str) -> str:
    """Path of an external tool; skip without it locally, but fail in CI, where
    `make test` must have installed it (a skip there would hide a missing install step)."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; `make test` should have installed it")
    pytest.skip(f"{name} not installed (run `make test` to install it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    """Poll until ``predicate()`` is truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


class Processes:
    """Child processes with their logs; all stopped (SIGTERM, then SIGKILL) at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        with log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.tmp, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, \
                f"{name} exited {proc.returncode}:\n{self.log(name)[-3000:]}"

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the sim child too
                proc.wait(timeout=10)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def ready(url: str) -> bool:
    try:
        get(url)
        return True
    except OSError:
        return False


class FakeReporter(Reporter):
    """A reporter with made-up framework fields: for testing the transport, the agent and
    the exporter without a framework (tests/frameworks/ runs the real ones)."""

    framework = "fake"

    def __init__(self, *args, live: int = 7, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.live = live

    def framework_fields(self) -> dict:
        return {"rank": 3, "ordinal": 1, "live": self.live,
                "compiles": {"cached": 10, "uncached": 2},
                "devices": {"1": {"used": 5 * 2**30, "limit": 32 * 2**30, "peak": 6 * 2**30}}}


class AgentProcess:
    """``tpumon agent --simulate`` as a child process, optionally behind a command prefix
    (``simulate=False``: a real agent, told where its runtime is in ``extra``)."""

    def __init__(self, tmp: Path, state_dir: Path | None, *extra: str,
                 prefix: tuple[str, ...] = (), env: dict | None = None,
                 simulate: bool = True) -> None:
        self.log_path = tmp / f"agent-{len(list(tmp.glob('agent-*.log')))}.log"
        self.state_dir = state_dir
        full_env = clean_env()
        full_env.update(env or {}, PYTHONFAULTHANDLER="1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*prefix, *TPUMON, "agent", *(("--simulate",) if simulate else ()),
                 "--listen-address", "127.0.0.1:0",
                 *(() if state_dir is None else ("--state-dir", str(state_dir))),
                 "--poll-interval", "0.05", *extra],
                stderr=log, env=full_env)
        self.url = wait_for(lambda: re.search(r"serving metrics on http://(\S+)/metrics",
                                              self.log()), timeout=60).group(1)

    def log(self) -> str:
        return self.log_path.read_text()

    def get(self, path: str, timeout: float = 5.0) -> str:
        with urllib.request.urlopen(f"http://{self.url}{path}", timeout=timeout) as r:
            return r.read().decode()

    def metrics(self) -> dict[tuple[str, tuple], float]:
        out = {}
        for family in text_string_to_metric_families(self.get("/metrics")):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                      if k not in ("host", "worker", "accelerator_type", "slice")))
                out[(s.name, labels)] = s.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler logs every thread's stack
            self.proc.wait(timeout=10)
            raise AssertionError("agent still running 20 s after SIGTERM; its log ends:\n"
                                 + self.log()[-8000:]) from None


def prometheus_config(tmp: Path, targets: list[str], for_overrides: dict[str, str],
                      alertmanager: str | None = None) -> Path:
    """The shipped deploy/prometheus/ configuration and rules, pointed at agents on
    loopback: 1 s scrapes and evaluations, the given alerts' `for:` shortened (nothing
    else of the rules changed), alerts sent to ``alertmanager`` (or nowhere)."""
    import yaml

    root = Path(__file__).resolve().parent.parent / "deploy/prometheus"
    rules = yaml.safe_load((root / "tpumon.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in for_overrides:
                rule["for"] = for_overrides[rule["alert"]]
    (tmp / "tpumon.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config = yaml.safe_load((root / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s", scrape_timeout="1s")
    assert config["rule_files"] == ["tpumon.rules.yml"]
    if alertmanager is None:
        del config["alerting"]
    else:
        config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager]}]
    [job] = config["scrape_configs"]
    assert job["job_name"] == "tpumon"
    job["static_configs"] = [{"targets": targets}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
