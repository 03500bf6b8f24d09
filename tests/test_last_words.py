"""A process's last words: the agent's parser (real XLA/PJRT/libtpu wordings, each from the
public thread named beside it), hostile input, and the reporter's hooks in real processes
(the user's own excepthook and atexit still run; a message stays bounded; an exit waits
at most ~100 ms for a full queue)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpumon.instrument.last_words import EXIT_WAIT
from tpumon.instrument.protocol import LAST_WORDS_HEADER, MAX_LAST_WORDS, connection_path
from tpumon.diagnose.job_ends import JobView, judge
from tpumon.diagnose.known_issues import known_issue_said
from tpumon.sources.last_words import (LastWords, OutOfMemory, merge, parse_fatal, parse_message,
                                       parse_oom)
from tpumon.sources.reports import ReporterSocket, pid_alive
from tools import wait_for

FIXTURES = Path(__file__).parent / "fixtures" / "last_words"
GiB, MiB = 2**30, 2**20


def oom(name: str) -> OutOfMemory:
    found = parse_oom((FIXTURES / name).read_text())
    assert found is not None, name
    return found


def test_compile_time_report_with_its_largest_allocations():
    # https://github.com/erfanzar/EasyDeL/issues/166 (JAX on a TPU v4-32)
    o = oom("easydel_166_compile.txt")
    assert (o.when, o.memory_space) == ("compile", "hbm")
    assert o.used_bytes == round(63.80 * GiB) and o.capacity_bytes == round(30.75 * GiB)
    assert o.program_bytes == round(63.80 * GiB)
    first = o.allocations[0]
    assert (first.size_bytes, first.shape, first.dtype) == (2 * GiB, "f32[32,4096,4096]", "f32")
    assert (first.op_name, first.source, first.allocation_type) == (
        "dot_general", "attention_module.py:1059", "HLO temp")
    assert len(o.allocations) == 2 and o.allocations[1].shape is None  # cut off mid-row
    assert o.describe() == ("the program needed 63.80 GiB of 30.75 GiB of hbm; largest: "
                            "f32[32,4096,4096] 2.00 GiB at attention_module.py:1059 "
                            "(dot_general)")


def test_compile_time_report_rows_without_an_operator():
    # https://github.com/sokrypton/ColabFold/issues/62 (AlphaFold on a Colab TPU)
    o = oom("colabfold_62_compile.txt")
    assert (o.used_bytes, o.capacity_bytes) == (round(9.08 * GiB), round(7.48 * GiB))
    assert [a.size_bytes for a in o.allocations] == [124 * MiB, 64 * MiB]
    assert o.allocations[0].source is None and o.allocations[0].shape == "f32[512,245,256]"
    assert (o.allocations[1].op_name, o.allocations[1].source) == (
        "broadcast_in_dim", "mapping.py:177")


@pytest.mark.parametrize("name,requested,free,space,source", [
    ("pytorch_xla_1735_reserve.txt", round(3.95 * GiB), round(1.92 * GiB), "hbm",
     "https://github.com/pytorch/xla/issues/1735"),
    ("trax_431_allocate.txt", round(31.06 * MiB), round(58.64 * MiB), "hbm",
     "https://github.com/google/trax/issues/431"),
    ("colabtools_5126_torch_xla.txt", round(129.50 * MiB), round(78.17 * MiB), "hbm",
     "https://github.com/googlecolab/colabtools/issues/5126"),
    ("jax_14304_could_not_allocate.txt", 10485760, 14942208, "hbm",
     "https://github.com/jax-ml/jax/issues/14304"),
    ("mesh_transformer_jax_209_request.txt", 268435456, None, None,
     "https://github.com/kingoflolz/mesh-transformer-jax/issues/209"),
    ("jax_cpu_zeros.txt", 1 << 42, None, None, "jnp.zeros((1 << 40,)), JAX 0.10.2 on CPU"),
    ("torch_xla_cpu_zeros.txt", 1 << 40, None, None, "torch_xla 2.9 on CPU, then sync()"),
])
def test_runtime_wordings(name, requested, free, space, source):
    o = oom(name)
    assert (o.when, o.requested_bytes, o.free_bytes, o.memory_space) == (
        "runtime", requested, free, space), source


def test_the_reserve_wording_keeps_capacity_and_program():
    o = oom("pytorch_xla_1735_reserve.txt")  # https://github.com/pytorch/xla/issues/1735
    assert (o.capacity_bytes, o.program_bytes) == (8 * GiB, round(4.34 * GiB))
    assert o.describe() == "the program needed 4.34 GiB of 8.00 GiB of hbm"


def test_other_errors_are_not_out_of_memory():
    for text in ("", "ValueError: bad record", "Expected XLA tensor. Got: torch.FloatTensor",
                 "RESOURCE_EXHAUSTED: too many open connections"):
        assert parse_oom(text) is None, text


def message(doc: dict) -> bytes:
    return LAST_WORDS_HEADER + json.dumps(doc).encode()


def test_an_unknown_wording_keeps_its_raw_text_bounded_and_clean():
    words = parse_message(message({
        "kind": "exception", "type": "MyError", "message": "\x1b]0;pwned\x07odd\r" + "x" * 10**6,
        "frame": {"file": "/job/train.py", "line": 7, "function": "main"}}))
    assert words is not None and words.oom is None and words.kind == "exception"
    assert len(words.message) <= 16384 and "\x1b" not in words.message and "\r" not in \
        words.message and words.message.startswith("]0;pwnedodd")
    assert words.describe().startswith("raised MyError: ]0;pwnedodd") and \
        words.describe().endswith("at train.py:7 in main") and len(words.describe()) < 400


@pytest.mark.parametrize("data", [
    b"", b"{}", LAST_WORDS_HEADER, LAST_WORDS_HEADER + b"[" * 100000,
    LAST_WORDS_HEADER + b'{"kind": "nonsense"}', LAST_WORDS_HEADER + b"\xff\xfe",
    LAST_WORDS_HEADER + b'{"kind": "exception", "message": 7, "type": [], "frame": "x"}',
    LAST_WORDS_HEADER + b'{"kind": "exit", "status": 1e400}',
])
def test_hostile_messages_never_raise(data):
    words = parse_message(data)
    assert words is None or isinstance(words, LastWords)
    if words is not None:
        words.describe()
        json.dumps(words.to_json())


def test_faulthandlers_report_names_the_signal_and_the_users_frame():
    text = ('Fatal Python error: Segmentation fault\n\nThread 0x00007f (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
            'Current thread 0x00007e (most recent call first):\n'
            '  File "/venv/lib/python3.11/site-packages/lib/native.py", line 9 in call\n'
            '  File "/job/model.py", line 212 in forward\n'
            '  File "/job/train.py", line 40 in <module>\n')
    words = parse_fatal(text)
    assert (words.kind, words.type) == ("fatal", "SIGSEGV")
    assert words.describe() == ("killed by SIGSEGV at model.py:212 in forward "
                                "(faulthandler's traceback)")


def test_an_exception_then_the_exit_keeps_the_exception_with_the_status():
    armed = parse_message(message({"kind": "armed", "fatal": True}))
    raised = parse_message(message({"kind": "exception", "type": "ValueError", "message": "x"}))
    exited = parse_message(message({"kind": "exit", "status": 1}))
    words = merge(merge(armed, raised), exited)
    assert (words.kind, words.type, words.exited, words.status, words.fatal_armed) == (
        "exception", "ValueError", True, 1, True)
    assert merge(armed, exited).describe() == "exited through Python's exit handlers (status 1)"
    assert not armed.said and armed.describe().startswith("no last words")
    assert merge(words, armed) == armed  # a new process under the same pid: afresh


def test_an_xla_oom_in_the_last_words_makes_the_end_an_hbm_oom():
    view = JobView(pid=7, time=0.0, framework="jax", host_available_bytes=90,
                   host_total_bytes=100)
    text = (FIXTURES / "easydel_166_compile.txt").read_text()
    words = parse_message(message({
        "kind": "exception", "type": "jax.errors.JaxRuntimeError", "message": text,
        "frame": {"file": "/job/model.py", "line": 212, "function": "step"}}))
    assert judge(view, None, 1.0) == ("exited", "memory far from full at the last poll: no "
                                      "chips held, host memory 10% used")
    cause, evidence = judge(view, None, 1.0, words)
    assert cause == "hbm_oom"
    assert evidence == ("the program needed 63.80 GiB of 30.75 GiB of hbm; largest: "
                        "f32[32,4096,4096] 2.00 GiB at attention_module.py:1059 (dot_general) "
                        "(jax.errors.JaxRuntimeError at model.py:212 in step)")
    silent = parse_message(message({"kind": "armed"}))
    assert judge(view, None, 1.0, silent)[1].endswith("(SIGKILL, os._exit, or a signal "
                                                       "Python does not catch)")


def test_sigkill_has_no_last_words_and_the_kernels_word_stands():
    from tpumon.sources.kernel_log import OomKill

    view = JobView(pid=7, time=0.0, framework="jax")
    kill = OomKill(7, 0.0, "Killed process 7 (python)")
    silent = parse_message(message({"kind": "armed", "fatal": True}))
    cause, evidence = judge(view, kill, 1.0, silent)
    assert cause == "host_oom"
    assert evidence.startswith("the kernel killed pid 7 for memory: Killed process 7 (python); "
                               "no last words")
    said_oom = parse_message(message({"kind": "exception", "type": "E",
                                      "message": "Out of memory allocating 8 bytes."}))
    assert judge(view, kill, 1.0, said_oom)[0] == "host_oom"  # the kernel's word first


def test_known_issues_match_on_what_the_process_said():
    cpu = "RuntimeError: Expected XLA tensor. Got: torch.FloatTensor"
    older = "RuntimeError: Input tensor is not an XLA tensor: torch.FloatTensor"
    for text in (cpu, older):
        issue = known_issue_said("torch_xla", "2.9.0", text)
        assert issue is not None and "move the model" in issue.fix
    assert known_issue_said("jax", "0.10.2", cpu) is None
    # torch_xla 2.9, SPMD on 4 CPU devices: a second mark_sharding of a sharded tensor
    twice = ("RuntimeError: Check failed: false: Existing annotation must be cleared first: "
             "goo.gle/debugonly")
    issue = known_issue_said("torch_xla", "2.9.0", twice)
    assert issue is not None and "xs.clear_sharding(t)" in issue.fix
    out_of_memory = "RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes."
    old = known_issue_said("torch_xla", "2.6.0", out_of_memory)
    assert old is not None and old.link.endswith("/8809")
    assert known_issue_said("torch_xla", "2.7.0", out_of_memory) is None
    assert known_issue_said("torch_xla", None, out_of_memory) is None


# ---- the reporter's side, in real processes ---------------------------------------------

JOB = ("import sys, atexit, time, threading\nsys.path.insert(0, {root!r})\n"
       "from tpumon.instrument import Reporter\n"
       "previous = sys.excepthook\n"
       "def mine(*a):\n    print('users excepthook ran', flush=True)\n    previous(*a)\n"
       "sys.excepthook = mine\n"
       "atexit.register(lambda: print('users atexit ran', flush=True))\n"
       "r = Reporter(socket=sys.argv[1])\nr.step(1)\n")


def run_job(tmp_path, body: str, socket_path: Path) -> subprocess.CompletedProcess:
    code = JOB.format(root=str(Path(__file__).parent.parent)) + body
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    return subprocess.run([sys.executable, "-c", code, str(socket_path)], capture_output=True,
                          text=True, timeout=60, env=env)


def heard(r: ReporterSocket, pid: int) -> LastWords:
    return wait_for(lambda: r.poll().last_words.get(pid), 5)


def test_the_users_hooks_still_run_and_the_exception_is_heard(tmp_path, receiver):
    body = "raise KeyError('step 12 ' + 'x' * 200000)\n"
    job = run_job(tmp_path, body, receiver.path)
    assert job.returncode == 1
    assert "users excepthook ran" in job.stdout and "users atexit ran" in job.stdout
    assert "KeyError" in job.stderr  # the default hook, called by the user's, still printed
    pid = int(wait_for(lambda: next(iter(receiver.poll().last_words), None), 5))
    words = heard(receiver, pid)
    assert (words.kind, words.type, words.exited, words.status) == ("exception", "KeyError",
                                                                    True, 1)
    assert words.frame is not None and words.frame.file == "<string>"
    assert len(words.message) <= 16384  # 200 KB said, a 64 KiB message sent, 16 KiB kept


def test_an_exception_whose_message_cannot_be_read_is_still_heard(tmp_path, receiver):
    body = ("class Odd(Exception):\n    def __str__(self):\n        raise ValueError('no')\n"
            "raise Odd()\n")
    job = run_job(tmp_path, body, receiver.path)
    assert job.returncode == 1 and "users excepthook ran" in job.stdout
    [words] = wait_for(lambda: list(receiver.poll().last_words.values()) or None, 5)
    assert (words.kind, words.type) == ("exception", "Odd"), words
    assert words.message == "<the exception's message could not be read>"


def test_a_worker_threads_exception_is_heard_and_the_process_goes_on(tmp_path, receiver):
    body = ("t = threading.Thread(target=lambda: 1 / 0, name='loader')\nt.start()\nt.join()\n"
            "print('main went on', flush=True)\n")
    job = run_job(tmp_path, body, receiver.path)
    assert job.returncode == 0 and "main went on" in job.stdout
    assert "ZeroDivisionError" in job.stderr  # threading's own hook still printed it
    [words] = wait_for(lambda: list(receiver.poll().last_words.values()) or None, 5)
    assert (words.kind, words.thread, words.type, words.exited) == (
        "thread_exception", "loader", "ZeroDivisionError", True)


@pytest.mark.parametrize("body,signal", [
    ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGBUS)\n", "SIGBUS"),
])
def test_a_fatal_signal_is_heard_through_the_pipe(tmp_path, receiver, body, signal):
    job = run_job(tmp_path, body, receiver.path)
    assert job.returncode < 0  # still dies of its signal
    words = wait_for(lambda: next((w for w in receiver.poll().last_words.values()
                                   if w.kind == "fatal"), None), 5)
    assert words.type == signal and words.frame is not None and words.frame.line
    assert "users atexit ran" not in job.stdout  # nothing in Python runs after one


def test_a_forked_childs_crash_is_not_the_jobs_last_words(tmp_path, receiver):
    """A data loader's worker (forked) dies of SIGABRT; the job goes on and exits: its
    end is an exit, not the child's signal (the child has no faulthandler of ours)."""
    body = ("import os\npid = os.fork()\nif pid == 0:\n    os.abort()\n"
            "print('child', os.waitpid(pid, 0)[1] & 0x7f, flush=True)\n")
    job = run_job(tmp_path, body, receiver.path)
    assert job.returncode == 0 and "child 6" in job.stdout, job.stderr
    [words] = wait_for(lambda: [w for w in receiver.poll().last_words.values() if w.exited]
                       or None, 5)
    assert (words.kind, words.exited, words.fatal_armed) == (None, True, True)
    time.sleep(0.3)
    assert all(w.kind != "fatal" for w in receiver.poll().last_words.values())


def test_a_job_that_dies_before_its_forked_worker_is_heard_at_once(tmp_path, receiver):
    """A data loader's worker (forked, no exec) outlives the job for a while: the job's
    SIGABRT is heard as the job dies, not when the worker exits (the worker held the
    connection open, so its end, and the traceback read at it, came only then)."""
    body = ("import os, time\npid = os.fork()\nif pid == 0:\n"
            "    null = os.open(os.devnull, os.O_RDWR)\n    os.dup2(null, 1)\n"
            "    os.dup2(null, 2)\n    time.sleep(30)\n    os._exit(0)\n"
            "print('worker', pid, flush=True)\nos.abort()\n")
    job = run_job(tmp_path, body, receiver.path)
    worker = int(job.stdout.split("worker ")[1].split()[0])
    try:
        assert job.returncode == -6, job.stderr
        words = wait_for(lambda: next((w for w in receiver.poll().last_words.values()
                                       if w.kind == "fatal"), None), 5)
        assert words.type == "SIGABRT"
        assert pid_alive(worker)  # heard while the worker lives on
    finally:
        os.kill(worker, 9)


def _flood_own_share(path: Path) -> socket.socket:
    """Fill this user's share of the agent's inbox (1 MiB between two polls) with
    snapshot-sized messages, until the inlet stops reading this user's connection."""
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    flood.connect(connection_path(path))
    flood.setblocking(False)
    chunk, sent, refused_since = b"{" + b" " * 60000, 0, None
    while True:
        try:
            sent += flood.send(chunk)
            refused_since = None
        except BlockingIOError:
            refused_since = refused_since or time.monotonic()
            if sent > 1 << 20 and time.monotonic() - refused_since > 0.5:
                return flood  # past the share and no longer read: paused
            assert sent < 8 << 20, "the inlet kept reading past the user's share"
            time.sleep(0.01)


def test_last_words_are_kept_when_the_users_share_of_the_inbox_is_full(tmp_path, receiver):
    """A user's other processes filled its share of the inbox (a job streaming snapshots):
    a process of that user that dies now is still heard, an XLA OOM report of 63 KB (what
    was left of the share is less than one snapshot message: it was dropped as "backlog")."""
    receiver.poll()
    flood = _flood_own_share(receiver.path)
    try:
        dying = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        dying.connect(connection_path(receiver.path))
        dying.send(LAST_WORDS_HEADER + json.dumps(
            {"kind": "exception", "type": "RuntimeError",
             "message": "RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                        "2.00G." + " " * 63000}).encode())
        dying.close()
        time.sleep(0.3)  # the inlet reads it
        reading = receiver.poll()
        assert reading.dropped_total["backlog"] > 0  # the flood did pass its share
        words = reading.last_words.get(os.getpid())
        assert words is not None and words.type == "RuntimeError", reading.last_words
        assert words.oom is not None
    finally:
        flood.close()


def test_eight_processes_dying_at_once_are_all_heard():
    """One process per chip, eight, OOM together, each with a 63 KB report: the words'
    reserve (256 KiB) holds three of them, the user's share the rest (a first version of
    the reserve dropped four as "backlog")."""
    from tpumon.sources.reporter_inlet import Arrival
    from tpumon.sources.reporter_inlet import CREDS

    r = ReporterSocket(Path("/nonexistent/r.sock"))
    said = LAST_WORDS_HEADER + json.dumps({"kind": "exception", "type": "XlaRuntimeError",
                                           "message": "RESOURCE_EXHAUSTED" + " " * 63000}).encode()
    batch = [Arrival(said, [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS,
                             CREDS.pack(os.getpid() + k, os.getuid(), os.getgid()))], 0, None)
             for k in range(8)]
    assert r._keep(batch) == set()  # nobody paused
    reading = r.poll()
    assert reading.dropped_total["backlog"] == 0
    assert len(reading.last_words) == 8


def test_no_agent_costs_the_exit_nothing_and_raises_nothing(tmp_path):
    body = "raise SystemExit(0)\n"
    started = time.monotonic()
    job = run_job(tmp_path, body, tmp_path / "nobody.sock")
    assert job.returncode == 0 and job.stderr == "" and "users atexit ran" in job.stdout
    assert time.monotonic() - started < 30


def test_a_full_queue_delays_the_exit_by_at_most_exit_wait(tmp_path):
    """An agent that accepted the connection but never reads: the exception's message and
    the exit's together wait EXIT_WAIT at most, then go."""
    from tpumon.instrument.protocol import connection_path
    path = tmp_path / "deaf.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(connection_path(str(path)))
    listener.listen(4)
    body = ("import os\nfor i in range(100000):\n"
            "    if not r._sender.send(b'x' * 60000, count=False):\n        break\n"
            "t = time.monotonic()\n"
            "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
            "    r._last_words._excepthook(type(e), e, e.__traceback__)\n"
            "r._last_words._at_exit()\n"
            "print('exit took', time.monotonic() - t, flush=True)\n")
    try:
        job = run_job(tmp_path, body, path)
    finally:
        listener.close()
    took = float(job.stdout.split("exit took ")[1].split()[0])
    assert EXIT_WAIT - 0.005 <= took <= EXIT_WAIT + 0.03, took


def test_a_message_never_exceeds_its_bound():
    from tpumon.instrument.last_words import _encode
    payload = _encode({"kind": "exception", "type": "E", "message": "\u2603" * 100000,
                       "traceback": "\u2603" * 100000})
    assert len(payload) <= MAX_LAST_WORDS
    assert parse_message(payload).type == "E"


def test_descriptors_passed_to_the_agent_are_pipes_kept_once_or_closed(tmp_path, receiver):
    """A reporter may hand the agent one pipe per connection (faulthandler's); anything
    else passed (a file as the pipe: the connection is closed, a pipe with a report) is
    closed at once, and the pipe is read and closed when its connection ends: the agent's
    descriptors come back to what they were."""
    import array

    from tpumon.instrument.protocol import FATAL_HEADER, connection_path

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def connected() -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(connection_path(str(receiver.path)))
        return conn

    def passing(conn: socket.socket, data: bytes, fd: int) -> None:
        conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])

    receiver.poll()
    before = open_fds()
    with open(tmp_path / "f", "w") as f, connected() as bad:
        passing(bad, FATAL_HEADER, f.fileno())  # not a pipe: the connection is closed
        receiver.poll()
        assert bad.recv(16) == b""
    read, write = os.pipe()
    with connected() as conn:
        passing(conn, b'{"v": 1, "step": 1, "framework": "x", "time": 1}', read)  # on a report
        receiver.poll()
        assert os.getpid() in receiver.poll().processes  # the report counts, the pipe not
        os.close(read)
        read2, write2 = os.pipe()
        passing(conn, FATAL_HEADER, read2)
        os.close(read2)
        os.write(write2, b"Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent "
                         b'call first):\n  File "/job/train.py", line 5 in main\n')
        receiver.poll()
        assert receiver.poll().last_words == {}  # read only when the connection ends
    words = wait_for(lambda: receiver.poll().last_words.get(os.getpid()), 5)
    assert words.describe() == "killed by SIGABRT at train.py:5 in main (faulthandler's traceback)"
    os.close(write)
    os.close(write2)
    assert open_fds() == before
