"""Signals reach the agent's events without deadlocking its main thread (tpumon.common.signals).

A handler that set an Event itself could hang the agent at SIGTERM: the handler runs in
the main thread, sometimes just after that thread, asleep in ``stop.wait()``, took the
event's lock back. The child below spends nearly all its time inside such waits, a
storm of SIGHUPs lands in them, and SIGTERM must still stop it, promptly."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.e2e  # starts agents or external servers: seconds each

CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    from tpumon.common.signals import Stop, signals_to_events

    stop, reload = Stop(), threading.Event()   # as tpumon.cli.agent makes them
    reloads = 0
    with signals_to_events({signal.SIGTERM: stop, signal.SIGHUP: reload}):
        print("ready", flush=True)
        while not stop.wait(0.00001):      # the agent's poll loop, at its most exposed
            if reload.wait(0.00001):
                reload.clear()
                reloads += 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL   # handlers given back
    assert signal.set_wakeup_fd(-1) == -1                       # and the wakeup fd
    print("reloads", reloads, "threads", threading.active_count(), flush=True)
""")


def test_a_storm_of_signals_neither_deadlocks_nor_loses_the_stop():
    child = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", CHILD],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        for _ in range(400):
            os.kill(child.pid, signal.SIGHUP)
            time.sleep(0.002)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGABRT)  # faulthandler shows where it hung
            out, err = child.communicate(timeout=10)
            raise AssertionError(f"still running 30 s after SIGTERM:\n{err[-4000:]}")
    assert child.returncode == 0, err[-4000:]
    words = out.split()
    assert words[0] == "reloads" and int(words[1]) >= 1  # SIGHUP reached its event
    assert words[2:] == ["threads", "1"]                  # the relay thread is gone
