"""Chips of one job share evidence: the agent (every poll) and analyze (replay) agree."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpumon.detect import ChipDetector, Verdict
from tpumon.detect.pooling import pool_jobs
from tpumon.detect.replay import replay_columns
from tpumon.report.data import build_reports
from tpumon.sim.tracegen import generate_trace
from tpumon.trace import SeriesColumns

HOST = "t1v-n-77aa"


def columns(scenario: str, hours: float, seed: int, **overrides) -> dict:
    rows = list(generate_trace(scenario, duration_s=hours * 3600, poll_interval_s=10, chips=4,
                               seed=seed, host=HOST, drop_probability=0.02, **overrides))
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
    assert all(r.assessment.reason.startswith(f"all 4 chips of host {HOST} grow ")
               for r in pooled)
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
    from tpumon.agent import Agent, AgentInputs, OwnerScanner
    from tpumon.exporters.prometheus import build_registry
    from tpumon.identity import Identity
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
                              build_registry(lambda: state.snapshot), detectors=detectors))
    held = agent._detect({}, {chip: 7 for chip in detectors})
    assert all(a.verdict is Verdict.LEAK for a in held.values())
    missed = agent._detect({}, {})
    assert {c: a.verdict for c, a in missed.items()} == {c: Verdict.LEAK for c in detectors}


@pytest.mark.parametrize("scenario,seed", [("linear-leak", 11), ("chip0-leak", 3)])
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
        assert all(a[1] == b[0] for a, b in zip(chip.verdicts, chip.verdicts[1:]))
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
    from tpumon.detect import replay

    cols = dict(columns("linear-leak", 6, 11, leak_chip_spread=0.3))
    first = next(iter(cols.values()))
    cols[("small-host", "0")] = SeriesColumns(*(column[:500] for column in first))
    jobs = {}
    for (host, chip), c in cols.items():
        jobs.setdefault(replay.job_name(host), []).append((host, chip, c))
    job_list = list(jobs.items())
    sizes = [sum(len(c.times) for _, _, c in series) for _, series in job_list]
    tasks = replay._tasks(job_list, sizes, 2)
    assert sorted(tasks) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, None)]
    assert tasks[-1] == (1, None)  # largest first: the small job last
    assert_forked_replay_is_the_same(cols, monkeypatch)


def test_a_healthy_chip_whose_cache_still_fills_does_not_join_a_one_rank_leak():
    """bench/detect.py seed 3, chip0-leak-0-02: chip 0 leaks ~650 MiB/h from the job's
    start; chips 1-3, an hour in, still fill a cache at ~170 MiB/h, significant at 95 %,
    with an interval reaching up to half the leak's rate. They joined the leak at its rate
    (three false alarms): a chip joins only when its own estimate is of the job's size."""
    from tpumon.detect import Assessment

    hour, gib = 3600.0, 2.0**30

    def chip(verdict: Verdict, low: float, own: float, high: float) -> Assessment:
        return Assessment(verdict, "", floor_bytes=8 * gib, transient_bytes=2 * gib,
                          total_bytes=16 * gib, slope_bytes_per_second=own * gib / hour,
                          slope_bytes_per_second_low=low * gib / hour,
                          slope_bytes_per_second_high=high * gib / hour,
                          window_start=0.0, window_seconds=2700.0)

    leak = chip(Verdict.LEAK, 0.58, 0.64, 0.71)
    filling = chip(Verdict.OK, 0.14, 0.17, 0.40)
    pooled = pool_jobs({"0": leak, "1": filling}, {"0": "h", "1": "h"})
    assert pooled["1"].verdict is Verdict.OK
    alike = chip(Verdict.OK, 0.25, 0.45, 0.80)  # a chip that does grow like the leak joins
    assert pool_jobs({"0": leak, "1": alike}, {"0": "h", "1": "h"})["1"].verdict is Verdict.LEAK
