"""`make demo-pod` (scripts/demo-pod): a simulated slice, an agent per host and a real
Prometheus come up, it prints where to look, and Ctrl-C stops every one of them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import clean_env, free_port, get, require_tool, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_demo_pod_starts_prints_where_to_look_and_stops(tmp_path):
    require_tool("prometheus")
    agent_port, prom_port = free_port(), free_port()
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        demo = subprocess.Popen([sys.executable, str(ROOT / "scripts/demo-pod"), "--hosts",
                                 "2", "--agent-port", str(agent_port), "--prometheus-port",
                                 str(prom_port), "--state", str(tmp_path / "state")],
                                stdout=sink, stderr=subprocess.STDOUT, env=clean_env())
    try:
        wait_for(lambda: "Ctrl-C stops everything" in out.read_text() or demo.poll(), 90)
        text = out.read_text()
        assert demo.poll() is None, text
        peers = f"127.0.0.1:{agent_port},127.0.0.2:{agent_port}"
        assert f"tpumon status --slice --peers {peers}" in text
        assert f"--prometheus http://127.0.0.1:{prom_port} --slice demo-pod" in text

        def scraped() -> bool:
            body = get(f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                       "count(tpumon_hbm_used_bytes%7Bslice%3D%22demo-pod%22%7D)").decode()
            return '"8"' in body
        wait_for(scraped, 60, interval=1)  # 2 hosts x 4 chips, scraped by Prometheus
        rules = get(f"http://127.0.0.1:{prom_port}/api/v1/rules").decode()
        assert "TPUMonHBMLeakSuspected" in rules  # the shipped rules are loaded
        # the alerts page it links is one this Prometheus serves (Debian's 2.42 answers
        # /alerts with 404, /classic/alerts with the page)
        link = re.search(r"Prometheus:\s+(\S+)", text).group(1)
        assert get(link), link  # a 404 raises
    finally:
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=40) == 0
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not re.search(rf"{tmp_path}/state", ps), "a demo process outlived Ctrl-C"


def _verdicts(result: subprocess.CompletedProcess, key: str) -> dict:
    import json

    assert result.returncode == 0, result.stderr
    return {(c["host"], str(c["chip"])): c["verdict"] for c in json.loads(result.stdout)[key]}


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_the_banners_post_mortem_gives_the_agents_verdicts(tmp_path):
    """docs/pods.md section 5 on `make demo-pod`, as its banner prints it (no option about
    the scrape interval): `analyze --prometheus` replays what Prometheus scraped and says
    `leak` where the agents do. It said `ok` on every chip (query_range at 15 s, where
    the demo scrapes every second). Time runs 240x here (a scrape a simulated minute, as
    in the demo; a poll too), 2 hosts: about 66 s."""
    from tools import TPUMON

    require_tool("prometheus")
    agent_port, prom_port = free_port(), free_port()
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        demo = subprocess.Popen([sys.executable, str(ROOT / "scripts/demo-pod"), "--hosts",
                                 "2", "--acceleration", "240", "--agent-port",
                                 str(agent_port), "--prometheus-port", str(prom_port),
                                 "--state", str(tmp_path / "state")],
                                stdout=sink, stderr=subprocess.STDOUT, env=clean_env())
    try:
        wait_for(lambda: "Ctrl-C stops everything" in out.read_text() or demo.poll(), 90)
        text = out.read_text()
        assert demo.poll() is None, text
        status = re.search(r"tpumon (status --slice --peers \S+)", text)
        replay = re.search(r"Its history, replayed: +\S*tpumon (analyze .*)$", text, re.M)
        assert status and replay, text

        def run(args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*TPUMON, *args.split(), "--format", "json"],
                                  capture_output=True, text=True, env=clean_env(), timeout=60)

        def agents_all_leak() -> dict | None:
            assert demo.poll() is None, out.read_text()[-2000:]
            said = _verdicts(run(status.group(1)), "chips")
            return said if len(said) == 8 and set(said.values()) == {"leak"} else None
        agents = wait_for(agents_all_leak, 150, interval=2)
        # the agents' verdicts, replayed from Prometheus: the same (a replay a scrape or
        # two behind the agents may take as long to get there)
        seen: list = []

        def replayed_the_same() -> bool:
            seen.append(_verdicts(run(replay.group(1)), "series"))
            return seen[-1] == {(h, c): v for (h, c), v in agents.items()}
        try:
            wait_for(replayed_the_same, 30, interval=2)
        except AssertionError:
            raise AssertionError(f"agents: {agents}; replayed: {seen[-3:]}") from None
    finally:
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=40) == 0
