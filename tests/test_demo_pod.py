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
