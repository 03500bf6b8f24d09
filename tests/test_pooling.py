"""Chips of one job share evidence: the agent (every poll) and analyze (replay) agree."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tpumon.common.describe import describe_growth, describe_oom, time_to_oom
from tpumon.detect import ChipDetector, Verdict
from tpumon.detect.pooling import pool_jobs
from tpumon.detect.replay import replay_columns
from tpumon.report.data import build_reports
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.schema import SeriesColumns

HOST = "t1v-n-77aa"


def columns(scenario: str, hours: float, seed: int, **overrides) -> dict:
    return by_chip(generate_trace(scenario, duration_s=hours * 3600, poll_interval_s=10,
                                  chips=4, seed=seed, host=HOST, drop_probability=0.02,
                                  **overrides))


def by_chip(trace) -> dict:
    """A generated trace's rows as each chip's columns."""
    rows = list(trace)
    out = {}
    for chip in sorted({r.chip for r in rows}):
        mine = [r for r in rows if r.chip == chip]
        out[(HOST, chip)] = SeriesColumns(
            np.array([r.time for r in mine]),
            np.array([math.nan if r.step is None else r.step for r in mine], float),
            np.array([r.hbm_used_bytes for r in mine]), np.array([r.hbm_total_bytes for r in mine]))
    return out


def agent_alerts(cols: dict) -> dict:
    """What the agent does: every poll, each chip's sample to its detector, then the chips
    of the process pooled; the first poll at which a chip's pooled verdict is leak."""
    detectors = {chip: ChipDetector() for _, chip in cols}
    polls = sorted({t for c in cols.values() for t in c.times.tolist()})
    index = {chip: {t: i for i, t in enumerate(c.times.tolist())} for (_, chip), c in cols.items()}
    first: dict[str, tuple[float, float | None]] = {}
    for t in polls:
        for (_, chip), c in cols.items():
            i = index[chip].get(t)
            if i is not None:
                detectors[chip].update((t,), (c.steps[i],), (c.used[i],), (c.total[i],))
        pooled = pool_jobs({c: d.assessment for c, d in detectors.items()},
                           {c: "process 7" for c in detectors})
        for chip, a in pooled.items():
            if a.verdict is Verdict.LEAK and chip not in first:
                first[chip] = (t, a.predicted_oom_time)
    return first


@pytest.mark.parametrize("scenario,seed", [("linear-leak", 11), ("chip0-leak", 3)])
@pytest.mark.slow
def test_agent_and_analyze_give_the_same_pooled_alerts(scenario, seed):
    cols = columns(scenario, 10, seed, leak_chip_spread=0.3)
    replayed = {r.chip: r for r in replay_columns(cols)}
    agent = agent_alerts(cols)
    assert set(agent) == {chip for chip, r in replayed.items() if r.alert}
    for chip, (t, forecast) in agent.items():
        assert replayed[chip].alert["time"] == t
        assert replayed[chip].alert["predicted_oom_time"] == forecast


def test_chips_that_grow_alike_share_one_verdict_and_earlier_alerts():
    cols = columns("linear-leak", 10, 11, leak_chip_spread=0.3)
    pooled = replay_columns(cols)
    alone = [ChipDetector() for _ in cols]
    for d, c in zip(alone, cols.values(), strict=True):
        d.update(c.times, c.steps, c.used, c.total)
    assert all(r.verdict == "leak" for r in pooled)
    assert all(r.assessment.reason.startswith(f"all 4 chips of host {HOST} grow; this one ")
               for r in pooled)
    # each chip's reason gives its own figures, the ones every view shows beside it (it
    # once gave the job's median growth beside the chip's own in the table)
    for r in pooled:
        a = r.assessment
        assert f"this one {describe_growth(a.slope_bytes_per_step, a.slope_bytes_per_hour)}; " \
            f"{describe_oom(time_to_oom(a))}" in a.reason, a.reason
    own = [d.alert["time"] for d in alone]
    shared = [r.alert["time"] for r in pooled]
    assert all(s <= o for s, o in zip(shared, own, strict=True)) and shared != own


def test_a_leak_on_one_rank_is_caught_alone():
    pooled = {r.chip: r for r in replay_columns(columns("chip0-leak", 10, 3))}
    assert pooled["0"].verdict == "leak" and pooled["0"].alert is not None
    assert "(1 of 4 chips" in pooled["0"].assessment.reason
    assert all(pooled[c].alert is None and pooled[c].verdict != "leak" for c in "123")


def test_the_agent_keeps_a_job_together_through_a_poll_that_misses_its_process():
    """A poll whose owner scan comes back empty (a runtime poll that timed out, /proc under
    load) must not split a job: the chips that had joined its leak stayed ``leak``. Before
    the fix they fell back to their own verdict for that poll and rose again after (an
    alert resolved and raised within seconds)."""
    from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
    from tpumon.metrics.collectors import build_registry
    from tpumon.common.identity import Identity
    from tpumon.sources.chips import inventory_for
    from tpumon.sources.tpu_runtime import TpuRuntimeSource
    from tpumon.state import AgentState

    cols = columns("linear-leak", 10, 11, leak_chip_spread=0.3)
    first_leak = min(r.alert["time"] for r in replay_columns(cols))  # pooled: all at once
    detectors = {}
    for (_, chip), c in cols.items():
        n = int(np.searchsorted(c.times, first_leak, side="right"))
        detectors[chip] = ChipDetector()
        detectors[chip].update(c.times[:n], c.steps[:n], c.used[:n], c.total[:n])
    own = {chip: d.assessment.verdict for chip, d in detectors.items()}
    assert Verdict.LEAK in own.values() and set(own.values()) != {Verdict.LEAK}  # some join
    inventory = inventory_for("v4", 4)
    state = AgentState(Identity(host="h"), inventory)
    agent = Agent(AgentInputs(state, TpuRuntimeSource("127.0.0.1", [], 1.0, inventory),
                              OwnerScanner(dict, 60), 1.0,
                              build_registry(lambda: state.current), detectors=detectors))
    held = agent._detect({}, {chip: 7 for chip in detectors})
    assert all(a.verdict is Verdict.LEAK for a in held.values())
    missed = agent._detect({}, {})
    assert {c: a.verdict for c, a in missed.items()} == {c: Verdict.LEAK for c in detectors}


@pytest.mark.parametrize("scenario,seed", [("linear-leak", 11), ("chip0-leak", 3)])
@pytest.mark.slow
def test_the_report_says_what_analyze_says(scenario, seed):
    """`tpumon report` pools a host's chips as `analyze` (and the agent) do: the same final
    verdict and reason, the same alert, a verdict timeline that turns to leak right there
    (it once replayed each chip alone, and the index page and /report disagreed)."""
    cols = columns(scenario, 10, seed, leak_chip_spread=0.3)
    replayed = {r.chip: r for r in replay_columns(cols)}
    (report,) = build_reports(cols, "test", "0", 0.0)
    assert len(report.chips) == 4
    for chip in report.chips:
        result = replayed[chip.chip]
        assert chip.assessment == result.assessment
        assert chip.alert == result.alert
        leaks = [start for start, _, v in chip.verdicts if v == "leak"]
        if result.alert:
            assert leaks[0] == result.alert["time"]
        else:
            assert not leaks
        assert all(a[1] == b[0] for a, b in zip(chip.verdicts, chip.verdicts[1:], strict=False))
        assert chip.verdicts[0][0] == chip.start and chip.verdicts[-1][1] == chip.end


def test_jobs_replayed_by_forked_workers_give_the_same_results(monkeypatch):
    """`tpumon analyze` replays a large trace's jobs on every core: the same results as one
    process, in the same order (each job is replayed whole wherever it runs)."""
    cols = dict(columns("linear-leak", 6, 11))
    cols.update({("other-host", chip): c for (_, chip), c in columns("chip0-leak", 6, 3).items()})
    assert_forked_replay_is_the_same(cols, monkeypatch)


def assert_forked_replay_is_the_same(cols: dict, monkeypatch) -> None:
    """Two forked workers give the results of one process, alerts included (some)."""
    from tpumon.detect import replay

    alone = replay_columns(cols)
    monkeypatch.setattr(replay, "PARALLEL_MIN_SAMPLES", 0)
    forked = replay_columns(cols, workers=2)
    assert [r.to_json() for r in forked] == [r.to_json() for r in alone]
    assert [r.alert for r in forked] == [r.alert for r in alone]
    assert any(r.alert for r in alone)


def test_a_job_that_is_most_of_the_trace_is_replayed_chip_by_chip_in_parallel(monkeypatch):
    """A slice of many chips is one job, often the whole trace: its chips are replayed by
    the forked workers one by one and pooled by the parent (it was once replayed whole by
    one worker, the other cores idle), with the same results as one process."""
    from tpumon.detect.job_replay import job_name, worker_tasks

    cols = dict(columns("linear-leak", 6, 11, leak_chip_spread=0.3))
    first = next(iter(cols.values()))
    cols[("small-host", "0")] = SeriesColumns(*(column[:500] for column in first))
    jobs = {}
    for (host, chip), c in cols.items():
        jobs.setdefault(job_name(host), []).append((host, chip, c))
    job_list = list(jobs.items())
    sizes = [sum(len(c.times) for _, _, c in series) for _, series in job_list]
    tasks = worker_tasks(job_list, sizes, 2)
    assert sorted(tasks) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, None)]
    assert tasks[-1] == (1, None)  # largest first: the small job last
    assert_forked_replay_is_the_same(cols, monkeypatch)


def fitted(verdict: Verdict, low: float, own: float, high: float, start: float = 0.0):
    """A fitted chip's assessment growing ``own`` GiB/h (``low``-``high``)."""
    from tpumon.detect import Assessment

    hour, gib = 3600.0, 2.0**30
    return Assessment(verdict, "", floor_bytes=8 * gib, transient_bytes=2 * gib,
                      total_bytes=16 * gib, slope_bytes_per_second=own * gib / hour,
                      slope_bytes_per_second_low=low * gib / hour,
                      slope_bytes_per_second_high=high * gib / hour,
                      window_start=start, window_seconds=2700.0)


def replayed_as_pool_job(logs: list) -> dict[int, dict]:
    """The alerts of the pooled replay of one job's logs (each chip's (time, step,
    assessment) list), checked against ``pool_job`` at every moment (verdicts and alerts)."""
    from tpumon.detect.job_replay import replay_pooling

    times = np.arange(0.0, 400.0, 10.0)
    cols = [SeriesColumns(times, times, times, times + 1.0) for _ in logs]
    verdicts, alerts = pool_at_every_moment("job", logs, cols)
    pooled = replay_pooling("job", logs, cols)
    assert pooled.verdicts == verdicts and pooled.alerts == alerts
    assert replay_pooling("job", logs, cols, timelines=False).alerts == alerts
    return alerts


def test_a_chip_joins_when_the_jobs_rate_comes_to_its_size_though_its_own_is_unchanged():
    """Chip 1 grows 0.45 GiB/h, too slow to join chip 0's leak at 1 GiB/h; chip 0's rate
    falls to 0.8 GiB/h at t=300, chip 1 saying nothing new: it joins then. (The pooled
    replay decides verdicts incrementally; a chip unchanged must still be looked at when
    the job's rate moves.)"""
    logs = [[(100.0, 0.0, fitted(Verdict.LEAK, 0.9, 1.0, 1.1)),
             (300.0, 0.0, fitted(Verdict.LEAK, 0.7, 0.8, 0.9, 200.0))],
            [(100.0, 0.0, fitted(Verdict.OK, 0.3, 0.45, 0.6))],
            [(200.0, 0.0, fitted(Verdict.OK, -0.1, 0.0, 0.1))]]
    alerts = replayed_as_pool_job(logs)
    assert sorted((i, a["time"]) for i, a in alerts.items()) == [(0, 100.0), (1, 300.0)]
    assert alerts[1]["reason"].endswith("(2 of 3 chips of job)")


def test_a_healthy_chip_whose_cache_still_fills_does_not_join_a_one_rank_leak():
    """bench/detect.py seed 3, chip0-leak-0-02: chip 0 leaks ~650 MiB/h from the job's
    start; chips 1-3, an hour in, still fill a cache at ~170 MiB/h, significant at 95 %,
    with an interval reaching up to half the leak's rate. They joined the leak at its rate
    (three false alarms): a chip joins only when its own estimate is of the job's size."""
    chip = fitted
    leak = chip(Verdict.LEAK, 0.58, 0.64, 0.71)
    filling = chip(Verdict.OK, 0.14, 0.17, 0.40)
    pooled = pool_jobs({"0": leak, "1": filling}, {"0": "h", "1": "h"})
    assert pooled["1"].verdict is Verdict.OK
    alike = chip(Verdict.OK, 0.25, 0.45, 0.80)  # a chip that does grow like the leak joins
    assert pool_jobs({"0": leak, "1": alike}, {"0": "h", "1": "h"})["1"].verdict is Verdict.LEAK


def slice_columns() -> dict:
    """One slice of three hosts (12 chips, one job): a leak on one rank of one host from
    the start, a leak at spread rates on all chips of another that starts hours later, a
    cache that fills on the third. Some chips join others' leaks, some never do, and the
    job's rate moves as chips turn."""
    out = {}
    for k, (scenario, seed, onset) in enumerate([("chip0-leak", 3, 0), ("linear-leak", 11, 16000),
                                                 ("saturating-cache", 5, 0)]):
        host = f"t1v-n-5f0c-w-{k}"
        for (_, chip), c in columns(scenario, 10, seed, leak_chip_spread=0.5,
                                    leak_onset_step=onset).items():
            out[(host, chip)] = SeriesColumns(c.times + 0.5 * k, *c[1:])
    return out


def pool_at_every_moment(job: str, logs: list, cols: list):
    """The pooled replay as it was first written: ``pool_job`` of every chip at every
    moment one chip's assessment changed; the verdicts and the first leak's alert."""
    from itertools import groupby

    from tpumon.detect.verdict import leak_alert
    from tpumon.detect.pooling import pool_job

    events = sorted(((t, i, a) for i, log in enumerate(logs) for t, _, a in log),
                    key=lambda e: (e[0], e[1]))
    current: dict[str, object] = {}
    verdicts: list[list] = [[] for _ in logs]
    alerts: dict[int, dict] = {}
    for moment, group in groupby(events, key=lambda e: e[0]):
        for _, i, a in group:
            current[str(i)] = a
        for name, a in pool_job(job, current).items():
            i = int(name)
            verdicts[i].append((moment, a.verdict.value))
            if a.verdict is Verdict.LEAK and i not in alerts:
                c = cols[i]
                at = max(int(np.searchsorted(c.times, moment, side="right")) - 1, 0)
                alerts[i] = leak_alert(moment, float(c.steps[at]), a)
    return verdicts, alerts


@pytest.mark.slow
def test_the_pooled_replay_of_a_slice_is_pool_job_at_every_moment():
    """The replay decides pooled verdicts incrementally and builds a chip's pooled
    assessment only when its alert fires: on a slice whose chips leak at different rates,
    some alone, some joined, it gives what ``pool_job`` at every moment gave (every
    verdict at every moment, every alert with its reason and forecast)."""
    from tpumon.detect.job_replay import replay_pooling, run_chip

    cols = slice_columns()
    runs = [run_chip(c, None, log=True) for c in cols.values()]
    logs = [run.log for run in runs]
    verdicts, alerts = pool_at_every_moment("slice t1v-n-5f0c", logs, list(cols.values()))
    pooled = replay_pooling("slice t1v-n-5f0c", logs, list(cols.values()))
    assert pooled.verdicts == verdicts and pooled.alerts == alerts
    assert replay_pooling("slice t1v-n-5f0c", logs, list(cols.values()),
                          timelines=False).alerts == alerts
    assert set(alerts) < set(range(len(cols)))  # some chips never leak
    assert any(a["time"] < runs[i].alert["time"] for i, a in alerts.items())  # some join
    assert any("(1 of 12 chips of slice t1v-n-5f0c)" in a["reason"] for a in alerts.values())
    assert len({a["time"] for a in alerts.values()}) > 2  # as the job's rate moves
    assert len({a["slope_bytes_per_second"] for a in alerts.values()}) > 2


@pytest.mark.slow
def test_the_agent_and_analyze_agree_on_a_many_chip_slice():
    """The agent pools a job's chips at every poll (``pool_jobs``), analyze incrementally:
    the same alerts, at the same moments, with the same reasons and forecasts."""
    cols = slice_columns()
    replayed = {(r.host, r.chip): r for r in replay_columns(cols)}
    detectors = {key: ChipDetector() for key in cols}
    first: dict = {}
    moments = sorted({t for c in cols.values() for t in c.times.tolist()})
    index = {key: {t: i for i, t in enumerate(c.times.tolist())} for key, c in cols.items()}
    names = {key: f"{key[0]}/{key[1]}" for key in cols}
    for t in moments:
        for key, c in cols.items():
            i = index[key].get(t)
            if i is not None:
                detectors[key].update((t,), (c.steps[i],), (c.used[i],), (c.total[i],))
        pooled = pool_jobs({names[k]: d.assessment for k, d in detectors.items()},
                           {name: "slice t1v-n-5f0c" for name in names.values()})
        for key, name in names.items():
            a = pooled[name]
            if a.verdict is Verdict.LEAK and key not in first:
                first[key] = (t, a.reason, a.predicted_oom_time, a.slope_bytes_per_second)
    assert set(first) == {key for key, r in replayed.items() if r.alert}
    for key, (t, reason, forecast, rate) in first.items():
        alert = replayed[key].alert
        assert (alert["time"], alert["reason"], alert["predicted_oom_time"],
                alert["slope_bytes_per_second"]) == (t, reason, forecast, rate)


def stepped(verdict: Verdict, jumps: list[tuple[float, float]], own: float = 0.0,
            envelope: float = 480.0):
    """A chip whose floor rose in jumps ((hour, GiB) each): a staircase leak growing ``own``
    GiB/h, or a step change flat between its jumps (its trend's interval around zero)."""
    from tpumon.detect import Assessment
    from tpumon.detect.jumps import Jump

    hour, gib = 3600.0, 2.0**30
    low, high = (own * 0.5, own * 1.5) if own else (-0.01, 0.01)
    return Assessment(verdict, "", floor_bytes=8 * gib, transient_bytes=2 * gib,
                      total_bytes=32 * gib, slope_bytes_per_second=own * gib / hour,
                      slope_bytes_per_second_low=low * gib / hour,
                      slope_bytes_per_second_high=high * gib / hour,
                      slope_bytes_per_step=own * gib / hour / 2,
                      slope_bytes_per_step_low=low * gib / hour / 2,
                      slope_bytes_per_step_high=high * gib / hour / 2,
                      window_start=0.0, window_seconds=3.2 * hour, step=6400.0,
                      level_jumps=tuple(Jump(h * hour, math.nan, s * gib) for h, s in jumps),
                      envelope_seconds=envelope)


def test_a_step_change_whose_jumps_are_the_jobs_staircase_joins_it():
    """bench/detect.py seed 0, irregular-stair-0-03: chip 3 is called a staircase at 3.19 h
    (three jumps of ~1.4 GiB); chips 0-2 jumped at the same moments, flat between, so their
    own verdict is step_change (2 permanent jumps) until their own third jump. They climb
    the same stairs: they join chip 3's leak at its rate, with their own forecast. A chip
    whose jumps came at other moments, or at another size, or only one of them, does not."""
    stairs = stepped(Verdict.LEAK, [(1.0, 1.4), (2.1, 1.5), (3.1, 1.4)], own=1.4)
    same = stepped(Verdict.STEP_CHANGE, [(1.0 + 300 / 3600, 1.6), (2.1 - 200 / 3600, 1.5)])
    elsewhere = stepped(Verdict.STEP_CHANGE, [(1.0, 1.6), (1.6, 1.5)])
    smaller = stepped(Verdict.STEP_CHANGE, [(1.0, 0.5), (2.1, 0.5)])
    once = stepped(Verdict.STEP_CHANGE, [(1.0, 1.5)])
    chips = {"3": stairs, "0": same, "1": elsewhere, "2": smaller, "4": once}
    pooled = pool_jobs(chips, {c: "job" for c in chips})
    assert {c for c, a in pooled.items() if a.verdict is Verdict.LEAK} == {"3", "0"}
    joined = pooled["0"]
    assert joined.slope_bytes_per_second == stairs.slope_bytes_per_second
    assert joined.reason.startswith("floor rose in the same jumps as the job's leaking chips")
    headroom = 32 - 2 - 8  # GiB: its own floor and transient, at the job's 1.4 GiB/h
    assert joined.predicted_oom_time == pytest.approx(3.2 * 3600 + headroom / 1.4 * 3600)
    assert joined.predicted_oom_step == pytest.approx(6400 + headroom / 1.4 * 3600 * 2)
    # a trend leak (no staircase) lends no stairs: a step change does not join it
    trend = dataclasses.replace(stairs, level_jumps=())
    pooled = pool_jobs({"3": trend, "0": same}, {"3": "job", "0": "job"})
    assert pooled["0"].verdict is Verdict.STEP_CHANGE


def test_a_chip_that_shares_only_a_staircases_first_and_last_jumps_does_not_climb_it():
    """``bench/nuisances.py`` one-chip 1000014 (seed 1): rank 9 leaks in a staircase beside
    the job's two step changes, which every chip has. A sibling whose jumps are the job's
    two step changes has jumps that are each a stair of rank 9's, but not rank 9's stairs
    between them: it shares the step changes, not the leak, and does not join. One that
    has every stair between its first and its last does, and stairs of the leak before its
    first jump or after its last (not yet confirmed on it, or before its trend) do not keep
    it out."""
    leak = stepped(Verdict.LEAK, [(0.5, 1.0), (1.1, 1.3), (1.6, 0.9), (2.1, 1.5), (2.6, 1.1),
                                  (3.1, 1.4)], own=1.4)
    steps_only = stepped(Verdict.STEP_CHANGE, [(1.1, 1.4), (2.1, 1.6)])
    every_stair = stepped(Verdict.STEP_CHANGE, [(1.1, 1.4), (1.6, 0.8), (2.1, 1.6)])
    one_missed = stepped(Verdict.STEP_CHANGE, [(1.1, 1.4), (1.6, 0.8), (2.6, 1.0)])
    chips = {"9": leak, "0": steps_only, "1": every_stair, "2": one_missed}
    pooled = pool_jobs(chips, {c: "job" for c in chips})
    assert {c for c, a in pooled.items() if a.verdict is Verdict.LEAK} == {"9", "1"}
    # the replay, deciding incrementally, says the same
    alerts = replayed_as_pool_job([[(100.0, 0.0, a)] for a in chips.values()])
    assert sorted(alerts) == [0, 2]


def test_what_does_not_keep_a_chip_out_of_the_staircase_it_climbs():
    """(From a review.) Another rank's staircase of its own; a stair under a step change's
    size (1 % of HBM: the chip lists no smaller jump); a stair of the leak at one moment
    with the chip's first jump (within an envelope), of another size."""
    from tpumon.detect.pooling import Stairs

    leak = stepped(Verdict.LEAK, [(1.0, 1.4), (2.0, 1.4), (3.0, 1.4)], own=1.4)
    climber = stepped(Verdict.STEP_CHANGE, [(1.0, 1.4), (2.0, 1.4)])

    def leaking(chips):
        pooled = pool_jobs(chips, {c: "job" for c in chips})
        return sorted(c for c, a in pooled.items() if a.verdict is Verdict.LEAK)

    other = stepped(Verdict.LEAK, [(1.5, 0.4), (2.5, 0.4), (3.5, 0.4)], own=0.4)
    assert leaking({"A": leak, "B": other, "c": climber}) == ["A", "B", "c"]
    small = stepped(Verdict.LEAK, [(1.0, 1.4), (1.5, 0.3), (2.0, 1.4), (3.0, 1.4)], own=1.4)
    assert leaking({"A": small, "c": climber}) == ["A", "c"]  # 0.3 GiB < 0.32 GiB
    big = stepped(Verdict.LEAK, [(1.0, 1.4), (1.5, 0.4), (2.0, 1.4), (3.0, 1.4)], own=1.4)
    assert leaking({"A": big, "c": climber}) == ["A"]  # a stair it should have shown
    for at in (1.0 - 400 / 3600, 1.0 + 400 / 3600, 2.0 - 400 / 3600):  # within an envelope
        near = stepped(Verdict.LEAK, [(1.0, 1.4), (at, 0.5), (2.0, 1.4), (3.0, 1.4)], own=1.4)
        assert leaking({"A": near, "c": climber}) == ["A", "c"], at
    apart = stepped(Verdict.LEAK, [(1.0, 1.4), (1.0 + 600 / 3600, 0.5), (2.0, 1.4)], own=1.4)
    assert leaking({"A": apart, "c": climber}) == ["A"]  # 600 s: beyond its envelope
    # another rank's staircase at other times does not let in a chip that missed a stair
    skipped = stepped(Verdict.STEP_CHANGE, [(1.0, 1.4), (3.0, 1.4)])
    later = stepped(Verdict.LEAK, [(5.0, 1.4), (6.0, 1.4), (7.0, 1.4)], own=1.4)
    assert leaking({"A": leak, "B": later, "c": skipped}) == ["A", "B"]
    assert not Stairs([leak]).has_all(dataclasses.replace(climber, level_jumps=()))


def test_a_step_change_joins_when_a_staircase_comes_though_its_own_is_unchanged():
    """The replay decides pooled verdicts incrementally: chip 1 (two jumps) says nothing
    new when chip 0's leak, first a trend, becomes a staircase of the same jumps at t=300
    (the job's rate unchanged): chip 1 must still be looked at then, as ``pool_job`` does."""
    stairs = stepped(Verdict.LEAK, [(0.01, 1.4), (0.03, 1.5), (0.05, 1.4)], own=1.4)
    logs = [[(100.0, 0.0, dataclasses.replace(stairs, level_jumps=())), (300.0, 0.0, stairs)],
            [(100.0, 0.0, stepped(Verdict.STEP_CHANGE, [(0.01, 1.5), (0.03, 1.4)]))],
            [(200.0, 0.0, fitted(Verdict.OK, -0.1, 0.0, 0.1))]]
    alerts = replayed_as_pool_job(logs)
    assert sorted((i, a["time"]) for i, a in alerts.items()) == [(0, 100.0), (1, 300.0)]


def test_chips_climbing_one_staircase_are_called_with_the_first_of_them():
    """bench/detect.py seed 0, irregular-stair-0-03 (stairs of 1.04 GiB every ~3600 steps
    at irregular times, on all 4 chips, 17 s polls): chip 3 confirms its third stair first
    and is called a staircase; chips 0-2 then say step_change (their two jumps, the same
    stairs) and alone are called only on their own third stair. Pooled, all four are called
    at chip 3's moment, the agent (every poll) and analyze (replay) alike."""
    from tpumon.detect.job_replay import run_chip

    cols = by_chip(generate_trace(
        "irregular-staircase", duration_s=24954.0, poll_interval_s=16.7, chips=4,
        host=HOST, seed=10007003, drop_probability=0.0208, poll_jitter_s=0.373,
        hbm_total_bytes=34088157184, leak_onset_step=0, leak_bytes_per_step=0,
        stair_bytes=1117334529, stair_every_steps=3597))
    alone = [run_chip(c, None, log=False).alert["time"] for c in cols.values()]
    first = min(alone)
    assert sum(t == first for t in alone) < len(alone)  # some chips are called later alone
    replayed = {r.chip: r for r in replay_columns(cols)}
    assert {chip: r.alert["time"] for chip, r in replayed.items()} == \
        {chip: first for chip in replayed}
    agent = agent_alerts(cols)
    assert {chip: t for chip, (t, _) in agent.items()} == {chip: first for chip in replayed}
    for chip, (_, forecast) in agent.items():
        assert replayed[chip].alert["predicted_oom_time"] == forecast


def test_a_job_end_holds_the_forecast_of_the_pooled_alert_that_was_raised():
    """The leak alert that is logged and notified is a chip's first pooled leak, the
    moment ``analyze`` gives; a job end compared the death with the chip's own first leak
    instead, minutes later and another forecast ("forecast at 08:06 for step 28,050" on the
    report beside "leak alert 08:00" with step 26,601)."""
    from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
    from tpumon.common.samples import Sample
    from tpumon.metrics.collectors import build_registry
    from tpumon.common.identity import Identity
    from tpumon.sources.chips import inventory_for
    from tpumon.sources.tpu_runtime import TpuRuntimeSource
    from tpumon.state import AgentState

    cols = columns("linear-leak", 10, 11, leak_chip_spread=0.3)
    replayed = {r.chip: r for r in replay_columns(cols)}
    first_leak = min(r.alert["time"] for r in replayed.values())
    detectors, last = {}, {}
    for (_, chip), c in cols.items():
        n = int(np.searchsorted(c.times, first_leak, side="right"))
        detectors[chip] = ChipDetector()
        detectors[chip].update(c.times[:n - 1], c.steps[:n - 1], c.used[:n - 1],
                               c.total[:n - 1])
        step = c.steps[n - 1]
        last[chip] = Sample(c.times[n - 1], None if math.isnan(step) else int(step),
                            c.used[n - 1], c.total[n - 1])
    inventory = inventory_for("v4", 4)
    state = AgentState(Identity(host="h"), inventory)
    agent = Agent(AgentInputs(state, TpuRuntimeSource("127.0.0.1", [], 1.0, inventory),
                              OwnerScanner(dict, 60), 1.0,
                              build_registry(lambda: state.current), detectors=detectors))
    agent._detect(last, {chip: 7 for chip in detectors})
    joined = [c for c, d in detectors.items() if d.alert is None]
    assert joined  # some chips are leak only by their job's evidence
    for chip, r in replayed.items():
        held = agent._pooled_alerts[chip]
        assert held["time"] == r.alert["time"] == first_leak
        assert held["predicted_oom_time"] == r.alert["predicted_oom_time"]


def test_one_worker_of_a_slice_is_told_as_its_host_and_two_as_the_slice():
    """One agent's store holds its own worker's chips: its /report said "all 4 chips of
    slice demo-pod grow" of a 16-chip slice. A slice of which the data hold one worker is
    named by that host; with more, by the slice."""
    cols = columns("linear-leak", 10, 11, leak_chip_spread=0.3)
    one = {("demo-pod-w-2", chip): c for (_, chip), c in cols.items()}
    said = {r.assessment.reason for r in replay_columns(one) if r.verdict == "leak"}
    assert said and all(s.startswith("all 4 chips of host demo-pod-w-2 grow") for s in said), said
    two = {**one, **{("demo-pod-w-3", chip): c for (_, chip), c in cols.items()}}
    said = {r.assessment.reason for r in replay_columns(two) if r.verdict == "leak"}
    assert said and all(s.startswith("all 8 chips of slice demo-pod grow") for s in said), said
