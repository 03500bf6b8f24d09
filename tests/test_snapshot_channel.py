"""The snapshot control channel: the agent's socket asks a reporter for two live-tensor
snapshots, the reporter answers from its training loop, the agent diffs them.

Real sockets and the real reporter and receiver; the snapshots are made up (a fake
framework that keeps one f32[] per step), the frameworks' own are in tests/frameworks/.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tools import FakeReporter, wait_for
from tpumon.web import snapshot_api
from tpumon.instrument.protocol import encode_part, encode_request
from tpumon.instrument.snapshot import make_snapshot
from tpumon.sources.reports import ReporterSocket

SITE = "train.py:88 (loss = model(x).mean())"


class LeakyReporter(FakeReporter):
    """Weights that stay, plus one kept f32[] per step (the classic losses.append)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tracking = False
        self.snapshots_taken: list[int] = []

    def take_snapshot(self, step: int):
        self.snapshots_taken.append(step)
        counts = {((1024, 1024), "float32", "", None): [4, 4 * 4 * 2**20],
                  ((), "float32", "", SITE if self.tracking else None): [step, 4 * step]}
        return make_snapshot(self.framework, step, time.perf_counter(), self.tracking, counts)

    def start_tracking(self) -> bool:
        self.tracking = True
        return True

    def stop_tracking(self) -> None:
        self.tracking = False


def heard(r: ReporterSocket, pid: int = os.getpid()):
    return wait_for(lambda: r.poll().processes.get(pid), 5)


def run_steps(reporter, r, first: int, last: int) -> None:
    """Steps as a training loop makes them, with the agent polling meanwhile."""
    for step in range(first, last + 1):
        reporter.step(step)
        if step % 10 == 0:
            r.poll()


def test_two_snapshots_steps_apart_are_diffed_into_what_grew(receiver):
    reporter = LeakyReporter(socket=str(receiver.path), min_interval=0)
    reporter.step(1)
    assert heard(receiver).snapshots
    asked = receiver.request_snapshot(os.getpid(), 50, "asked")
    assert asked.pending and asked.error is None
    step = 1

    def answered():  # the loop goes on stepping, as training does
        nonlocal step
        run_steps(reporter, receiver, step + 1, step + 10)
        step += 10
        result = receiver.poll().snapshots[os.getpid()]
        return None if result.pending else result

    result = wait_for(answered, 30)
    assert result.error is None and result.request_id == asked.request_id
    first, second = reporter.snapshots_taken
    assert second - first == 50 and (result.before.step, result.after.step) == (first, second)
    [grown] = result.diff.grown
    assert grown.label() == "f32[]" and grown.count_per_step == 1.0
    assert grown.sites == {SITE: 50}  # tracked between the two: the new ones' site
    assert not reporter.tracking  # and stopped after the second
    text = result.diff.summary(hbm_bytes_per_step=8.0)
    assert text.startswith("likely leak: +1 f32[] per step (4 B each, 50% of the growth)")
    assert SITE in text


def test_one_request_open_per_process_and_none_for_a_reporter_without_snapshots(receiver):
    FakeReporter(socket=str(receiver.path), min_interval=0).step(1)
    assert not heard(receiver).snapshots
    result = receiver.request_snapshot(os.getpid(), 10, "asked")
    assert not result.pending and "takes no snapshots" in result.error
    assert "no reporting process 1" in receiver.request_snapshot(1, 10, "asked").error


def test_an_open_request_is_not_asked_twice_and_expires_without_an_answer(tmp_path):
    now = [1000.0]
    r = ReporterSocket(tmp_path / "r.sock", clock=lambda: now[0])
    r.start()
    try:
        reporter = LeakyReporter(socket=str(r.path), min_interval=0)
        reporter.step(1)
        heard(r)
        first = r.request_snapshot(os.getpid(), 1000, "leak on chip 0")
        again = r.request_snapshot(os.getpid(), 10, "asked")
        assert again.request_id == first.request_id and again.reason == "leak on chip 0"
        reporter.step(2)  # the first snapshot; the second would come at step 1002
        now[0] += 3601
        reporter.step(3)  # keeps the process alive
        result = wait_for(lambda: r.poll().snapshots[os.getpid()]
                          if not r.poll().snapshots[os.getpid()].pending else None, 5)
        assert "no answer within 3600 s" in result.error and result.diff is None
    finally:
        r.stop()


def test_answers_that_were_not_asked_for_are_dropped(receiver):
    reporter = LeakyReporter(socket=str(receiver.path), min_interval=0)
    reporter.step(1)
    heard(receiver)
    snap = make_snapshot("fake", 1, time.perf_counter(), False, {})
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(encode_part("0123456789abcdef", 0, snap.to_json()), str(receiver.path))
        s.sendto(b"TPUMON-SNAPSHOT 1 0123456789abcdef 0\n{not json", str(receiver.path))
        s.sendto(b"TPUMON-SNAPSHOT 9 x 0\n{}", str(receiver.path))
    dropped = wait_for(lambda: receiver.poll().dropped_total
                       if sum(receiver.poll().dropped_total.values()) == 3 else None, 5)
    assert dropped["forbidden"] == 2 and dropped["malformed"] == 1  # unknown id twice


def test_another_process_cannot_answer_for_the_one_asked(receiver):
    """The answer's pid is the kernel's: a second process that learns the request id
    (it is in no datagram it can read, but suppose) still cannot answer it."""
    reporter = LeakyReporter(socket=str(receiver.path), min_interval=0)
    reporter.step(1)
    heard(receiver)
    asked = receiver.request_snapshot(os.getpid(), 50, "asked")
    snap = make_snapshot("fake", 1, time.perf_counter(), False, {})
    code = ("import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
            "s.sendto(bytes.fromhex(sys.argv[2]), sys.argv[1])")
    payload = encode_part(asked.request_id, 0, snap.to_json()).hex()
    subprocess.run([sys.executable, "-c", code, str(receiver.path), payload], check=True)
    wait_for(lambda: receiver.poll().dropped_total["forbidden"] == 1, 5)
    assert receiver.poll().snapshots[os.getpid()].pending


def test_the_reporter_takes_requests_only_from_the_agents_socket(tmp_path, receiver):
    """A reporter sending datagrams (its connection refused, or an agent of an earlier
    version): its socket's abstract address is visible in /proc/net/unix, and a request
    from any other socket is ignored (a snapshot costs the training loop a walk of its
    objects). On a connection only the agent can send."""
    reporter = LeakyReporter(socket=str(receiver.path), min_interval=0)
    reporter._sender._disconnect()  # datagrams for the next RETRY_SECONDS
    reporter.step(1)
    heard(receiver)
    address = receiver._replies[os.getpid()].address
    assert address and address.startswith(b"\0")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(tmp_path / "impostor.sock"))
        s.sendto(encode_request("0123456789abcdef", 5, True), address)
    for step in range(2, 20):
        reporter.step(step)
    assert reporter.snapshots_taken == [] and not reporter.tracking


def test_a_reporter_whose_agent_is_gone_keeps_training(tmp_path, monkeypatch):
    """A request arrives, the agent goes away before the answers: sending fails quietly,
    each answer is tried again at later steps until SEND_SECONDS, then given up; steps go
    on throughout."""
    from tpumon.instrument import snapshot_job
    monkeypatch.setattr(snapshot_job, "SEND_SECONDS", 0.3)
    r = ReporterSocket(tmp_path / "r.sock")
    r.start()
    reporter = LeakyReporter(socket=str(r.path), min_interval=0)
    reporter.step(1)
    heard(r)
    r.request_snapshot(os.getpid(), 5, "asked")
    r.stop()
    for step in range(2, 20):
        reporter.step(step)
    assert reporter._job is not None  # the first answer is still being tried
    deadline = time.monotonic() + 5
    step = 20
    while reporter._job is not None and time.monotonic() < deadline:
        step += 1
        reporter.step(step)
        time.sleep(0.01)
    assert len(reporter.snapshots_taken) == 2 and reporter._job is None
    assert not reporter.tracking and reporter.dropped > 0


@pytest.mark.parametrize("environ,status", [
    ({"REQUEST_METHOD": "GET", "REMOTE_ADDR": "127.0.0.1"}, "405"),
    ({"REQUEST_METHOD": "POST", "REMOTE_ADDR": "10.1.2.3"}, "403"),
    ({"REQUEST_METHOD": "POST", "REMOTE_ADDR": "::1", "QUERY_STRING": "pid=x"}, "400"),
    ({"REQUEST_METHOD": "POST", "REMOTE_ADDR": "127.0.0.1", "QUERY_STRING": "pid=4242"}, "400"),
])
def test_snapshot_api_refuses_what_it_should(receiver, environ, status):
    from tpumon.common.identity import Identity
    from tpumon.sources.chips import ChipInventory
    from tpumon.state import PollState
    snap = PollState(time=0.0, identity=Identity("vm"), inventory=ChipInventory(None, 0))
    got, doc = snapshot_api.handle(environ, snap, receiver.request_snapshot)
    assert got.startswith(status) and doc["error"]
    json.dumps(doc)
