"""In-process reporter overhead (`make bench`; the framework part with .venv-frameworks).

1. ``Reporter.step()`` alone, building and sending a report at every call
   (``min_interval=0``, the worst case) and with the defaults (at most 20 reports a
   second), with an agent side draining in another process (this version's: the report
   goes over the reporter's connection; an earlier version's: datagrams), and with no
   agent.
3. JAX with 150,000 live arrays (a large model's parameters and optimizer state, or a
   leak that has run a while): what ``JaxReporter.step()`` adds per step, amortised
   (mean) and median, with the count timed and spaced by its cost (the default) and
   counted at every report (``count_budget=inf``, the earlier behaviour, as the baseline).
4. The agent's side: CPU of its receiving thread (``/proc`` schedstat) while one reporter
   in another process sends 10 reports a second for 20 s, over its connection and as
   datagrams (an earlier version's reporter), one after the other in the same run.
2. Real training loops on CPU, PyTorch/XLA and JAX (when importable): the median step
   time of the bare loop, and what ``reporter.step()`` adds to it, with the defaults and
   when it reports at every step; bare and reported steps are interleaved one by one, so
   drift in the loop's own speed falls on both alike.
5. Last words (issue 41): ``Reporter.step()`` with the end's capture installed and
   without (``last_words=False``), calls interleaved; and what the capture adds to a
   process's exit (from the last line of its code to its parent's ``wait()``), a normal
   exit and an uncaught exception, against the same without it, runs interleaved, and
   with an agent whose queue is full (accepts, never reads): at most ``EXIT_WAIT``.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


DRAIN = """
import selectors, socket, sys
sel = selectors.DefaultSelector()
d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
d.bind(sys.argv[1])
sel.register(d, selectors.EVENT_READ)
if len(sys.argv) > 2:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[2])
    listener.listen(16)
    sel.register(listener, selectors.EVENT_READ, "listener")
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.data == "listener":
            sel.register(listener.accept()[0], selectors.EVENT_READ)
        elif not key.fileobj.recv(65536):
            sel.unregister(key.fileobj)
"""


def drain(path: str, connections: bool = True) -> subprocess.Popen:
    """An agent side in another process that reads and discards reports: this version's
    (connections and datagrams), or an earlier one's (datagrams only)."""
    from tpumon.instrument.protocol import connection_path

    extra = [connection_path(path)] if connections else []
    proc = subprocess.Popen([sys.executable, "-c", DRAIN, path, *extra],
                            stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


def timed_calls(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def us(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.1f} us"


def base_reporter() -> None:
    from tpumon.instrument import Reporter

    class Counts(Reporter):  # what a framework reporter adds: a few ints and a dict
        framework = "bench"

        def framework_fields(self):
            return {"rank": 0, "ordinal": 0, "live": 1234,
                    "compiles": {"cached": 99, "uncached": 3}}

    cases = (("report every step (min_interval=0)", 0.0),
             ("defaults (at most 20 reports/s)", 0.05))
    print("\n## Reporter.step() alone (median of 20,000 calls)")
    print("| case | agent listening: connection | earlier agent: datagrams | no agent |")
    print("|---|---|---|---|")
    rows: dict[str, list[str]] = {label: [] for label, _ in cases}
    for connections in (True, False, None):  # None: no agent
        path = os.path.join(tempfile.mkdtemp(), "r.sock")
        listener = None if connections is None else drain(path, connections)
        try:
            for label, interval in cases:
                reporter = Counts(socket=path, min_interval=interval)
                assert reporter._sender.connected == bool(connections)
                rows[label].append(us(timed_calls(reporter.step, 20000)))
                reporter.close()
        finally:
            if listener is not None:
                listener.kill()
    for label, _ in cases:
        print(f"| {label} | {' | '.join(rows[label])} |")


def loop_overhead(name: str, make_step, make_reporter, steps: int) -> None:
    """Steps with and without the reporter interleaved one by one (so drift in the loop's
    own speed falls on both alike), plus the reporter reporting at every step, over its
    connection and as datagrams to an agent of an earlier version."""
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    old_path = os.path.join(tempfile.mkdtemp(), "r.sock")
    listener, old_listener = drain(path), drain(old_path, connections=False)
    kinds = ("bare", "default", "every", "every, datagrams")
    try:
        step_fn = make_step()
        for i in range(200):  # compile and warm up
            step_fn(i)
        times: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        reporters = {"default": make_reporter(path, 0.05), "every": make_reporter(path, 0.0),
                     "every, datagrams": make_reporter(old_path, 0.0)}
        for i in range(len(kinds) * steps):
            kind = kinds[i % len(kinds)]
            t0, c0 = time.perf_counter(), time.thread_time()
            step_fn(i)
            if kind != "bare":
                reporters[kind].step(i)
            times[kind].append(time.perf_counter() - t0)
            cpu[kind].append(time.thread_time() - c0)
    finally:
        listener.kill()
        old_listener.kill()
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    added = [f"{(med[k] - med['bare']) * 1e6:+.1f} / {(cmed[k] - cmed['bare']) * 1e6:+.1f} us"
             for k in kinds[1:]]
    print(f"| {name} | {med['bare'] * 1e3:.3f} ms | {' | '.join(added)} |")


def torch_xla_loop():
    import torch
    import torch_xla

    device = torch_xla.device()
    model = torch.nn.Linear(32, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32).to(device), torch.randn(16, 1).to(device)

    def step(i: int) -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        torch_xla.sync()

    return step


def jax_loop():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def update(w, x, y):
        grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.01 * grad

    state = {"w": jnp.zeros((32, 1))}
    x, y = jnp.ones((16, 32)), jnp.ones((16, 1))

    def step(i: int) -> None:
        state["w"] = update(state["w"], x, y)
        state["w"].block_until_ready()

    return step


def frameworks() -> None:
    loops = []
    try:
        import torch_xla  # noqa: F401

        from tpumon.instrument import TorchXlaReporter
        loops.append(("PyTorch/XLA 2.9 (CPU)", torch_xla_loop,
                      lambda p, m: TorchXlaReporter(socket=p, min_interval=m)))
    except ImportError:
        pass
    try:
        import jax  # noqa: F401

        from tpumon.instrument import JaxReporter
        loops.append(("JAX (CPU)", jax_loop, lambda p, m: JaxReporter(socket=p, min_interval=m)))
    except ImportError:
        pass
    if not loops:
        print("\n(no torch_xla or jax here: run with .venv-frameworks/bin/python for the "
              "framework loops)")
        return
    print("\n## Training loop: median step time, bare, and what reporter.step() adds to it "
          "(steps interleaved one by one, 10,000 of each kind); wall / training thread's CPU")
    print("| loop | bare step | + reporter (defaults: at most 20 reports/s) | "
          "+ reporter reporting every step | ... as datagrams (an earlier agent) |")
    print("|---|---|---|---|---|")
    for name, make_step, make_reporter in loops:
        loop_overhead(name, make_step, make_reporter, steps=10000)


def jax_many_arrays(live: int = 150_000, steps: int = 20_000) -> None:
    """Bare and reported steps interleaved, with ``live`` arrays held alive."""
    try:
        import jax
        import numpy as np

        from tpumon.instrument import JaxReporter
    except ImportError:
        return
    held = jax.device_put(list(np.arange(live, dtype=np.float32)))
    step_fn = jax_loop()
    for i in range(200):
        step_fn(i)
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    listener = drain(path)
    print(f"\n## JAX (CPU) with {len(jax.live_arrays()):,} live arrays: what reporter.step() "
          f"adds per step ({steps:,} bare and reported steps, interleaved)")
    print("| live count | added per step, mean (amortised) | median | counts taken |")
    print("|---|---|---|---|")
    try:
        for label, budget in (("timed, spaced by its cost (default)", 10e-6),
                              ("at every report (count_budget=inf: before)", float("inf"))):
            reporter = JaxReporter(socket=path, count_budget=budget)
            added, counts = reporter_added(reporter, step_fn, steps)
            print(f"| {label} | {statistics.mean(added) * 1e6:+.1f} us | "
                  f"{statistics.median(added) * 1e6:+.1f} us | {counts} |")
    finally:
        listener.kill()
    del held


def reporter_added(reporter, step_fn, steps: int) -> tuple[list[float], int]:
    """Per step, a reported step's time less the bare step before it; live counts taken."""
    counts = []
    live_count = reporter._live_count
    reporter._live_count = lambda: (lambda n: counts.append(n) or n)(live_count())
    added = []
    for i in range(steps):
        t0 = time.perf_counter()
        step_fn(i)
        t1 = time.perf_counter()
        step_fn(i)
        reporter.step(i)
        added.append((time.perf_counter() - t1) - (t1 - t0))
    return added, sum(n is not None for n in counts)


AT_TEN_A_SECOND = """
import sys, time
sys.path.insert(0, sys.argv[2])
from tpumon.instrument import Reporter
r = Reporter(socket=sys.argv[1], min_interval=0)
if sys.argv[3] == "datagrams":
    r._sender._disconnect()
    r._sender._retry_at = float("inf")
t0 = time.monotonic()
for i in range(200):
    r.step(i)
    time.sleep(max(0, t0 + (i + 1) / 10 - time.monotonic()))
print(r.sent, r.dropped)
"""


def agent_side() -> None:
    """The receiving thread's CPU time and wake-ups per transport (same run)."""
    from tpumon.sources.reports import ReporterSocket

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    print("\n## The agent's receiving thread, one reporter at 10 reports/s for 20 s")
    print("| transport | reports received | thread CPU | per report | wake-ups |")
    print("|---|---|---|---|---|")
    for transport in ("connection", "datagrams", "connection", "datagrams"):
        r = ReporterSocket(os.path.join(tempfile.mkdtemp(), "r.sock"))
        r.start()
        stat = f"/proc/self/task/{r._inlet._thread.native_id}/schedstat"
        try:
            before = [int(v) for v in open(stat).read().split()]
            subprocess.run([sys.executable, "-c", AT_TEN_A_SECOND, str(r.path), root,
                            transport], check=True, capture_output=True)
            time.sleep(0.5)
            after = [int(v) for v in open(stat).read().split()]
            received = r.poll().reports_total
        finally:
            r.stop()
        cpu = (after[0] - before[0]) / 1e9
        print(f"| {transport} | {received} | {cpu * 1e3:.1f} ms | "
              f"{cpu / max(received, 1) * 1e6:.0f} us | {after[2] - before[2]} |")


def last_words_step_cost(calls: int = 20000, rounds: int = 5) -> None:
    """Reporter.step() with the last words installed and without, interleaved call by
    call, both reporting at every step and with the defaults, to an agent side draining."""
    from tpumon.instrument import Reporter

    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    listener = drain(path)
    print("\n## Reporter.step() with last words installed and without (median of "
          f"{calls:,} calls each, interleaved; {rounds} rounds)")
    print("| case | last_words=False | last_words=True (default) |")
    print("|---|---|---|")
    try:
        for label, interval in (("report every step (min_interval=0)", 0.0),
                                ("defaults (at most 20 reports/s)", 0.05)):
            cells = []
            for _ in range(rounds):
                without = Reporter(socket=path, min_interval=interval, last_words=False)
                with_words = Reporter(socket=path, min_interval=interval)
                times: dict[bool, list[float]] = {False: [], True: []}
                for i in range(2 * calls):
                    words = bool(i % 2)
                    reporter = with_words if words else without
                    t0 = time.perf_counter()
                    reporter.step(i)
                    times[words].append(time.perf_counter() - t0)
                with_words.close()
                without.close()
                cells.append((us(times[False]), us(times[True])))
            print(f"| {label} | {' / '.join(c[0] for c in cells)} | "
                  f"{' / '.join(c[1] for c in cells)} |")
    finally:
        listener.kill()


def last_words_loop_cost(steps: int = 10000) -> None:
    """A real JAX loop (when importable) with a reporter with the last words and one
    without, their steps interleaved one by one with bare ones."""
    try:
        from tpumon.instrument import JaxReporter
        step_fn = jax_loop()
    except ImportError:
        return
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    listener = drain(path)
    try:
        for i in range(200):
            step_fn(i)
        print(f"\n## JAX (CPU) loop, {steps:,} steps of each kind interleaved: median step")
        print("| reporter | bare | last_words=False | last words on |")
        print("|---|---|---|---|")
        for label, interval in (("defaults", 0.05), ("every step", 0.0)):
            reporters = {False: JaxReporter(socket=path, min_interval=interval,
                                            last_words=False),
                         True: JaxReporter(socket=path, min_interval=interval)}
            times: dict[object, list[float]] = {"bare": [], False: [], True: []}
            for i in range(3 * steps):
                kind = ("bare", False, True)[i % 3]
                t0 = time.perf_counter()
                step_fn(i)
                if kind != "bare":
                    reporters[kind].step(i)
                times[kind].append(time.perf_counter() - t0)
            for reporter in reporters.values():
                reporter.close()
            print(f"| {label} | " + " | ".join(f"{statistics.median(times[k]) * 1e6:.1f} us"
                                              for k in ("bare", False, True)) + " |")
    finally:
        listener.kill()


EXITING = """
import sys, time
sys.path.insert(0, sys.argv[2])
from tpumon.instrument import Reporter
r = Reporter(socket=sys.argv[1], last_words=sys.argv[3] != "off")
for i in range(5):
    r.step(i)
if sys.argv[4] == "full":  # an agent that never reads: its queue full first
    while r._sender.send(b"x" * 60000, count=False):
        pass
print(time.time(), flush=True)
if sys.argv[4] in ("raise", "full"):
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes.")
"""


def exit_delay(runs: int = 21) -> None:
    """From the last line of a process's code to its parent's wait(): with the last words
    and without, runs interleaved, to an agent side draining (and one never reading)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    listener = drain(path)

    def one(words: str, how: str, where: str) -> float:
        proc = subprocess.Popen([sys.executable, "-c", EXITING, where, root, words, how],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        said = float(proc.stdout.readline())
        proc.wait()
        return time.time() - said

    print(f"\n## Exit: last line of code to the parent's wait(), median of {runs} runs each "
          "(interleaved), to an agent side draining")
    print("| exit | last_words=False | last words on | added |")
    print("|---|---|---|---|")
    try:
        for how in ("normal", "raise"):
            times: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(runs):
                for words in ("off", "on"):
                    times[words].append(one(words, how, path))
            off, on = statistics.median(times["off"]), statistics.median(times["on"])
            print(f"| {how} | {off * 1e3:.1f} ms | {on * 1e3:.1f} ms | "
                  f"{(on - off) * 1e3:+.1f} ms |")
    finally:
        listener.kill()
    from tpumon.instrument.protocol import connection_path
    deaf_path = os.path.join(tempfile.mkdtemp(), "r.sock")
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    deaf.bind(connection_path(deaf_path))
    deaf.listen(16)
    try:
        times = {words: [one(words, "full", deaf_path) for _ in range(max(runs // 3, 3))]
                 for words in ("off", "on")}
    finally:
        deaf.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"| raise, the agent's queue full (never read) | {off * 1e3:.1f} ms | "
          f"{on * 1e3:.1f} ms | {(on - off) * 1e3:+.1f} ms |")


if __name__ == "__main__":
    if sys.argv[1:] == ["last-words"]:
        last_words_step_cost()
        last_words_loop_cost()
        exit_delay()
        sys.exit(0)
    base_reporter()
    agent_side()
    frameworks()
    jax_many_arrays()
    last_words_step_cost()
    last_words_loop_cost()
    exit_delay()
