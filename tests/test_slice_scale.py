"""`status --slice` at pod scale (issue 44): 256 workers' agents from one process
(tpumon.sim.agents), 10 % refusing and 10 % answering only after 30 s. The real CLI
answers without waiting for the slow ones, counts who answered, and marks each late or
down peer; the number of requests in flight is bounded; a peer that trickles its answer
(never silent long enough for a socket timeout) does not hold the command at exit."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from tools import TPUMON, clean_env, free_port, wait_for
from tpumon.sim.agents import AgentFleet, FleetSpec
from tpumon.client.slice import ClientOptions, ask_all

HOSTS, DOWN, SLOW, LEAKING = 256, 26, 26, 8
SIM_AGENTS = [sys.executable, "-m", "tpumon.sim.agents"]


@pytest.fixture
def fleet():
    spec = FleetSpec.spread(HOSTS, free_port(), DOWN, SLOW, seed=44, slow_seconds=30.0,
                            leaking=frozenset(range(LEAKING)))
    agents = AgentFleet(spec)
    yield spec
    agents.close()


def run_slice(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    result = subprocess.run([*TPUMON, "status", "--slice", *args], capture_output=True,
                            text=True, env={**clean_env(), "COLUMNS": "120"}, timeout=timeout)
    return result, time.monotonic() - began


@pytest.mark.e2e
def test_256_peers_some_down_some_slow(fleet):
    peers = ",".join(fleet.peers())
    # a deadline generous for a loaded 2-core VM (every up agent must make it), far short of
    # the slow agents' 30 s: they are not waited on
    result, took = run_slice("--peers", peers, "--format", "json", "--deadline", "5")
    assert result.returncode == 0, result.stderr
    assert took < 15, f"waited for the slow peers? {took:.1f} s"
    doc = json.loads(result.stdout)
    answered = HOSTS - DOWN - SLOW
    leaking = len(fleet.leaking - fleet.down - fleet.slow)
    assert 0 < leaking < LEAKING  # some of the leaking workers do not answer
    assert doc["summary"].startswith(
        f"v4-2048 slice pod-sim: {answered} of {HOSTS} workers answered, {4 * answered} "
        f"chips; {4 * leaking} leaking, {4 * (answered - leaking)} ok, first OOM w-"), \
        doc["summary"]
    assert f"; {DOWN} down, {SLOW} late (" in doc["summary"], doc["summary"]
    states = {w["peer"]: (w["state"], w["error"]) for w in doc["workers"]}
    for worker, peer in enumerate(fleet.peers()):
        state, error = states[peer]
        if worker in fleet.down:
            assert state == "down" and "refused" in error.lower(), (peer, error)
        elif worker in fleet.slow:
            assert (state, error) == ("late", "no answer within 5 s"), (peer, error)
        else:
            assert (state, error) == ("up", None), (peer, error)
    assert len(doc["chips"]) == 4 * answered
    assert {c["worker"] for c in doc["chips"]} == \
        {str(w) for w in range(HOSTS) if w not in fleet.down | fleet.slow}

    result, took = run_slice("--peers", peers, "--deadline", "5")  # every missing one a row
    assert result.returncode == 0 and took < 15, (took, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"v4-2048 slice pod-sim: {answered} of {HOSTS} workers")
    for worker, peer in enumerate(fleet.peers()):
        if worker in fleet.down | fleet.slow:
            state = "down" if worker in fleet.down else "late"
            assert any(peer in line and f" {state} " in line for line in lines), peer
            assert sum(line.startswith(f"http://{peer}: {state}: ") for line in lines) == 1


@pytest.mark.slow
def test_requests_in_flight_are_bounded():
    """32 agents that each take 0.2 s, 8 asked at a time: at least 4 rounds of 0.2 s (a
    lower bound: a busy host cannot make it shorter)."""
    spec = FleetSpec(32, free_port(), slow=frozenset(range(32)), slow_seconds=0.2)
    agents = AgentFleet(spec)
    try:
        began = time.monotonic()
        answers = ask_all(spec.peers(), 0, ClientOptions(), deadline=20, in_flight=8)
        took = time.monotonic() - began
    finally:
        agents.close()
    assert [a.state for a in answers] == ["up"] * 32, answers
    assert took >= 4 * 0.2, f"more than 8 at a time? {took:.2f} s"


@pytest.mark.e2e
def test_a_peer_that_trickles_its_answer_does_not_hold_the_command():
    """Its headers come a byte every 0.2 s, so no read waits as long as the deadline and
    the socket's timeout never fires; the command still ends at its deadline."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X" * 1000:
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    try:
        result, took = run_slice("--peers", f"127.0.0.1:{listener.getsockname()[1]}",
                                 "--format", "json", "--deadline", "1", timeout=30)
    finally:
        stop.set()
        listener.close()
    assert result.returncode == 0, result.stderr
    assert took < 10, f"held by the trickling peer: {took:.1f} s"
    [worker] = json.loads(result.stdout)["workers"]
    assert (worker["state"], worker["error"]) == ("late", "no answer within 1 s"), worker


@pytest.mark.e2e
def test_the_simulated_agents_command():
    """`python -m tpumon.sim.agents` prints the --peers list and serves until SIGTERM;
    bad input is one line."""
    port = free_port()
    fleet = subprocess.Popen([*SIM_AGENTS, "--hosts", "6",
                              "--down", "1", "--slow", "2", "--leaking", "2", "--port",
                              str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=clean_env())
    try:
        peers = fleet.stdout.readline().strip()
        assert peers.split(",") == [f"127.0.0.{k}:{port}" for k in range(1, 7)], peers
        result, _ = run_slice("--peers", peers, "--format", "json", "--deadline", "5")
        assert result.returncode == 0, result.stderr
        states = [w["state"] for w in json.loads(result.stdout)["workers"]]
        assert sorted(states) == ["down", "late", "late", "up", "up", "up"], states
        # the port is taken now: one line naming the address
        taken = subprocess.run([*SIM_AGENTS, "--hosts", "1",
                                "--port", str(port)], capture_output=True, text=True,
                               env=clean_env(), timeout=30)
        assert taken.returncode == 2 and "Traceback" not in taken.stderr, taken.stderr
        assert taken.stderr.strip() == (f"python -m tpumon.sim.agents: cannot serve worker 0 "
                                        f"on 127.0.0.1:{port}: Address already in use")
    finally:
        fleet.terminate()
        assert fleet.wait(timeout=30) == 0
    bad = subprocess.run([*SIM_AGENTS, "--hosts", "4", "--down",
                          "5"], capture_output=True, text=True, env=clean_env(), timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "python -m tpumon.sim.agents: 5 down and 0 slow of 4 workers", bad.stderr


@pytest.mark.e2e
def test_watch_slice_at_256_peers_in_a_real_terminal(fleet, tmp_path):
    """The same fleet in `watch --slice`: the count line on an 80-column screen, redrawn
    every round though the slow agents never answer in time, and Ctrl-C quits at once."""
    from test_watch import Tmux

    peers = tmp_path / "peers"
    peers.write_text(",".join(fleet.peers()))
    term = Tmux(tmp_path, f'{sys.executable} -m tpumon watch --slice --peers "$(cat {peers})" '
                          "--deadline 5 --interval 0.2")
    try:
        answered = HOSTS - DOWN - SLOW
        summary = (f"v4-2048 slice pod-sim: {answered} of {HOSTS} workers answered, "
                   f"{4 * answered} chips;")
        first = wait_for(lambda: (s := term.screen()) and summary in " ".join(s.split())
                         and s, 60)
        assert f"{DOWN} down, {SLOW} late" in " ".join(first.split()), first
        clock = re.compile(r"\d\d:\d\d:\d\d")
        drawn_at = clock.search(first).group()
        # a later round: the clock in the header moves on (each round waits the 5 s deadline)
        wait_for(lambda: (m := clock.search(term.screen())) and m.group() != drawn_at, 30)
        began = time.monotonic()
        term.quit()
        assert time.monotonic() - began < 15, "Ctrl-C waited for the slow agents"
    finally:
        term.close()
