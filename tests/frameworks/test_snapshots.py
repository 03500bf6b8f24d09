"""Live-tensor snapshots from real PyTorch/XLA and JAX on CPU (issue 10).

Each loop (snapshot_loop.py) runs in its own process and takes two snapshots through its
reporter, 50 steps apart; the diff must find nothing in a clean loop, and name a loss
kept every step (+1 f32[] per step) and a bigger tensor kept every 10 steps, with the
exact lines that created them. Around each snapshot the loop checks that it ran nothing
on the device (torch_xla's counters and metrics unchanged; JAX under a transfer guard, no
compile), kept no tensor alive, and left the live count as it was.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpumon.sources.tensor_diff import diff
from tpumon.instrument.snapshot import Snapshot

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOOP = HERE / "snapshot_loop.py"
LOOP_NAME = LOOP.relative_to(REPO).as_posix()  # sites name files relative to the cwd
ENV = dict(os.environ, PJRT_DEVICE="CPU", JAX_PLATFORMS="cpu")

pytestmark = pytest.mark.timeout(240)


def run_loop(framework: str, *flags: str) -> dict:
    done = subprocess.run([sys.executable, str(LOOP), framework, *flags], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def site(framework: str, name: str) -> str:
    """The site text of the line marked "# SITE:name" in the framework's loop."""
    lines = LOOP.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {framework}_loop"))
    for i in range(start, len(lines)):
        if f"# SITE:{name}" in lines[i]:
            code = lines[i].split("#")[0].strip()
            return f"{LOOP_NAME}:{i + 1} ({code})"
    raise AssertionError(name)


def snapshots(out: dict) -> tuple[Snapshot, Snapshot]:
    return (Snapshot.from_json(out["first"].encode()), Snapshot.from_json(out["second"].encode()))


def assert_snapshots_were_harmless(out: dict) -> None:
    for label in ("first_checks", "second_checks"):
        checks = out[label]
        assert checks["changed"] in ({}, 0), checks  # no compile, execution, transfer
        assert checks["live"][0] == checks["live"][1], checks
        assert checks["released"], "the snapshot kept a tensor alive"


@pytest.mark.parametrize("framework", ["torch_xla", "jax"])
def test_a_clean_loop_grows_nothing(framework):
    out = run_loop(framework)
    assert_snapshots_were_harmless(out)
    before, after = snapshots(out)
    assert before.total_count > 3
    assert before.tracking == (framework == "jax")  # jaxlib records sites by default
    d = diff(before, after)
    assert d.grown == [] and d.steps == 50, d
    assert d.summary() == "no live tensors grew between steps 50 and 100"


@pytest.mark.parametrize("framework", ["torch_xla", "jax"])
def test_kept_tensors_are_named_with_their_lines(framework):
    out = run_loop(framework, "--keep-loss", "--keep-big-every", "10", "--track")
    assert out["started"] is True
    assert_snapshots_were_harmless(out)
    before, after = snapshots(out)
    assert before.tracking and after.tracking
    d = diff(before, after)
    big, loss = d.grown  # nothing else grew
    assert (big.label(), big.cadence(), big.count_delta) == (
        "f32[256,1024]", "+1 every 10 steps", 5)
    assert (loss.label(), loss.cadence(), loss.count_delta) == ("f32[]", "+1 per step", 50)
    assert big.sites == {site(framework, "big"): 5}
    assert loss.sites == {site(framework, "loss"): 50}
    hbm_slope = big.bytes_per_step / 0.9  # as if the chip grew a little more than that
    assert d.summary(hbm_bytes_per_step=hbm_slope) == (
        f"likely leak: +1 f32[256,1024] every 10 steps (1.0 MiB each, 90% of the growth), "
        f"created at {site(framework, 'big')}; +1 f32[] per step (4 B each, ~0.003% of "
        f"the growth), created at {site(framework, 'loss')}")
    if framework == "torch_xla":
        assert out["first_checks"]["mode_stack"] == 1 and out["mode_stack_after_stop"] == 0
        # parameters (made before tracking) updated in place by SGD 80 times: still no site
        weights = next(g for g in after.groups if g.shape == (64, 32))
        assert weights.count == 3 and weights.sites == {}  # parameter, gradient, momentum


TRACKER_AND_MODES = r"""
import sys, torch, torch_xla
from torch.overrides import BaseTorchFunctionMode
from tpumon.instrument import TorchXlaReporter
stack = torch._C._len_torch_function_stack
device = torch_xla.device()

assert TorchXlaReporter(socket="/nonexistent", track_sites=False).start_tracking() is False
r = TorchXlaReporter(socket="/nonexistent", track_sites=None)  # TPUMON_TRACK_SITES=1
user = BaseTorchFunctionMode()
user.__enter__()                       # a program's own mode, open across the boundary
assert r.start_tracking() is True and stack() == 2
user.__exit__(None, None, None)        # ...closed before tracking stops: pops its own
assert stack() == 1
a = torch.ones(2, device=device) + 1   # SITE:a
with torch.device("cpu"):              # default-device mode: goes under ours, comes out
    b = torch.ones(2, device=device) * 3
assert stack() == 1
c = a.add_(1)                          # in place: keeps a's site
r.stop_tracking()
assert stack() == 0
t = r._tracker
print("SITES", t.site_of(a), "|", t.site_of(b), "|", t.site_of(c))

torch.set_default_device(device)       # a DeviceContext must stay at the bottom
assert r.start_tracking() and stack() == 2
d = torch.zeros(2)
assert torch._C._get_function_stack_at(0).__class__.__name__ == "DeviceContext"
r.stop_tracking()
assert stack() == 1
torch.set_default_device("cpu")
print("DEFAULT", t.site_of(d), d.device)
"""


def test_torch_xla_tracking_across_steps_with_the_programs_own_modes(tmp_path):
    """Tracking starts and stops at different points of a program that opens and closes
    its own function modes in between, including torch's default-device mode."""
    script = tmp_path / "modes.py"
    script.write_text(TRACKER_AND_MODES)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=200,
                          env=dict(ENV, TPUMON_TRACK_SITES="1"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    a_line = TRACKER_AND_MODES.splitlines().index(
        next(line for line in TRACKER_AND_MODES.splitlines() if "# SITE:a" in line)) + 1
    sites = re.search(r"SITES (.*)", done.stdout).group(1).split(" | ")
    assert sites[0] == f"modes.py:{a_line} (a = torch.ones(2, device=device) + 1)"
    assert sites[1].startswith("modes.py:") and "b = torch.ones" in sites[1]
    assert sites[2] == sites[0]
    assert re.search(r"DEFAULT modes.py:\d+ \(d = torch.zeros\(2\)\) xla:0",
                     done.stdout), done.stdout


def test_jax_tracking_switches_recording_back_as_it_was():
    code = (
        "import jax.numpy as jnp, jaxlib._jax as j\n"
        "from tpumon.instrument import JaxReporter\n"
        "j.set_tracebacks_enabled(False)\n"
        "a = jnp.ones(3) * 2\n"
        "r = JaxReporter(socket='/nonexistent', track_sites=True)\n"
        "print(r.take_snapshot(1).tracking, r.start_tracking(), j.tracebacks_enabled())\n"
        "b = jnp.ones(4) * 2\n"
        "s = r.take_snapshot(2)\n"
        "print(sorted((g.label(), tuple(g.sites.values())) for g in s.groups))\n"
        "r.stop_tracking()\n"
        "print(j.tracebacks_enabled())\n")
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "False True True", "[('f32[3]', ()), ('f32[4]', (1,))]", "False"]


SHARDED = {
    "torch_xla": (
        "import numpy as np, torch, torch_xla\n"
        "import torch_xla.runtime as xr, torch_xla.distributed.spmd as xs\n"
        "from tpumon.instrument import live_torch_xla as live\n"
        "xr.use_spmd()\n"
        "mesh = xs.Mesh(np.arange(4), (4, 1), ('data', 'model'))\n"
        "d = torch_xla.device()\n"
        "a = torch.zeros(8, 4, device=d)\n"
        "xs.mark_sharding(a, mesh, ('data', None))\n"
        "w = xs.mark_sharding(torch.zeros(6, 2, device=d), mesh, (None, 'data'))\n"
        "b = torch.ones(3, device=d)\n"
        "torch_xla.sync()\n"),
    "jax": (
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "from tpumon.instrument import live_jax as live\n"
        "mesh = Mesh(np.array(jax.devices()).reshape(4, 1), ('data', 'model'))\n"
        "a = jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P('data', None)))\n"
        "w = jax.device_put(jnp.zeros((6, 8)), NamedSharding(mesh, P(None, 'data')))\n"
        "b = jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))\n"
        "c = jax.device_put(jnp.ones(5), jax.devices()[2])\n"),
}


@pytest.mark.parametrize("framework", ["torch_xla", "jax"])
def test_sharded_tensors_are_told_apart_with_their_bytes_on_this_hosts_devices(framework):
    """Four CPU devices: a tensor sharded 4 ways takes its size once over the four (torch_xla
    pads an uneven shard: f32[6,2] 4 ways is 4 shards of f32[6,1]), a replicated one four
    times; the sharding is part of the group and of the label (not the default
    replication of torch_xla's SPMD)."""
    code = SHARDED[framework] + (
        "for g in sorted(live.snapshot(1).groups, key=lambda g: g.label()):\n"
        "    print(g.label(), g.count, g.bytes)\n")
    env = dict(ENV, CPU_NUM_DEVICES="4", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.splitlines()
    if framework == "torch_xla":
        assert rows == ["f32[3] 1 48", "f32[6,2]@{devices=[1,4]0,1,2,3} 1 96",
                        "f32[8,4]@{devices=[4,1]0,1,2,3} 1 128"]
    else:
        assert rows == ["f32[3]@P() data=4,model=1 1 48", "f32[5]@cpu:2 1 20",
                        "f32[6,8]@P(None,'data') data=4,model=1 1 192",
                        "f32[8,4]@P('data',None) data=4,model=1 1 128"]
