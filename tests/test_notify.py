"""Direct notifiers: alert conditions and hold-downs, the outbox, and delivery to loopback
servers that answer as Slack and PagerDuty do (tests/fake_alert_apis.py)."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import replace
import time
from pathlib import Path

import numpy as np
import pytest

from fake_alert_apis import FakeAlertAPI
from tpumon.detect import Assessment, ChipDetector, Verdict
from tpumon.diagnose.counts import CountTrend
from tpumon.common.identity import Identity
from tpumon.notify.alerts import (HIGH, LEAK, OOM, STALLED, Alert, AlertSettings,
                                  AlertTracker, Transition, describe_band)
from tpumon.notify.notifier import Notifier
from tpumon.notify.outbox import Outbox
from tpumon.notify.pagerduty import PagerDutyChannel
from tpumon.notify.slack import SlackChannel
from tpumon.diagnose.processes import ProcessState
from tpumon.common.samples import ChipSample, RuntimeReading
from tpumon.sim.tracegen import generate_trace
from tpumon.sources.chips import inventory_for
from tpumon.sources.reports import ProcessReport
from tpumon.state import PollState

GiB = 2**30
TOTAL = 32 * GiB
IDENT = Identity("t1v-n-0a1b2c3d-w-3", "3", "v4-32", "llama-pod-a")
SETTINGS = AlertSettings(dashboard_url="https://grafana.example/d/tpumon?var-host={host}"
                         "&var-chip={chip}", report_url="http://{host}:9847/report")


def leak(eta_hours: float, now: float, per_step: float | None = 150e3) -> Assessment:
    return Assessment(Verdict.LEAK, "floor grows", floor_bytes=20 * GiB, total_bytes=TOTAL,
                      slope_bytes_per_second=3e5, slope_bytes_per_step=per_step,
                      predicted_oom_time=now + eta_hours * 3600,
                      predicted_oom_step=None if per_step is None else 48_200,
                      predicted_oom_step_low=None if per_step is None else 47_000,
                      predicted_oom_step_high=None if per_step is None else 49_900)


def healthy(floor: float = 20 * GiB) -> Assessment:
    return Assessment(Verdict.OK, "flat", floor_bytes=floor, total_bytes=TOTAL,
                      slope_bytes_per_second=0.0)


def snap(t: float, assessments: dict, answering=None, processes=None, polls: int = 1,
         used: int = 20 * GiB, owners=None) -> PollState:
    answering = assessments if answering is None else answering
    chips = {c: ChipSample(c, used, TOTAL, 0.9, int(c), 8431) for c in answering}
    return PollState(time=t, identity=IDENT, inventory=inventory_for("v4", 4),
                    runtime=RuntimeReading(t, chips), assessments=assessments,
                    processes=processes or {}, polls_total=polls, owners=owners or {})


def actions(transitions) -> list[tuple[str, str, str]]:
    return [(t.action, t.alert.name, t.alert.subject) for t in transitions]


# --- conditions and hold-downs -------------------------------------------------------


def test_a_leak_warns_and_a_near_oom_is_critical():
    tracker = AlertTracker(SETTINGS)
    got = tracker.update(snap(1000.0, {"0": leak(2.0, 1000.0), "1": leak(30.0, 1000.0),
                                       "2": healthy()}))
    assert sorted(actions(got)) == [("trigger", LEAK, "chip 0"), ("trigger", LEAK, "chip 1"),
                                    ("trigger", OOM, "chip 0")]
    oom = next(t.alert for t in got if t.alert.name == OOM)
    assert oom.severity == "critical" and oom.key == f"tpumon/{IDENT.host}/{OOM}/chip0"
    assert "in 2.0 h (~step 48,200)" in oom.summary and "146.5 KiB/step" in oom.summary
    assert oom.details["time_to_oom_seconds"] == pytest.approx(7200)
    assert oom.dashboard == f"https://grafana.example/d/tpumon?var-host={IDENT.host}&var-chip=0"
    assert oom.where == f"{IDENT.host} (worker 3, slice llama-pod-a, v4-32)"


def test_the_horizon_is_the_configured_one():
    tracker = AlertTracker(AlertSettings(oom_horizon_seconds=48 * 3600))
    got = tracker.update(snap(1000.0, {"1": leak(30.0, 1000.0)}))
    assert ("trigger", OOM, "chip 1") in actions(got)


def test_a_healthy_chip_raises_nothing():
    tracker = AlertTracker(SETTINGS)
    for i in range(100):
        assert tracker.update(snap(1000.0 + 60 * i, {"0": healthy(), "1": healthy()})) == []


def test_a_growing_chip_never_notifies_even_with_a_near_forecast():
    """``growing`` is the warning Prometheus routes to Slack; the agent's own notifiers
    (PagerDuty among them) raise nothing for it, whatever its forecast says, and raise the
    leak and the page once the verdict becomes leak."""
    tracker = AlertTracker(SETTINGS)
    for i in range(30):
        now = 1000.0 + 60 * i
        growing = replace(leak(2.0, now), verdict=Verdict.GROWING)
        assert tracker.update(snap(now, {"0": growing, "1": healthy()})) == []
    got = tracker.update(snap(3000.0, {"0": leak(2.0, 3000.0), "1": healthy()}))
    assert sorted(actions(got)) == [("trigger", LEAK, "chip 0"), ("trigger", OOM, "chip 0")]


def test_high_hbm_must_hold_five_minutes_and_a_resolve_waits_for_the_hold():
    tracker = AlertTracker(SETTINGS)
    full = {"0": healthy(0.97 * TOTAL)}
    assert tracker.update(snap(0.0, full)) == []
    assert tracker.update(snap(299.0, full)) == []
    assert actions(tracker.update(snap(300.0, full))) == [("trigger", HIGH, "chip 0")]
    assert tracker.update(snap(360.0, full)) == []  # raised once
    assert tracker.update(snap(400.0, {"0": healthy()})) == []
    assert tracker.update(snap(999.0, {"0": healthy()})) == []  # 599 s false: still active
    assert tracker.update(snap(1000.0, full)) == []  # back: the clearing starts over
    assert tracker.update(snap(1100.0, {"0": healthy()})) == []
    assert actions(tracker.update(snap(1700.0, {"0": healthy()}))) == [
        ("resolve", HIGH, "chip 0")]


def test_a_chip_that_stops_answering_resolves_after_the_hold():
    tracker = AlertTracker(SETTINGS)
    tracker.update(snap(0.0, {"0": leak(30.0, 0.0)}))
    gone = {"0": leak(30.0, 0.0)}  # the detector keeps its last word; the chip is silent
    assert tracker.update(snap(100.0, gone, answering={})) == []
    assert actions(tracker.update(snap(700.0, gone, answering={}))) == [
        ("resolve", LEAK, "chip 0")]


def process(pid: int, received: float, step: int = 1200, uid: int = 0) -> ProcessState:
    report = ProcessReport(pid=pid, uid=uid, framework="jax", step=step, time=received,
                           received=received)
    trend = CountTrend(None, None, False, 0)
    return ProcessState(report, trend, trend)


def test_a_training_step_stalled_while_chips_hold_memory():
    tracker = AlertTracker(SETTINGS)
    mine = {7: process(7, 500.0)}
    assert tracker.update(snap(1000.0, {"0": healthy()}, processes=mine, owners={"0": 7})) == []
    got = tracker.update(snap(1200.0, {"0": healthy()}, processes=mine, owners={"0": 7}))
    assert actions(got) == [("trigger", STALLED, "pid 7")]
    assert "stuck at step 1200 for 12 min" in got[0].alert.summary
    # chips empty (the job freed them): no stall alert for a process that merely lingers
    idle = AlertTracker(SETTINGS)
    assert idle.update(snap(1200.0, {"0": healthy()}, processes=mine, used=0,
                            owners={"0": 7})) == []


def test_a_silent_process_is_stalled_only_on_the_chips_it_holds_or_drives():
    """Chip 0 is held by pid 8, chip 1 driven (on its report) by pid 7: silent pid 9,
    holding and driving nothing, is no stall however full the chips (it used to be paged
    on all of this host's chips); pid 7's stall counts its own chip only."""
    silent = {7: process(7, 500.0), 9: process(9, 500.0)}
    state = replace(snap(1200.0, {"0": healthy(), "1": healthy()}, processes=silent,
                         owners={"0": 8}), chip_processes={"1": 7})
    got = AlertTracker(SETTINGS).update(state)
    assert actions(got) == [("trigger", STALLED, "pid 7")]
    assert got[0].alert.details["chips"] == "1"
    assert "hold 20.0 GiB" in got[0].alert.summary


def test_alerts_about_one_users_processes_are_limited_in_rate():
    """Ten stalls of one uid's processes are raised in ten minutes, the next ones wait
    (raised as the window moves on); another uid's, and a chip's alerts, do not wait."""
    from tpumon.notify.alerts import UID_BURST, UID_WINDOW
    many = {pid: process(pid, 0.0) for pid in range(100, 100 + UID_BURST + 3)}
    owners = {str(i): pid for i, pid in enumerate(many)}
    other = process(5, 0.0, uid=1234)
    tracker = AlertTracker(SETTINGS)
    owners["99"] = 5
    state = snap(1000.0, {c: healthy() for c in owners}, processes={**many, 5: other},
                 owners=owners)
    assert len(tracker.update(state)) == UID_BURST + 1  # uid 0's first ten and uid 1234's
    assert tracker.update(replace(state, time=1100.0)) == []
    later = tracker.update(replace(state, time=1000.0 + UID_WINDOW))
    assert len(later) == 3


def test_a_restored_tracker_does_not_raise_again():
    first = AlertTracker(SETTINGS)
    first.update(snap(0.0, {"0": leak(2.0, 0.0)}))
    again = AlertTracker(SETTINGS, active=first.active)
    assert again.update(snap(60.0, {"0": leak(1.9, 60.0)})) == []
    assert sorted(actions(again.update(snap(61.0, {"0": healthy()})) +
                          again.update(snap(700.0, {"0": healthy()})))) == [
        ("resolve", LEAK, "chip 0"), ("resolve", OOM, "chip 0")]


def test_a_real_detector_on_a_leaking_trace_raises_a_leak_with_its_forecast():
    rows = list(generate_trace("linear-leak", duration_s=10 * 3600, chips=1, seed=3))
    detector = ChipDetector()
    detector.update(np.array([r.time for r in rows]), np.array([r.step for r in rows], float),
                    np.array([r.hbm_used_bytes for r in rows], float),
                    np.array([r.hbm_total_bytes for r in rows], float))
    now = rows[-1].time
    got = AlertTracker(AlertSettings(oom_horizon_seconds=1e9)).update(
        snap(now, {"0": detector.assessment}))
    assert sorted(actions(got)) == [("trigger", LEAK, "chip 0"), ("trigger", OOM, "chip 0")]
    details = got[0].alert.details
    assert details["growth_bytes_per_step"] > 0 and math.isfinite(details["time_to_oom_seconds"])


# --- delivery --------------------------------------------------------------------------


class Feed:
    """The snapshot a notifier reads: set by the test, as the poll loop would publish it."""

    def __init__(self) -> None:
        self.current = snap(time.time(), {}, polls=0)
        self.polls = 0

    def publish(self, assessments: dict, **kw) -> None:
        self.polls += 1
        self.current = snap(time.time(), assessments, polls=self.polls, **kw)


def notifier(feed: Feed, outbox: Outbox, *channels, tracker=None, **kw) -> Notifier:
    kw.setdefault("backoff_base", 0.05)
    return Notifier(lambda: feed.current, tracker or AlertTracker(SETTINGS, outbox.active()),
                    outbox, channels, timeout=2.0, **kw)


def run_until(n: Notifier, condition, timeout: float = 20.0) -> None:
    """Step the notifier (as its thread would) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(min(n.step(), 0.05))


def slack_channel(api: FakeAlertAPI) -> SlackChannel:
    channel = SlackChannel(api.url, ("warning", "critical"))
    channel.group_wait = 0.3
    channel.min_interval = 0.05
    return channel


def pd_channel(api: FakeAlertAPI, key: str = "R0UT1NGKEY") -> PagerDutyChannel:
    channel = PagerDutyChannel(api.url, key, ("critical",))
    channel.min_interval = 0.01
    return channel


def test_slack_gets_one_line_a_message_naming_host_worker_chip_growth_eta_and_link():
    """One alert a message: a message cut short by a kill is repeated after the restart,
    and a message of one line repeats one line (issue 42; it used to group up to 20)."""
    feed = Feed()
    with FakeAlertAPI("slack") as api:
        n = notifier(feed, Outbox(None), slack_channel(api))
        now = time.time()
        feed.publish({"0": leak(2.0, now), "1": leak(30.0, now)})
        run_until(n, lambda: len(api.accepted) == 3)
        n.step()
        assert len(api.requests) == 3  # three alerts raised together: three messages
        text = "\n".join(r.body["text"] for r in api.requests)
        for expected in (IDENT.host, "worker 3", "llama-pod-a", "chip 0", "chip 1", OOM, LEAK,
                         "146.5 KiB/step", "OOM in 2.0 h", "grafana.example",
                         f"<http://{IDENT.host}:9847/report|Report>"):
            assert expected in text
        assert [len(r.body["blocks"]) for r in api.requests] == [1, 1, 1]
        assert "\n" not in api.requests[0].body["text"] and "repeat" not in text
        assert n.health().channels[0].delivered_total == 3


def _stalled(pid: int) -> Alert:
    return Alert(STALLED, "warning", f"tpumon/h/{STALLED}/pid{pid}", "h", "", "", "",
                 f"pid {pid}", f"training process {pid} (fake) stuck at step 1")


def test_a_post_cut_short_is_sent_again_marked_as_a_possible_repeat(tmp_path):
    """Events are marked ``sending`` before their post; a kill -9 leaves them so, and the
    next run knows that they may have arrived: sent again, the line says it may be a
    repeat (Slack's webhooks take no idempotency key), also after a failed retry; the
    events after it are not marked."""
    path = tmp_path / "outbox.db"
    first = Outbox(path)
    first.record([Transition("trigger", _stalled(pid), 0.0) for pid in (1, 2)],
                 {"slack": ("warning",)}, time.time())
    cut_short = first.pending("slack", 1)
    assert not cut_short[0].in_doubt
    first.sending([cut_short[0].id], "attempt-one")  # ... and the agent is killed here
    first.close()
    outbox = Outbox(path)
    assert outbox.in_doubt() == [("slack", "attempt-one")]
    assert [e.in_doubt for e in outbox.pending("slack", 5)] == [True, False]
    with FakeAlertAPI("slack") as api:
        api.respond(503)
        n = notifier(Feed(), outbox, slack_channel(api))
        run_until(n, lambda: len(api.accepted) == 2)
    first_line, second_line = (r.body["text"] for r in api.accepted)
    assert "process 1 " in first_line and "Possibly a repeat" in first_line
    assert "process 2 " in second_line and "repeat" not in second_line
    assert outbox.pending_count("slack") == 0 and outbox.in_doubt() == []


def test_an_outbox_of_an_earlier_version_is_read_and_delivered(tmp_path):
    """An outbox.db written before the ``sending`` mark (no attempt, in_doubt columns)
    gets the columns; its pending events are delivered, none in doubt."""
    path = tmp_path / "outbox.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE active (key TEXT PRIMARY KEY, alert TEXT NOT NULL);
        CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT NOT NULL,
            action TEXT NOT NULL, alert TEXT NOT NULL, raised REAL NOT NULL,
            created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL DEFAULT 'pending', done REAL, error TEXT);""")
    old.execute("INSERT INTO events (channel, action, alert, raised, created) VALUES "
                "('slack', 'trigger', ?, 0, ?)", (json.dumps(_stalled(7).to_json()), time.time()))
    old.commit()
    old.close()
    outbox = Outbox(path)
    [event] = outbox.pending("slack", 5)
    assert event.alert.subject == "pid 7" and not event.in_doubt
    outbox.sending([event.id], "a")
    outbox.delivered([event.id])
    assert outbox.pending_count("slack") == 0


def test_pagerduty_trigger_then_resolve_with_one_dedup_key():
    feed = Feed()
    with FakeAlertAPI("pagerduty") as api:
        n = notifier(feed, Outbox(None), pd_channel(api),
                     tracker=AlertTracker(replace(SETTINGS, resolve_after_seconds=0.2)))
        feed.publish({"0": leak(2.0, time.time())})
        run_until(n, lambda: api.accepted)  # critical only: the leak warning is not paged
        feed.publish({"0": healthy()})
        n.step()  # the condition clears...
        time.sleep(0.3)
        feed.publish({"0": healthy()})  # ...and stays clear for longer than the hold
        run_until(n, lambda: len(api.accepted) == 2)
        trigger, resolve = (r.body for r in api.requests)
        assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
        # A slice-wide condition: one incident per slice and alert (tests/test_notify_slice.py)
        assert trigger["dedup_key"] == resolve["dedup_key"] == f"tpumon/slice/llama-pod-a/{OOM}"
        assert set(resolve) == {"routing_key", "dedup_key", "event_action"}
        payload = trigger["payload"]
        assert payload["severity"] == "critical" and payload["source"] == IDENT.host
        assert payload["component"] == "chip 0" and payload["group"] == "llama-pod-a"
        assert payload["custom_details"]["predicted_oom_step"] == 48_200
        assert payload["custom_details"]["predicted_oom_step_interval"] == [47_000, 49_900]
        assert trigger["links"][0]["href"].startswith("https://grafana.example/")
        assert trigger["links"][1] == {"href": f"http://{IDENT.host}:9847/report",
                                       "text": "tpumon report"}


@pytest.mark.parametrize("failures,reason", [((500, 503), "server_error"),
                                             ((429,), "rate_limited")])
@pytest.mark.slow
def test_delivered_once_after_the_service_recovers(failures, reason):
    feed = Feed()
    with FakeAlertAPI("pagerduty") as api:
        api.respond(*failures)
        n = notifier(feed, Outbox(None), pd_channel(api))
        feed.publish({"0": leak(2.0, time.time())})
        run_until(n, lambda: api.accepted)
        for _ in range(10):
            n.step()
        assert [r.status for r in api.requests] == [*failures, 202]
        assert len({r.body["dedup_key"] for r in api.requests}) == 1
        h = n.health().channels[0]
        assert h.failures_total[reason] == len(failures) and h.up and h.pending == 0
    if reason == "rate_limited":  # the fake says Retry-After: 1
        assert api.requests[1].time - api.requests[0].time >= 0.95


def test_network_errors_are_retried_until_delivered():
    feed = Feed()
    with FakeAlertAPI("slack") as api:
        api.stop_answering()
        n = notifier(feed, Outbox(None), slack_channel(api))
        feed.publish({"0": leak(30.0, time.time())})
        run_until(n, lambda: n.health().channels[0].failures_total.get("network", 0) >= 2)
        assert not n.health().channels[0].up and n.health().channels[0].pending == 1
        api.stop_answering(False)
        run_until(n, lambda: api.accepted)
        assert len(api.accepted) == 1 and n.health().channels[0].pending == 0


@pytest.mark.parametrize("kind,status", [("slack", 403), ("slack", 410), ("pagerduty", 400)])
@pytest.mark.slow
def test_a_rejected_notification_is_not_retried_and_the_next_goes_on(kind, status):
    feed = Feed()
    with FakeAlertAPI(kind) as api:
        api.respond(status)
        if kind == "slack":
            channel = slack_channel(api)
            channel.group_wait = 0.0
        else:
            channel = pd_channel(api)
        n = notifier(feed, Outbox(None), channel)
        feed.publish({"0": leak(2.0, time.time())})
        run_until(n, lambda: api.requests)
        feed.publish({"0": leak(2.0, time.time()), "1": leak(2.0, time.time())})
        run_until(n, lambda: api.accepted)
        for _ in range(5):
            n.step()
        assert [r.status for r in api.requests] == [status] + [api.accepted[0].status] * (
            len(api.requests) - 1)
        sent = json.dumps([r.body for r in api.accepted])
        assert "chip 1" in sent  # the next goes on; the rejected one is given up:
        assert api.requests[0].raw not in [r.raw for r in api.accepted]  # never sent again
        assert n.health().channels[0].given_up_total == {"rejected": len(api.requests[0].body.get(
            "blocks", [None]))}


def test_an_alert_raised_during_an_outage_survives_a_restart_and_is_sent_once(tmp_path):
    path = tmp_path / "outbox.db"
    feed = Feed()
    with FakeAlertAPI("pagerduty") as api:
        api.stop_answering()
        first = notifier(feed, Outbox(path), pd_channel(api))
        feed.publish({"0": leak(2.0, time.time())})
        run_until(first, lambda: first.health().channels[0].failures_total.get("network"))
        first.stop()  # the agent restarts; PagerDuty still down for a moment
        api.stop_answering(False)
        outbox = Outbox(path)
        assert sorted(outbox.active()) == [f"tpumon/{IDENT.host}/{LEAK}/chip0",
                                           f"tpumon/{IDENT.host}/{OOM}/chip0"]
        second = notifier(feed, outbox, pd_channel(api))
        feed.publish({"0": leak(1.9, time.time())})  # the detector resumed: still leaking
        run_until(second, lambda: api.accepted)
        for _ in range(10):
            second.step()
        assert [r.body["event_action"] for r in api.accepted] == ["trigger"]
        second.stop()
        # a third life, after the chip recovered: the resolve follows, once
        third = notifier(feed, Outbox(path), pd_channel(api),
                         tracker=AlertTracker(AlertSettings(resolve_after_seconds=0.0),
                                              Outbox(path).active()))
        feed.publish({"0": healthy()})
        run_until(third, lambda: len(api.accepted) == 2)
        for _ in range(10):
            third.step()
        assert [r.body["event_action"] for r in api.accepted] == ["trigger", "resolve"]
        third.stop()


def test_a_resolve_never_overtakes_its_trigger(tmp_path):
    feed = Feed()
    with FakeAlertAPI("pagerduty") as api:
        api.stop_answering()
        n = notifier(feed, Outbox(tmp_path / "o.db"), pd_channel(api),
                     tracker=AlertTracker(AlertSettings(resolve_after_seconds=0.0)))
        feed.publish({"0": leak(2.0, time.time())})
        n.step()
        feed.publish({"0": healthy()})
        n.step()
        assert n.health().channels[0].pending == 2
        api.stop_answering(False)
        run_until(n, lambda: len(api.accepted) == 2)
        assert [r.body["event_action"] for r in api.accepted] == ["trigger", "resolve"]


def test_notifications_older_than_max_age_are_given_up():
    feed = Feed()
    clock = [time.time()]
    with FakeAlertAPI("slack") as api:
        api.stop_answering()
        channel = slack_channel(api)
        channel.group_wait = 0.0  # the notifier's clock stands still here
        n = notifier(feed, Outbox(None), channel, max_age=3600, clock=lambda: clock[0])
        feed.publish({"0": leak(30.0, time.time())})
        run_until(n, lambda: n.health().channels[0].failures_total.get("network"))
        clock[0] += 7200
        n.step()
        h = n.health().channels[0]
        assert h.given_up_total == {"expired": 1} and h.pending == 0


def test_outbox_on_a_damaged_file_is_moved_aside(tmp_path: Path):
    path = tmp_path / "outbox.db"
    path.write_bytes(b"this is not sqlite" * 100)
    outbox = Outbox(path)
    assert outbox.active() == {}
    assert list(tmp_path.glob("outbox.db.corrupt-*"))


def _snapshot_pair(pid: int, steps: int, kept: int):
    """A finished snapshot request: ``kept`` more f32[] over ``steps`` steps."""
    from tpumon.sources.tensor_diff import diff
    from tpumon.instrument.snapshot import make_snapshot
    from tpumon.sources.snapshots import SnapshotResult
    site = "train.py:88 (loss = model(x).mean())"
    before = make_snapshot("jax", 100, time.perf_counter(), True,
                           {((), "float32", "", site): [5, 20]})
    after = make_snapshot("jax", 100 + steps, time.perf_counter(), True,
                          {((), "float32", "", site): [5 + kept, 4 * (5 + kept)]})
    return SnapshotResult(pid, "ab" * 8, "leak on chip 0", 900.0, steps, 950.0, before, after,
                          diff(before, after))


def with_reporter(s: PollState, pid: int, result) -> PollState:
    from tpumon.sources.reports import ReporterReading
    state = process(pid, s.time)
    state = ProcessState(state.report._replace(snapshots=True), state.live, state.compiles)
    reading = ReporterReading({pid: state.report}, {}, 1, {},
                              {} if result is None else {pid: result})
    return replace(s, processes={pid: state}, chip_processes={"0": pid}, reporter=reading)


def test_a_leak_warning_waits_for_its_tensor_snapshots_and_names_what_grew():
    """The agent asks the chip's process for snapshots when the leak is called; the warning
    waits for them (10 min at most) and carries what they found; the page does not wait."""
    from tpumon.sources.snapshots import SnapshotResult
    tracker = AlertTracker(SETTINGS)
    pending = SnapshotResult(7, "ab" * 8, "leak on chip 0", 1000.0, 200)
    got = tracker.update(with_reporter(snap(1000.0, {"0": leak(2.0, 1000.0, 4.0)}), 7, pending))
    assert actions(got) == [("trigger", OOM, "chip 0")]  # critical: at once
    assert tracker.update(with_reporter(snap(1100.0, {"0": leak(2.0, 1100.0, 4.0)}), 7,
                                        pending)) == []
    done = _snapshot_pair(7, 200, 200)
    got = tracker.update(with_reporter(snap(1160.0, {"0": leak(2.0, 1160.0, 4.0)}), 7, done))
    assert actions(got) == [("trigger", LEAK, "chip 0")]
    text = got[0].alert.details["tensors"]
    assert text.startswith("likely leak: +1 f32[] per step (4 B each, all of the growth)")
    line = SlackChannel("http://x", ("warning", "critical"))._line(
        type("E", (), {"action": "trigger", "alert": got[0].alert, "raised": 1160.0,
                       "in_doubt": False})())
    assert "Tensor snapshots: likely leak: +1 f32[] per step" in line and "train.py:88" in line
    page = PagerDutyChannel("http://x", "k" * 32, ("warning", "critical")).body(
        type("E", (), {"action": "trigger", "alert": got[0].alert, "raised": 1160.0})())
    assert "likely leak: +1 f32[] per step" in page["payload"]["summary"]
    assert page["payload"]["custom_details"]["tensors"] == text


def test_a_leak_warning_waits_ten_minutes_at_most_for_snapshots():
    from tpumon.sources.snapshots import SnapshotResult
    tracker = AlertTracker(SETTINGS)
    pending = SnapshotResult(7, "ab" * 8, "leak on chip 0", 0.0, 200)
    for t in (0.0, 300.0, 599.0):
        assert tracker.update(with_reporter(snap(t, {"0": leak(30.0, t)}), 7, pending)) == []
    got = tracker.update(with_reporter(snap(600.0, {"0": leak(30.0, 600.0)}), 7, pending))
    assert actions(got) == [("trigger", LEAK, "chip 0")] and "tensors" not in got[0].alert.details
    # with snapshots on leak turned off, nothing is waited for
    off = AlertTracker(replace(SETTINGS, wait_for_snapshots=False))
    assert actions(off.update(with_reporter(snap(0.0, {"0": leak(30.0, 0.0)}), 7, None))) == [
        ("trigger", LEAK, "chip 0")]


@pytest.mark.slow
def test_the_outbox_keeps_under_its_share_of_the_disk_bound(tmp_path):
    """Thousands of delivered notifications (one user's processes ending, say) leave the
    outbox file and its WAL under its share of store.max_size_mb, the oldest delivered
    going first and the pending never; past the bound with only pending events, a write
    fails as on a full disk (the notifier then holds them in memory). The outbox used to
    be outside the cap and keep every event for a week."""
    from tpumon.notify.alerts import Transition
    from tpumon.store.database import Retention

    bound = Retention(max_bytes=4 * 2**20).outbox_bytes
    assert bound == 256 * 2**10
    outbox = Outbox(tmp_path / "outbox.db", bound)
    pending_alert = evaluate_one(snap(0.0, {"0": leak(2.0, 0.0)}))
    outbox.record([Transition("trigger", pending_alert, 0.0)], {"slack": ("warning",)}, 0.0)
    for i in range(3000):  # raised and resolved, both delivered
        alert = replace(pending_alert, key=f"end/{i}", summary="x" * 200)
        outbox.record([Transition(action, alert, float(i)) for action in ("trigger", "resolve")],
                      {"slack": ("warning",)}, i)
        outbox.delivered([e.id for e in outbox.pending("slack", 10)
                          if e.alert.key.startswith("end/")])
        size = sum(f.stat().st_size for f in tmp_path.iterdir())
        assert size <= bound, (i, size)
    assert [e.alert.key for e in outbox.pending("slack", 10)] == [pending_alert.key]
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for i in range(3000):
            alert = replace(pending_alert, key=f"stuck/{i}", summary="x" * 200)
            outbox.record([Transition("trigger", alert, 0.0)], {"slack": ("warning",)}, 0.0)
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) <= bound
    outbox.close()


def evaluate_one(state: PollState):
    """The first alert a snapshot raises."""
    from tpumon.notify.alerts import evaluate
    return next(iter(evaluate(state, SETTINGS).values()))


def test_a_leak_page_says_the_forecast_band_with_its_steps():
    """The page gives the forecast's calibrated band, in times and steps, the forecast
    inside it: what the on-call plans by at 3 a.m."""
    from tpumon.notify.alerts import evaluate
    now = 1_700_000_000.0  # 22:13 UTC
    a = replace(leak(2.0, now), predicted_oom_time_low=now + 3600,
                predicted_oom_time_high=now + 4 * 3600)
    alerts = evaluate(snap(now, {"0": a}), SETTINGS)
    page = next(al for al in alerts.values() if al.name == OOM)
    assert "OOM forecast on chip 0 in 2.0 h (~step 48,200), 92% between 11-14 23:13 " \
        "and 11-15 02:13 UTC, step 47,000-49,900: floor grows" in page.summary, page.summary
    assert describe_band(leak(2.0, now), now) == ""  # no band, nothing said
