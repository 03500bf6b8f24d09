"""A job's last words, end to end: real JAX and PyTorch/XLA processes report to a real agent,
then die, one of each kind (tests/frameworks/dying.py); within two polls the agent names
the cause and what the process said in /api/status, its log, `tpumon status` and one Slack
message (a real loopback HTTP server answering as Slack does).

The seven run at once against one agent, to keep `make test-frameworks` short.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from fake_alert_apis import FakeAlertAPI  # noqa: E402
from real_agent import real_agent  # noqa: E402
from tools import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(480)
POLL = 0.5  # the agent's poll interval, seconds
#: way -> (cause, what the end's summary must say): sizes in binary units, the innermost
#: frame of the user's code (dying.py), the known issue and its fix where one applies
EXPECTED = {
    "jax-oom": ("hbm_oom", ["out of memory allocating 4.00 TiB (jax.errors.JaxRuntimeError at "
                            "dying.py:"]),
    "torch-oom": ("hbm_oom", ["out of memory allocating 1.00 TiB (RuntimeError at dying.py:"]),
    "mark-sharding-cpu": ("exited", [
        "raised RuntimeError: Expected XLA tensor. Got: torch.FloatTensor at dying.py:",
        "known issue in torch_xla", "move the model (and its inputs) to the XLA device first",
        "https://github.com/pytorch/xla/issues/8532"]),
    "thread": ("exited", ["raised ValueError: bad record 17 in shard 3 in thread loader at "
                          "dying.py:", "in load"]),
    "abort": ("exited", ["killed by SIGABRT at dying.py:", "in main"]),
    "exit3": ("exited", ["no last words"]),
    "sigkill": ("exited", ["no last words"]),
}


def test_each_way_a_process_dies_is_told_with_its_last_words(tmp_path):
    with FakeAlertAPI("slack") as slack, \
            real_agent(tmp_path, POLL, TPUMON_SLACK_WEBHOOK_URL=slack.url) as (url, sock, log):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
        env.update(TPUMON_REPORTER_SOCKET=str(sock), PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4",
                   JAX_PLATFORMS="cpu")
        procs = {}
        for way in EXPECTED:
            out = open(tmp_path / f"{way}.out", "w")
            procs[way] = subprocess.Popen(
                [sys.executable, str(HERE / "dying.py"), "sleep" if way == "sigkill" else way,
                 "--seconds", "3"], env=env, stdout=out, stderr=subprocess.STDOUT)
        died: dict[str, float] = {}
        deadline = time.monotonic() + 300
        while len(died) < len(procs) and time.monotonic() < deadline:
            for way, proc in procs.items():
                if way in died:
                    continue
                if way == "sigkill" and proc.poll() is None and \
                        "dying at step" in (tmp_path / f"{way}.out").read_text():
                    proc.send_signal(signal.SIGKILL)
                if proc.poll() is not None:
                    died[way] = time.time()
            time.sleep(0.02)
        outputs = {way: (tmp_path / f"{way}.out").read_text() for way in procs}
        assert len(died) == len(procs), outputs
        for way in ("jax-oom", "torch-oom", "mark-sharding-cpu"):  # the user's hooks ran
            assert "users excepthook ran" in outputs[way], outputs[way]
            assert "users atexit ran" in outputs[way], outputs[way]
        assert procs["exit3"].returncode == 3 and procs["abort"].returncode == -6

        def ends():
            with urllib.request.urlopen(f"{url}/api/status", timeout=5) as r:
                found = {e["pid"]: e for e in json.loads(r.read())["job_ends"]}
            return found if all(p.pid in found for p in procs.values()) else None

        by_pid = wait_for(ends, 30)
        table = subprocess.run([sys.executable, "-m", "tpumon", "status", "--agent", url],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, COLUMNS="400"))
        assert table.returncode == 0, table.stderr
        for way, (cause, words) in EXPECTED.items():
            end = by_pid[procs[way].pid]
            assert end["cause"] == cause, (way, end, outputs[way])
            for said in words:
                assert said in end["summary"], (way, end["summary"])
            # noticed within two polls of the death (and a little for the loaded machine)
            assert end["time"] - died[way] <= 2 * POLL + 0.5, (way, end["time"] - died[way])
            assert end["summary"] in log.read_text(), way
            assert end["summary"] in table.stdout.replace("\n", " ") or \
                end["summary"][:120] in table.stdout, way
        oom = by_pid[procs["jax-oom"].pid]["last_words"]
        assert oom["oom"]["requested_bytes"] == 1 << 42 and oom["frame"]["line"] > 0
        assert "8809" not in by_pid[procs["torch-oom"].pid]["summary"]  # torch_xla 2.9

        def told():
            texts = [r.body.get("text", "") for r in slack.requests]
            counts = {way: sum(f"pid {p.pid} " in t for t in texts)
                      for way, p in procs.items()}
            return counts if all(counts.values()) else None

        counts = wait_for(told, 60)
        time.sleep(2 * POLL)
        assert told() == counts == dict.fromkeys(procs, 1), counts
