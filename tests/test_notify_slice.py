"""One page per slice: a slice-wide condition (a leak, an OOM forecast) seen by every
worker of a slice is one PagerDuty incident, its dedup key naming the slice and the
alert; a resolve of one chip does not close the incident other chips of the host still
hold; per-host conditions and hosts outside a slice keep their own keys; every Slack line
names the slice and the worker. Delivery goes to tests/fake_alert_apis.py's endpoints."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from fake_alert_apis import FakeAlertAPI
from test_notify import (IDENT, SETTINGS, Feed, healthy, leak, notifier, pd_channel,
                         run_until, slack_channel, snap)
from tpumon.common.identity import Identity
from tpumon.notify.alerts import HIGH, LEAK, OOM, AlertTracker
from tpumon.notify.outbox import Outbox

GiB = 2**30


class WorkerFeed(Feed):
    """A feed of one worker of the slice (its own host and worker id)."""

    def __init__(self, identity: Identity) -> None:
        super().__init__()
        self.identity = identity

    def publish(self, assessments: dict, **kw) -> None:
        super().publish(assessments, **kw)
        self.current = replace(self.current, identity=self.identity)


def test_keys_of_slice_wide_and_per_host_conditions():
    now = 1000.0
    tracker = AlertTracker(SETTINGS)
    got = {(t.alert.name, t.alert.subject): t.alert for t in tracker.update(
        snap(now, {"0": leak(2.0, now), "1": leak(2.0, now)}, used=31 * GiB))}
    assert got[(OOM, "chip 0")].incident_key == got[(OOM, "chip 1")].incident_key == \
        "tpumon/slice/llama-pod-a/TPUMonOOMForecast"
    assert got[(LEAK, "chip 0")].incident_key == "tpumon/slice/llama-pod-a/TPUMonHBMLeakSuspected"
    # The outbox still knows each chip's alert on its own.
    assert got[(OOM, "chip 0")].key != got[(OOM, "chip 1")].key
    # A host outside any slice keeps the per-host key; so does a per-host condition.
    alone = replace(got[(OOM, "chip 0")], slice="")
    assert alone.incident_key == alone.key == f"tpumon/{IDENT.host}/{OOM}/chip0"
    high = replace(got[(OOM, "chip 0")], name=HIGH)
    assert high.incident_key == high.key


def test_four_workers_seeing_one_leak_open_one_incident():
    feeds = [WorkerFeed(Identity(f"t1v-n-pod-w-{w}", str(w), "v4-32", "llama-pod-a"))
             for w in range(4)]
    with FakeAlertAPI("pagerduty") as api:
        notifiers = [notifier(f, Outbox(None), pd_channel(api)) for f in feeds]
        for feed in feeds:
            now = time.time()
            feed.publish({c: leak(2.0, now) for c in "0123"})
        for n in notifiers:  # each worker's four chips' OOM forecasts (critical) delivered
            run_until(n, lambda n=n: n.health().channels[0].delivered_total == 4)
        triggers = [r.body for r in api.accepted if r.body["event_action"] == "trigger"]
        assert len(triggers) == 16  # every worker says what it sees...
        assert {t["dedup_key"] for t in triggers} == \
            {"tpumon/slice/llama-pod-a/TPUMonOOMForecast"}  # ...into one incident
        assert {t["payload"]["source"] for t in triggers} == {f"t1v-n-pod-w-{w}"
                                                                for w in range(4)}
        assert {t["payload"]["group"] for t in triggers} == {"llama-pod-a"}


@pytest.mark.slow
def test_a_chip_that_recovers_does_not_close_the_incident_its_neighbours_hold():
    feed = Feed()
    with FakeAlertAPI("pagerduty") as api:
        n = notifier(feed, Outbox(None), pd_channel(api),
                     tracker=AlertTracker(replace(SETTINGS, resolve_after_seconds=0.2)))
        now = time.time()
        feed.publish({"0": leak(2.0, now), "1": leak(2.0, now)})
        run_until(n, lambda: len(api.accepted) == 2)
        feed.publish({"0": healthy(), "1": leak(2.0, now)})
        n.step()
        time.sleep(0.3)
        feed.publish({"0": healthy(), "1": leak(2.0, now)})
        for _ in range(5):  # chip 0's resolve is recorded, and not sent
            time.sleep(min(n.step(), 0.05))
        assert [r.body["event_action"] for r in api.accepted] == ["trigger", "trigger"]
        assert n.health().channels[0].pending == 0
        feed.publish({"0": healthy(), "1": healthy()})
        n.step()
        time.sleep(0.3)
        feed.publish({"0": healthy(), "1": healthy()})
        run_until(n, lambda: len(api.accepted) == 3)
        resolve = api.accepted[2].body
        assert resolve["event_action"] == "resolve"
        assert resolve["dedup_key"] == "tpumon/slice/llama-pod-a/TPUMonOOMForecast"


def test_every_slack_line_names_the_slice_and_the_worker():
    feed = Feed()
    with FakeAlertAPI("slack") as api:
        n = notifier(feed, Outbox(None), slack_channel(api))
        feed.publish({"0": leak(2.0, time.time()), "2": leak(30.0, time.time())})
        run_until(n, lambda: len(api.accepted) == 3)  # one line a message
        lines = [line for r in api.accepted for line in r.body["text"].splitlines()]
        assert len(lines) == 3
        for line in lines:
            assert "(worker 3, slice llama-pod-a, v4-32)" in line, line
