"""Real PyTorch/XLA and JAX training loops on CPU, reporting to a real tpumon agent.

Run by `make test-frameworks` in .venv-frameworks (scripts/frameworks-venv). Each loop
runs as its own process with tpumon.instrument's reporter, planted bug or not; the agent
(no TPU here: its runtime source reports "down", which is a normal state) must tell them
apart from the reports alone: a loop that keeps its losses leaks one live tensor per step,
a loop fed a new shape every few steps recompiles, a clean loop does neither.
"""

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from real_agent import real_agent  # noqa: E402
from tools import wait_for  # noqa: E402

#: Steps per run: enough reports (at most 20 a second) for a trend after warm-up. A
#: recompiling run is slow per step (a compile every 10 steps), so it needs fewer. JAX's
#: loop is fast (host-side data, one small jitted step), so it needs more steps than torch.
STEPS = {"torch_xla": 3000, "jax": 40000}
RECOMPILE_STEPS = 600
#: ... and at least this long, whatever the machine's speed: reports are sent at most 20 a
#: second, and the agent needs a few dozen after warm-up for a trend.
MIN_SECONDS = 8.0

#: Real frameworks start, compile and run thousands of steps: a guard against hangs far
#: above the suite's default, which is sized for unit tests (CI machines vary 2x and more).
pytestmark = pytest.mark.timeout(480)


@pytest.fixture
def agent(tmp_path):
    """`tpumon agent` on this CPU machine: reporter socket on, history store off."""
    with real_agent(tmp_path) as (url, socket_path, _):
        yield url, socket_path


def train(framework: str, socket_path: Path, *flags: str) -> int:
    """Run a loop to its end; the step of its last report."""
    steps = RECOMPILE_STEPS if "--recompile" in flags else STEPS[framework]
    env = dict(os.environ, TPUMON_REPORTER_SOCKET=str(socket_path), PJRT_DEVICE="CPU",
               JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(HERE / f"train_{framework}.py"), "--steps",
                           str(steps), "--min-seconds", str(MIN_SECONDS), *flags], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sent, dropped, last = re.search(r"sent=(\d+) dropped=(\d+) last=(\d+)", done.stdout).groups()
    assert int(dropped) == 0 and int(sent) >= 60, done.stdout
    return int(last)


def process_status(url: str, framework: str, last_step: int, exclude: int = -1) -> dict:
    """The agent's view of the process that reported ``last_step``, once it has it."""
    def ready():
        with urllib.request.urlopen(f"{url}/api/status", timeout=5) as r:
            doc = json.loads(r.read())
        found = [p for p in doc["processes"]
                 if p["framework"] == framework and p["pid"] != exclude]
        return found[0] if found and found[0]["step"] == last_step else None

    return wait_for(ready, 30)


@pytest.mark.parametrize("framework", ["torch_xla", "jax"])
def test_a_leaking_loop_is_told_from_a_clean_one(agent, framework):
    url, socket_path = agent
    clean = process_status(url, framework, train(framework, socket_path))
    assert clean["verdict"] == "ok" and clean["diagnosis"] is None
    assert clean["live_tensors_per_step"] == 0 and not clean["recompiling"]
    leaky = process_status(url, framework, train(framework, socket_path, "--leak"),
                           exclude=clean["pid"])  # the second run reports under its own pid
    # One f32[] a step: the count rises. A leak only if memory grows with it: on a CPU
    # backend, RSS (4 bytes of data a step, plus each kept array's host-side bookkeeping:
    # ~2 KiB a step for JAX's 40,000 steps, far less for torch_xla's 3,000).
    expected = "leak" if leaky["host_verdict"] == "leak" else "growing"
    assert leaky["verdict"] == expected, leaky
    assert framework == "jax" or expected == "growing", leaky
    assert leaky["live_tensors_per_step"] == pytest.approx(1.0, abs=0.05)
    assert leaky["live_tensors"] >= clean["live_tensors"] + 0.9 * STEPS[framework]
    assert "kept alive across steps" in leaky["diagnosis"]
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    for pid, value in ((clean["pid"], "0.0"),
                       (leaky["pid"], "1.0" if expected == "leak" else "0.0")):
        assert re.search(rf'tpumon_process_leak_suspected\{{[^}}]*pid="{pid}"[^}}]*\}} {value}',
                         metrics), pid
    table = subprocess.run([sys.executable, "-m", "tpumon", "status", "--agent", url],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, COLUMNS="100"))
    assert table.returncode == 0, table.stderr
    assert f"pid {leaky['pid']}: live tensors grow +1.00 per step" in table.stdout


@pytest.mark.parametrize("framework", ["torch_xla", "jax"])
def test_recompilation_is_named(agent, framework):
    url, socket_path = agent
    status = process_status(url, framework, train(framework, socket_path, "--recompile"))
    assert status["recompiling"] and status["verdict"] == "ok"
    assert status["compiles_uncached"] >= RECOMPILE_STEPS // 10 - 5
    assert "recompilation" in status["diagnosis"]


def test_torch_xla_memory_info_is_tried_once_on_cpu(tmp_path):
    """get_memory_info raises on CPU (as under SPMD): the reporter stops asking and its
    reports simply have no device memory; training is not disturbed."""
    code = (
        "import torch, torch_xla\n"
        "from tpumon.instrument import TorchXlaReporter\n"
        "r = TorchXlaReporter(socket=%r, min_interval=0)\n"
        "calls = []\n"
        "real = r._xm.get_memory_info\n"
        "r._xm = type('XM', (), {'get_memory_info': staticmethod("
        "lambda d: calls.append(1) or real(d))})()\n"
        "for step in range(5):\n"
        "    x = torch.ones(2, device=torch_xla.device()) * step\n"
        "    torch_xla.sync()\n"
        "    r.step(step)\n"
        "print(len(calls), r.dropped)\n" % str(tmp_path / "none.sock"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PJRT_DEVICE="CPU"), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "5"]  # asked once; 5 reports dropped: no agent


def test_device_memory_where_the_framework_gives_it(agent):
    """What a CPU cannot give, faked at the framework's own call: a TPU's allocator stats
    (torch_xla's get_memory_info outside SPMD; JAX's Device.memory_stats). The rest of the
    path (real reporter, real socket, real agent) is real; the agent exports them."""
    url, socket_path = agent
    fake_tpu = {
        "torch_xla": (
            "from tpumon.instrument import TorchXlaReporter\n"
            "r = TorchXlaReporter(socket=sys.argv[1], min_interval=0)\n"
            "r._xm = types.SimpleNamespace(get_memory_info=lambda d: {'bytes_used': 5 << 30,"
            " 'bytes_limit': 32 << 30, 'peak_bytes_used': 6 << 30})\n"),
        "jax": (
            "from tpumon.instrument import JaxReporter\n"
            "r = JaxReporter(socket=sys.argv[1], min_interval=0)\n"
            "class Dev:\n"
            "    id = 7\n"
            "    def memory_stats(self):\n"
            "        return {'bytes_in_use': 3 << 30, 'bytes_limit': 16 << 30,"
            " 'peak_bytes_in_use': 4 << 30}\n"
            "r._devices = [Dev()]\n"),
    }
    for framework, setup in fake_tpu.items():  # one process each: one reporter per pid
        done = subprocess.run(
            [sys.executable, "-c", f"import sys, types\n{setup}r.step(1)\nprint(r.sent)\n",
             str(socket_path)], capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PJRT_DEVICE="CPU", JAX_PLATFORMS="cpu"))
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "1", framework

    def exported():
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
        found = {(s.labels["device"], s.labels["framework"], s.labels["kind"]): s.value
                 for family in text_string_to_metric_families(text)
                 if family.name == "tpumon_process_device_memory_bytes"
                 for s in family.samples}
        return found if len(found) == 6 else None

    found = wait_for(exported, 30)
    assert found[("0", "torch_xla", "used")] == 5 * 2**30
    assert found[("0", "torch_xla", "limit")] == 32 * 2**30
    assert found[("7", "jax", "peak")] == 4 * 2**30


@pytest.mark.parametrize("framework,site", [
    ("torch_xla", "train_torch_xla.py:33 (loss = torch.nn.functional.mse_loss(model(x), y))"),
    ("jax", "train_jax.py:41 (params, loss = train_step(params, x, y))")])
def test_tpumon_snapshot_names_the_kept_loss_and_where_it_was_made(agent, framework, site):
    """The agent asks a real training loop (losses kept in a list) for two snapshots over
    its control channel; the reporter takes them at step boundaries, with creation sites
    (TPUMON_TRACK_SITES for PyTorch/XLA; JAX records them by default)."""
    url, socket_path = agent
    env = dict(os.environ, TPUMON_REPORTER_SOCKET=str(socket_path), PJRT_DEVICE="CPU",
               JAX_PLATFORMS="cpu", TPUMON_TRACK_SITES="1")
    loop = subprocess.Popen([sys.executable, str(HERE / f"train_{framework}.py"), "--leak",
                             "--steps", "10", "--min-seconds", "240"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def heard():
            with urllib.request.urlopen(f"{url}/api/status", timeout=5) as r:
                doc = json.loads(r.read())
            return any(p["pid"] == loop.pid and p["step"] > 50 for p in doc["processes"])

        wait_for(heard, 120)
        done = subprocess.run([sys.executable, "-m", "tpumon", "snapshot", "--agent", url,
                               "--pid", str(loop.pid), "--steps", "200", "--format", "json",
                               "--timeout", "120"], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["to_step"] - result["from_step"] >= 200
        top = result["grown"][0]
        assert (top["group"], top["count_per_step"], top["bytes_each"]) == ("f32[]", 1.0, 4.0)
        [(where, count)] = top["sites"].items()  # a path relative to the loop's directory
        assert where.endswith("/" + site) and count == 200, top["sites"]
        assert result["summary"].startswith("likely leak: +1 f32[] per step (4 B each")
    finally:
        loop.kill()
        loop.wait(30)


#: SPMD runs: 2,000+ steps of the multi-host pattern on 4 CPU devices.
SPMD_STEPS = 2000


def run_spmd(socket_path: Path, *flags: str, steps: int = SPMD_STEPS) -> int:
    """Run train_spmd.py to its end; the step of its last report."""
    env = dict(os.environ, TPUMON_REPORTER_SOCKET=str(socket_path), PJRT_DEVICE="CPU",
               CPU_NUM_DEVICES="4")
    done = subprocess.run([sys.executable, str(HERE / "train_spmd.py"), "--steps", str(steps),
                           "--min-seconds", str(MIN_SECONDS), *flags], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(re.search(r"last=(\d+)", done.stdout).group(1))


def pid_metric(url: str, name: str, pid: int) -> float | None:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return next((s.value for f in text_string_to_metric_families(text) if f.name == name
                 for s in f.samples if s.labels.get("pid") == str(pid)), None)


@pytest.mark.parametrize("flags", [(), ("--mark-function",)], ids=["mark_sharding",
                                                                   "MarkShardingFunction"])
def test_healthy_spmd_loops_are_not_leaks(agent, flags):
    """Each step's batch sharded with xs.mark_sharding (torch_xla's counters once said +1
    live tensor a step here), and MarkShardingFunction on parameters and activations."""
    url, socket_path = agent
    status = process_status(url, "torch_xla", run_spmd(socket_path, *flags))
    assert status["live_tensors_per_step"] == 0, status
    assert status["verdict"] == "ok" and status["host_verdict"] == "ok", status
    assert status["diagnosis"] is None and not status["recompiling"]
    assert pid_metric(url, "tpumon_process_leak_suspected", status["pid"]) == 0
    assert pid_metric(url, "tpumon_process_host_leak_suspected", status["pid"]) == 0


def test_an_spmd_leak_is_counted_exactly_and_its_tensor_named(agent):
    """A sharded activation kept every step: +1.00 live tensor a step (torch_xla's raw
    counters say +2), and `tpumon snapshot` names it by shape, dtype and creating line."""
    url, socket_path = agent
    env = dict(os.environ, TPUMON_REPORTER_SOCKET=str(socket_path), PJRT_DEVICE="CPU",
               CPU_NUM_DEVICES="4", TPUMON_TRACK_SITES="1")
    loop = subprocess.Popen([sys.executable, str(HERE / "train_spmd.py"), "--leak", "--steps",
                             "10", "--min-seconds", "300"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def counted():
            with urllib.request.urlopen(f"{url}/api/status", timeout=5) as r:
                found = [p for p in json.loads(r.read())["processes"] if p["pid"] == loop.pid]
            return found[0] if found and found[0]["live_tensors_per_step"] else None

        status = wait_for(counted, 180)
        assert status["live_tensors_per_step"] == pytest.approx(1.0, abs=0.02), status
        assert "kept alive across steps" in status["diagnosis"]
        done = subprocess.run([sys.executable, "-m", "tpumon", "snapshot", "--agent", url,
                               "--pid", str(loop.pid), "--steps", "100", "--format", "json"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        top = json.loads(done.stdout)["grown"][0]
        assert top["group"].startswith("f32[16,64]") and top["count_per_step"] == 1.0, top
        [(where, count)] = top["sites"].items()
        assert where.endswith("/train_spmd.py:39 (h = torch.relu(self.first(x)))"), where
    finally:
        loop.kill()
        loop.wait(30)


def test_a_host_side_leak_is_flagged_and_its_control_is_not(agent):
    """Host objects kept every step (256 KiB of numpy a step): RSS grows, HBM never
    would; the agent's step-indexed RSS trend calls it, with the cause and a forecast."""
    url, socket_path = agent
    leaky = process_status(url, "torch_xla", run_spmd(socket_path, "--host-leak"))
    assert leaky["host_verdict"] == "leak", leaky
    assert leaky["rss_growth_bytes_per_step"] == pytest.approx(256 << 10, rel=0.25), leaky
    assert leaky["diagnosis"].startswith("host memory (RSS) grows"), leaky
    assert leaky["verdict"] == "ok" and leaky["host_oom_seconds"] > 0
    assert pid_metric(url, "tpumon_process_host_leak_suspected", leaky["pid"]) == 1


def test_jax_counts_150k_live_arrays_within_the_reporters_budget(agent):
    """len(jax.live_arrays()) at 150k arrays costs ~15-30 ms: counted at every report it
    slowed a small loop several times over. The reporter spends at most its budget per
    step on it (by construction: measured in bench/reporters.py), and the agent still
    gets the count."""
    url, socket_path = agent
    code = (
        "import sys, time, jax, numpy as np\n"
        "from tpumon.instrument import JaxReporter\n"
        "held = jax.device_put(list(np.arange(150_000, dtype=np.float32)))\n"
        "r = JaxReporter(socket=sys.argv[1])\n"
        "spent, counts, real = [0.0], [0], r._live_count\n"
        "def timed():\n"
        "    t = time.perf_counter(); n = real(); spent[0] += time.perf_counter() - t\n"
        "    counts[0] += n is not None\n"
        "    return n\n"
        "r._live_count = timed\n"
        "w = jax.numpy.zeros((8,))\n"
        "start = time.monotonic(); step = 0\n"
        "while time.monotonic() - start < 15:\n"
        "    step += 1; w = (w + 1).block_until_ready(); r.step(step)\n"
        "print(step, counts[0], spent[0], r.count_budget)\n")
    done = subprocess.run([sys.executable, "-c", code, str(socket_path)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr[-2000:]
    steps, counts, spent, budget = done.stdout.split()
    steps, counts, spent, budget = int(steps), int(counts), float(spent), float(budget)
    assert counts >= 2, done.stdout
    per_count = spent / counts
    assert spent <= budget * steps + per_count, done.stdout  # the last count may be early
    status = wait_for(lambda: next((p for p in json.loads(urllib.request.urlopen(
        f"{url}/api/status", timeout=5).read())["processes"] if p["framework"] == "jax"),
        None), 30)
    assert 150_000 <= status["live_tensors"] <= 150_100, status
