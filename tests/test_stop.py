"""tpumon.common.signals.Stop: the agent's stop event, a threading.Event whose wait is one lock
acquire. Every waiter wakes at the one set, a wait without it lasts its timeout."""

from __future__ import annotations

import threading
import time

import pytest

from tpumon.common.signals import Stop


def test_a_wait_lasts_its_timeout_and_says_the_stop_did_not_come():
    stop = Stop()
    started = time.monotonic()
    assert stop.wait(0.05) is False
    assert time.monotonic() - started >= 0.05
    assert stop.wait(0) is False and stop.wait(-1) is False and not stop.is_set()


def test_every_waiter_wakes_at_the_set_however_it_waits():
    stop = Stop()
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda t=t: woke.append(stop.wait(t)))
               for t in (None, 30.0, None, 30.0, 30.0)]
    for w in waiters:
        w.start()
    time.sleep(0.05)  # all asleep in the gate
    started = time.monotonic()
    stop.set()
    for w in waiters:
        w.join(5)
    assert woke == [True] * 5 and time.monotonic() - started < 5
    assert stop.is_set() and stop.wait(0) is True and stop.wait() is True  # stays open


def test_a_second_set_from_another_thread_changes_nothing():
    stop = Stop()
    setters = [threading.Thread(target=stop.set) for _ in range(8)]
    for s in setters:
        s.start()
    for s in setters:
        s.join(5)
    assert stop.is_set() and all(stop.wait(1) for _ in range(3))
    stop.set()
    assert stop.wait(0)


def test_a_stop_cannot_be_cleared():
    stop = Stop()
    stop.set()
    with pytest.raises(TypeError):
        stop.clear()
    assert stop.is_set()
