"""Leak detector benchmark (issue 3, item 6): tpumon against Prometheus ``predict_linear`` rules.

Why a generated corpus: leaking TPU runs cannot be recorded for CI, and a score means
something only against ground truth (did this chip leak, from when, when did the job die).
The simulator (:mod:`tpumon.sim.workload`) has both. This draws many runs of its scenarios
with randomized nuisances (poll interval, dropped polls, jitter, chip size, blank step
numbers, restarts), labels every chip-series, writes them all as one trace file and scores:

- tpumon: ``tpumon.detect.replay.analyze_file``, what ``tpumon analyze`` runs on that file
  (timed end to end in CPU seconds: that is what a user waits for);
- two Prometheus alert rules, what a team would deploy without tpumon, evaluated as
  Prometheus does (a 60 s rule-evaluation grid; ``predict_linear`` = least squares over the
  raw samples in ``(t - range, t]`` with the intercept at ``t``; ``for:`` = the condition
  held at every evaluation for that long) on the same samples.

Leak rates are set per run from the chip's headroom at the leak's onset so that the job
OOMs 20k-80k steps after the onset, as the runs the issue describes do; every run is then
checked against the simulator's own OOM time and redrawn if it falls outside.

Usage: ``.venv/bin/python bench/detect.py [--quick] [--seed N] [--keep-trace DIR]
[--all-failures] [--check] [--seeds A-B]``. Prints a markdown report on stdout; ``--check``
exits 1 when tpumon misses a target (for CI), ``--quick`` uses a small corpus (smoke test),
``--seeds`` scores tpumon alone on the corpus of each seed (held-out corpora).
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tpumon.sim.tracegen import generate_trace
from tpumon.sim.workload import V4_HBM_TOTAL_BYTES, Job, Scenario, Workload
from tpumon.trace.schema import TraceRow
from tpumon.trace.write import write_trace

HOUR = 3600.0
START_TIME = 1750000000.0
CHIPS = 4
OOM_STEPS = (20_000, 80_000)  # steps from the leak's onset to the OOM: the range
HEALTHY_HOURS = (12.0, 24.0)  # length of traces without an OOM
POLL_INTERVAL_S = (5.0, 30.0)
DROP_PROBABILITY = (0.0, 0.05)
POLL_JITTER_S = (0.0, 0.5)
# v4 (32 GiB), v5e (16 GiB), v5p (95 GiB), with weights: the simulator scales the model to the chip.
HBM_SIZES = ((V4_HBM_TOTAL_BYTES, 3), (16 * 2**30, 1), (95 * 2**30, 1))

Key = tuple[str, str]  # (host, chip): a chip-series


# ================================================================ corpus


@dataclass(frozen=True)
class Group:
    """A family of runs in the corpus: one scenario, and how (whether) it leaks."""

    name: str
    scenario: str
    full: int  # traces in the full corpus
    quick: int  # traces with --quick
    leak: str | None = None  # "linear", "stair", "irregular" or "rate-change"; None: no leak
    onset: tuple[int, int] | None = None  # leak onset, steps into the job; None: from step 0
    overrides: tuple[tuple[str, Any], ...] = ()
    oom_steps: tuple[int, int] = OOM_STEPS  # steps from the onset to the OOM
    poll: tuple[float, float] = POLL_INTERVAL_S  # poll interval, seconds
    hosts: int = 1  # hosts of one slice (one job): CHIPS chips each
    jsonl: bool = False  # written as JSON Lines (a file of its own) rather than CSV


GROUPS: tuple[Group, ...] = (
    Group("linear-leak@0", "linear-leak", 6, 1, "linear"),
    Group("linear-leak@mid", "linear-leak", 6, 1, "linear", (5_000, 30_000)),
    Group("staircase-leak@0", "staircase-leak", 4, 1, "stair"),
    Group("staircase-leak@mid", "staircase-leak", 4, 1, "stair", (5_000, 30_000)),
    Group("chip0-leak@0", "chip0-leak", 4, 1, "linear"),
    Group("chip0-leak@mid", "chip0-leak", 4, 1, "linear", (5_000, 30_000)),
    # A healthy first job of 1-2 h (< 15k steps) crashes; the resumed job leaks from its onset.
    Group("restart+leak", "linear-leak", 4, 1, "linear", (15_000, 30_000),
          (("restarts", 1), ("restart_after_s", (3600.0, 7200.0)))),
    # The kinds that were late or missed on held-out traces (issue 20): irregular staircases,
    # fast leaks (OOM 2-4 h after the onset), slow polls, a rate that changes part-way,
    # slice-wide leaks on every chip of a multi-host slice; some traces as JSON Lines.
    Group("irregular-stair@0", "irregular-staircase", 6, 1, "irregular"),
    Group("irregular-stair@mid", "irregular-staircase", 4, 1, "irregular", (5_000, 30_000)),
    Group("fast-leak", "linear-leak", 6, 1, "linear", (3_000, 15_000),
          oom_steps=(10_000, 20_000)),
    Group("slow-poll-leak", "linear-leak", 6, 1, "linear", (3_000, 20_000), poll=(30.0, 60.0),
          jsonl=True),
    Group("rate-change", "leak-rate-change", 6, 1, "rate-change", (3_000, 20_000)),
    Group("slice-leak", "linear-leak", 3, 1, "linear", (3_000, 20_000), hosts=4),
    Group("slice-stair", "staircase-leak", 2, 1, "stair", hosts=2, jsonl=True),
    Group("slice-chip0-leak", "chip0-leak", 2, 1, "linear", (3_000, 20_000), hosts=2),
    Group("healthy", "healthy", 14, 2),
    Group("slice-healthy", "healthy", 3, 1, hosts=4, jsonl=True),
    Group("slow-poll-healthy", "healthy", 4, 1, poll=(30.0, 60.0)),
    Group("step-change", "step-change", 12, 2,
          overrides=(("step_change_at_step", (3_000, 40_000)),)),
    Group("saturating-cache", "saturating-cache", 6, 1),
    Group("job-restart", "job-restart", 6, 1, overrides=(("restarts", (1, 2)),)),
)
OTHER_CHIPS = "chip0-leak other chips"  # category of the healthy chips of a chip0-leak run


@dataclass(frozen=True)
class TraceSpec:
    """Everything that makes one trace, so that a failure can be regenerated exactly."""

    group: str
    scenario: str
    host: str
    seed: int
    duration_s: float
    poll_interval_s: float
    drop_probability: float
    poll_jitter_s: float
    hbm_total_bytes: int
    steps: bool  # False: the step column is blank, as from an agent that cannot see steps
    overrides: tuple[tuple[str, Any], ...] = ()
    hosts: int = 1  # a slice of this many hosts, CHIPS chips each, running one job

    def host_of(self, chip_index: int) -> str:
        """The host of the slice's chip ``chip_index``: ``HOST-w-K`` in a slice."""
        return self.host if self.hosts == 1 else f"{self.host}-w-{chip_index // CHIPS}"

    def workload(self) -> Workload:
        """The workload ``rows()`` polls (a separate instance: sampling it does not change the
        trace)."""
        return Workload(self.scenario, chips=CHIPS * self.hosts,
                        hbm_total_bytes=self.hbm_total_bytes,
                        seed=self.seed, start_time=START_TIME, **dict(self.overrides))

    def rows(self) -> Iterator[TraceRow]:
        rows = generate_trace(
            self.scenario, duration_s=self.duration_s, poll_interval_s=self.poll_interval_s,
            chips=CHIPS * self.hosts, host=self.host, seed=self.seed, start_time=START_TIME,
            drop_probability=self.drop_probability, poll_jitter_s=self.poll_jitter_s,
            hbm_total_bytes=self.hbm_total_bytes, **dict(self.overrides))
        if self.steps and self.hosts == 1:
            return rows
        # a slice's chips split among its hosts; a blank step column where steps are unknown
        return (TraceRow(r.time, self.host_of(int(r.chip)), str(int(r.chip) % CHIPS),
                         r.step if self.steps else None, r.hbm_used_bytes, r.hbm_total_bytes)
                for r in rows)

    def repro(self) -> str:
        """A generate_trace call that regenerates this trace, for failure listings."""
        extra = "".join(f", {k}={v!r}" for k, v in self.overrides)
        call = (f"generate_trace({self.scenario!r}, duration_s={self.duration_s!r}, "
                f"poll_interval_s={self.poll_interval_s!r}, chips={CHIPS * self.hosts}, "
                f"host={self.host!r}, "
                f"seed={self.seed}, drop_probability={self.drop_probability!r}, "
                f"poll_jitter_s={self.poll_jitter_s!r}, "
                f"hbm_total_bytes={self.hbm_total_bytes}{extra})")
        return call if self.steps else call + " with step blanked"


@dataclass(frozen=True)
class Truth:
    """Ground truth of one chip-series."""

    spec: TraceSpec
    chip: str
    category: str
    leaking: bool
    onset_time: float | None = None  # leaking: when the leak starts growing the floor
    onset_step: int | None = None  # leaking: steps into the job at the onset
    oom_time: float | None = None  # when the job died of OOM; None if it did not
    job_starts: tuple[float, ...] = ()  # when each job (the first, and each restart) started
    host: str = ""  # the chip's host, in a slice of several; else the spec's

    @property
    def key(self) -> Key:
        return (self.host or self.spec.host, self.chip)

    def since_job_start(self, t: float) -> float:
        """Seconds from the start of the job running at ``t`` (inf before the first one)."""
        return min((t - s for s in self.job_starts if s <= t), default=math.inf)


Case = tuple[TraceSpec, list[Truth]]


def plan_corpus(seed: int = 0, quick: bool = False) -> list[Case]:
    """Draw every trace of the corpus and its labels (no rows yet: those stream to the file)."""
    rng = random.Random(f"tpumon-bench-detect:{seed}")
    cases = []
    for g, group in enumerate(GROUPS):
        for i in range(group.quick if quick else group.full):
            # Every fourth trace without step numbers, staggered so that --quick has some too.
            steps = (i + g) % 4 != 3
            cases.append(plan_case(group, i, seed * 100_000 + g * 1_000 + i, steps, rng))
    return cases


def plan_case(group: Group, index: int, seed: int, steps: bool, rng: random.Random) -> Case:
    """One trace of a group with drawn nuisances; a leak is calibrated, redrawn until it fits."""
    spec = TraceSpec(
        group=group.name, scenario=group.scenario,
        host=group.name.replace("@", "-").replace("+", "-") + f"-{index:02d}", seed=seed,
        duration_s=round(rng.uniform(*HEALTHY_HOURS) * HOUR),
        poll_interval_s=round(rng.uniform(*group.poll), 1),
        drop_probability=round(rng.uniform(*DROP_PROBABILITY), 4),
        poll_jitter_s=round(rng.uniform(*POLL_JITTER_S), 3),
        hbm_total_bytes=rng.choices([s for s, _ in HBM_SIZES], [w for _, w in HBM_SIZES])[0],
        steps=steps, overrides=group.overrides, hosts=group.hosts)
    if group.leak is None:
        return spec, label(spec, spec.workload(), None)
    for attempt in range(20):
        planned = calibrate_leak(replace(spec, seed=seed + attempt * 10_000_000), group, rng)
        if planned is not None:
            return planned
    raise RuntimeError(f"could not calibrate a leak for {spec.host}")


def calibrate_leak(spec: TraceSpec, group: Group, rng: random.Random) -> Case | None:
    """Set the leak rate so that the job OOMs 20k-80k steps after the onset, or None.

    The first guess is the headroom at the onset (total - floor - largest transient) over
    the drawn number of steps; the simulator's OOM time then decides, and the rate is
    rescaled by the miss (the cache still filling after an early onset eats headroom too).
    """
    onset = rng.randint(*group.onset) if group.onset else 0
    low, high = group.oom_steps
    target = rng.uniform(low + 0.07 * (high - low), high - 0.07 * (high - low))
    every = {"stair": rng.randint(400, 600),
             "irregular": round(target / rng.uniform(6.0, 10.0))}.get(group.leak or "", 1)
    # Every fault field a scalar: ranges would be drawn from the seed's stream and shift the
    # other parameters between the probe and the final run.
    fixed = {**dict(spec.overrides), "leak_onset_step": onset, "leak_bytes_per_step": 0,
             "stair_bytes": 0}
    if every > 1:
        fixed["stair_every_steps"] = every
    if group.leak == "rate-change":
        fixed.update(leak_change_step=round(target * rng.uniform(0.2, 0.5)),
                     leak_change_factor=round(rng.uniform(1.5, 3.0), 2))
    probe = replace(spec, overrides=tuple({**fixed, "leak_bytes_per_step": 1}.items())).workload()
    rate = headroom_at_onset(probe, onset) / target
    for _ in range(4):
        size = "stair_bytes" if every > 1 else "leak_bytes_per_step"
        final = replace(spec, overrides=tuple({**fixed, size: round(rate * every)}.items()))
        w = final.workload()
        after = steps_after_onset_at_oom(w, onset)
        if after is None or not earlier_jobs_healthy(w, onset):
            return None
        if low <= after <= high:
            final = replace(final, duration_s=float(math.ceil(w.oom_time - START_TIME + 600)))
            if group.leak != "irregular":
                return final, label(final, w, onset)
            # jumps at random: a staircase of 6-12 of them before the OOM, and the leak
            # begins with the first (before it nothing has leaked)
            stairs = w.irregular_stair_steps
            if not 6 <= bisect.bisect_right(stairs, after) <= 12:
                return None
            return final, label(final, w, onset + stairs[0])
        rate *= after / target
    return None


def headroom_at_onset(probe: Workload, onset: int) -> float:
    """Bytes per unit of leak rate that the leaking chips can still take at the onset.

    ``probe`` leaks 1 byte/step, so its per-chip rates are the chips' leak factors. The floor
    is taken no earlier than just after the first eval, when optimizer state and the eval
    executable are in it: before that the headroom would be overstated by gigabytes.
    """
    p = probe.params
    ref_step = max(onset, (p.eval_every_steps or 0) + 1)
    floors = probe.floor_bytes(time_at_step(probe, probe.jobs[-1], ref_step))
    transient = largest_transient(p)
    return min((probe.hbm_total_bytes - f - transient) / k
               for f, k in zip(floors, probe.leak_bytes_per_step_by_chip, strict=True) if k > 0)


def largest_transient(p: Scenario) -> float:
    """The largest peak above the floor: a step's activations plus a save, or an eval's."""
    return max(p.train_transient_bytes + p.checkpoint_bytes,
               p.eval_transient_bytes) * (1 + p.chip_imbalance)


def steps_after_onset_at_oom(w: Workload, onset: int) -> int | None:
    """Steps the dying job did after the onset before it OOMed; None without an OOM."""
    if w.oom_time is None:
        return None
    job = w.jobs[-1]
    return w.sample(w.oom_time - 1e-3).step - job.resume_step - onset


def earlier_jobs_healthy(w: Workload, onset: int) -> bool:
    """Jobs before the last one crashed before reaching the onset: only the last one leaked."""
    return all(j.end_reason == "crash" and steps_done(w, j) < onset for j in w.jobs[:-1])


def steps_done(w: Workload, job: Job) -> int:
    return w.sample(job.end_time - 1e-3).step - job.resume_step


def time_at_step(w: Workload, job: Job, n: int) -> float:
    """First time at which ``job`` has done ``n`` steps (bisection: steps only grow in a job)."""
    lo = job.start_time
    hi = (job.end_time if math.isfinite(job.end_time) else job.start_time + 1000 * HOUR) - 1e-3

    def done(t: float) -> bool:
        s = w.sample(t)
        return s.runtime_up and s.step - job.resume_step >= n

    if not done(hi):
        raise ValueError(f"job starting at {job.start_time} never reaches step {n}")
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if done(mid) else (mid, hi)
    return hi


def label(spec: TraceSpec, w: Workload, onset: int | None) -> list[Truth]:
    """Truth per chip: the chips the scenario leaks are positives, all others negatives."""
    chips = [(spec.host_of(i), str(i % CHIPS)) for i in range(CHIPS * spec.hosts)]
    starts = tuple(j.start_time for j in w.jobs)
    if onset is None:
        return [Truth(spec, c, spec.group, False, job_starts=starts, host=h) for h, c in chips]
    leaking = range(len(chips)) if w.params.leak_chips is None else w.params.leak_chips
    onset_time = time_at_step(w, w.jobs[-1], max(onset, 1))
    return [Truth(spec, c, spec.group, True, onset_time, onset, w.oom_time, starts, host=h)
            if i in leaking
            else Truth(spec, c, OTHER_CHIPS, False, oom_time=w.oom_time, job_starts=starts, host=h)
            for i, (h, c) in enumerate(chips)]


@dataclass(frozen=True)
class Series:
    """One chip's samples as arrays: the baselines work on whole series at once."""

    times: np.ndarray
    used: np.ndarray
    total: np.ndarray


def write_corpus(cases: Sequence[Case], directory: str) -> dict[Key, Series]:
    """Stream every trace into the directory's corpus.csv, or corpus.jsonl for the groups
    written as JSON Lines (``tpumon analyze DIR`` reads both); keep each chip-series as
    arrays for the baselines."""
    columns: dict[Key, tuple[list[float], list[int], list[int]]] = defaultdict(lambda: ([], [], []))
    jsonl = {g.name for g in GROUPS if g.jsonl}

    def tee(as_jsonl: bool) -> Iterator[TraceRow]:
        for spec, _ in cases:
            if (spec.group in jsonl) != as_jsonl:
                continue
            for r in spec.rows():
                t, u, total = columns[(r.host, r.chip)]
                t.append(r.time)
                u.append(r.hbm_used_bytes)
                total.append(r.hbm_total_bytes)
                yield r

    os.makedirs(directory, exist_ok=True)
    write_trace(tee(False), os.path.join(directory, "corpus.csv"))
    write_trace(tee(True), os.path.join(directory, "corpus.jsonl"), format="jsonl")
    return {k: Series(np.array(t), np.array(u, dtype=float), np.array(tot, dtype=float))
            for k, (t, u, tot) in columns.items()}


# ================================================================ Prometheus baselines


@dataclass(frozen=True)
class Detection:
    """What a detector said about one series: its first alert and its OOM forecast then."""

    alert_time: float | None = None
    forecast_oom_time: float | None = None  # predicted OOM time as of the alert


@dataclass(frozen=True)
class PromRule:
    """``predict_linear(X[range], horizon) > total`` with ``for:``, as a Prometheus alert rule.

    X is the raw used-bytes series, or with ``floor_s`` the subquery
    ``min_over_time(used[floor_s])[range:1m]``: the floor, which is what a careful operator
    writes to see through the in-step sawtooth.
    """

    name: str
    range_s: float
    horizon_s: float
    for_s: float
    floor_s: float | None = None


RULE_RAW = PromRule("predict_linear(used[1h], 4h) > total for 15m", HOUR, 4 * HOUR, 900.0)
RULE_FLOOR = PromRule("predict_linear(min_over_time(used[15m])[6h:1m], 24h) > total for 1h",
                      6 * HOUR, 24 * HOUR, HOUR, floor_s=900.0)
EVAL_INTERVAL_S = 60.0  # rule evaluation interval, also the subquery resolution
LOOKBACK_S = 300.0  # Prometheus' instant-vector lookback, for ``total``


def evaluate_rule(rule: PromRule, s: Series, interval: float = EVAL_INTERVAL_S) -> Detection:
    """The rule's first firing over one series, and its forecast then (tpumon's alert semantics)."""
    firings = rule_firings(rule, s, interval)
    return firings[0] if firings else Detection()


def rule_firings(rule: PromRule, s: Series, interval: float = EVAL_INTERVAL_S) -> list[Detection]:
    """Every time the rule starts firing over one series (an alert resolves and can fire again)."""
    grid = eval_grid(s.times, interval)
    xs, ys = ((s.times, s.used) if rule.floor_s is None
              else min_over_time_points(s, grid, rule.floor_s))
    slope, level = windowed_ols(xs, ys, grid, rule.range_s)
    total = instant(s.times, s.total, grid)
    return [Detection(float(grid[k]), crossing_time(grid[k], level[k], slope[k], total[k]))
            for k in firing_starts(grid, level + slope * rule.horizon_s > total, rule.for_s)]


def eval_grid(times: np.ndarray, interval: float) -> np.ndarray:
    """Evaluation times: multiples of the interval (Prometheus aligns them) covering the series."""
    first = math.ceil(times[0] / interval) * interval
    last = math.ceil(times[-1] / interval) * interval
    return first + interval * np.arange(round((last - first) / interval) + 1)


def windowed_ols(xs: np.ndarray, ys: np.ndarray, at: np.ndarray,
                 range_s: float) -> tuple[np.ndarray, np.ndarray]:
    """predict_linear's fit at each time in ``at``: (slope, fitted value at that time).

    Least squares over the points with x in ``(t - range_s, t]``, by prefix sums so a day at
    5 s polls costs milliseconds. NaN where fewer than two points (Prometheus returns nothing).
    Coordinates are shifted to the first point, which keeps the sums well inside float64.
    """
    lo = np.searchsorted(xs, at - range_s, side="right")
    hi = np.searchsorted(xs, at, side="right")
    x, y = xs - xs[0], ys - ys[0]
    sx, sy, sxx, sxy = (window_sums(v, lo, hi) for v in (x, y, x * x, x * y))
    n = (hi - lo).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        var, cov = n * sxx - sx * sx, n * sxy - sx * sy
        slope = np.where((n >= 2) & (var > 0), cov / var, np.nan)
        level = ys[0] + sy / n + slope * (at - xs[0] - sx / n)
    return slope, level


def window_sums(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    prefix = np.concatenate(([0.0], np.cumsum(v)))
    return prefix[hi] - prefix[lo]


def min_over_time_points(s: Series, grid: np.ndarray, window_s: float
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The subquery ``min_over_time(used[window])`` at every grid time that has samples.

    Each sample falls in the grid cell ``(g - step, g]``; a window of k cells is the sliding
    minimum over k cell minima, exactly ``(g - window, g]`` when the window is a whole
    number of steps (15 m over 1 m).
    """
    step = grid[1] - grid[0] if len(grid) > 1 else EVAL_INTERVAL_S
    cells = round(window_s / step)
    cell_min = np.full(len(grid), np.inf)
    np.minimum.at(cell_min, np.searchsorted(grid, s.times, side="left"), s.used)
    padded = np.concatenate((np.full(cells - 1, np.inf), cell_min))
    mins = sliding_window_view(padded, cells).min(axis=1)
    present = np.isfinite(mins)
    return grid[present], mins[present]


def instant(times: np.ndarray, values: np.ndarray, at: np.ndarray,
            lookback: float = LOOKBACK_S) -> np.ndarray:
    """An instant vector at each time: the latest sample within the lookback, else NaN."""
    i = np.searchsorted(times, at, side="right") - 1
    found = (i >= 0) & (at - times[np.maximum(i, 0)] <= lookback)
    return np.where(found, values[np.maximum(i, 0)], np.nan)


def firing_starts(grid: np.ndarray, condition: np.ndarray, for_s: float) -> list[int]:
    """Indices of the evaluations at which the alert goes from pending to firing.

    It fires once the condition has been true at every evaluation for ``for_s``; a false
    (or empty) evaluation resolves it or resets the pending alert, as in Prometheus.
    """
    idx = np.arange(len(condition))
    run_start = np.maximum.accumulate(np.where(condition, 0, idx + 1))
    held_since = grid[np.minimum(run_start, len(grid) - 1)]
    firing = condition & (grid - held_since >= for_s - 1e-6)
    return np.flatnonzero(firing & ~np.concatenate(([False], firing[:-1]))).tolist()


def crossing_time(t: float, level: float, slope: float, total: float) -> float | None:
    """When the rule's line reaches the total: its OOM forecast as of ``t``."""
    return float(t + (total - level) / slope) if slope > 0 else None


def run_rule(rule: PromRule, series: dict[Key, Series]) -> tuple[dict[Key, list[Detection]], float]:
    """Every series through one rule; (all firings per series, seconds)."""
    start = time.perf_counter()
    firings = {k: rule_firings(rule, s) for k, s in series.items()}
    return firings, time.perf_counter() - start


# ================================================================ tpumon


AnalyzeFile = Callable[[str], list[Any]]


def load_analyze() -> AnalyzeFile | None:
    """tpumon's replay entry point (what ``tpumon analyze`` runs), or None without one."""
    try:
        from tpumon.detect import replay
    except ImportError:
        return None
    return replay.analyze_path


@dataclass(frozen=True)
class Throughput:
    """Samples per second of analyze: end to end (parse + detect) and the detector alone."""

    samples: int
    end_to_end_s: float
    read_s: float
    detector_s: float

    def rate(self, seconds: float) -> float:
        return self.samples / seconds if seconds > 0 else math.inf


def run_tpumon(analyze: AnalyzeFile, path: str
               ) -> tuple[dict[Key, Detection], Throughput, list[str]]:
    """Replay the corpus file through the detector; detections, timings, contract violations.

    Timings are CPU seconds of this process (one core), not wall time: the machines here
    are shared, and CPU time is what "samples per second on one core" means.
    """
    from tpumon.detect.job_replay import replay_series
    from tpumon.trace.read import read_trace_columns

    start = time.process_time()
    results = analyze(path)
    end_to_end = time.process_time() - start
    start = time.process_time()
    columns = {k: c for name in sorted(os.listdir(path))
               for k, c in read_trace_columns(os.path.join(path, name)).items()}
    read = time.process_time() - start
    start = time.process_time()
    for (host, chip), c in columns.items():
        replay_series(host, chip, c.times, c.steps, c.used, c.total)
    detector = time.process_time() - start
    samples = sum(len(c.times) for c in columns.values())
    return (tpumon_detections(results), Throughput(samples, end_to_end, read, detector),
            contract_violations(results))


def tpumon_detections(results: Iterable[Any]) -> dict[Key, Detection]:
    """SeriesResults as Detections: the first alert and the OOM forecast made at that alert."""
    out = {}
    for r in results:
        alert = r.alert
        forecast = getattr(r, "alert_forecast", None) if alert else None
        out[(r.host, str(r.chip))] = Detection(alert["time"] if alert else None,
                                               forecast["time"] if forecast else None)
    return out


def contract_violations(results: Iterable[Any]) -> list[str]:
    """Series whose final verdict is ``leak`` without an alert: contracts.md forbids it."""
    return [f"{r.host} chip {r.chip}: verdict leak with alert null"
            for r in results if r.verdict == "leak" and r.alert is None]


# ================================================================ scoring

HIT, MISS, LATE, EARLY, FALSE_ALARM, QUIET = "hit", "miss", "late", "early", "false alarm", "quiet"


@dataclass(frozen=True)
class Outcome:
    """One series judged: hit/miss/late (after the OOM)/early (before the onset) or false
    alarm/quiet."""

    truth: Truth
    detection: Detection
    verdict: str
    lead: float | None = None  # hits: share of onset-to-OOM left at the alert
    # hits: |forecast - OOM| / (OOM - alert); inf without a forecast
    forecast_error: float | None = None


def judge(truth: Truth, d: Detection) -> Outcome:
    """Judge one detection against the truth.

    An alert before the onset of a leaking series is judged early: it was raised on data
    that held no leak yet, so it counts as a false alarm and the leak as missed (the
    contract reports only the first alert).
    """
    a = d.alert_time
    if not truth.leaking:
        return Outcome(truth, d, QUIET if a is None else FALSE_ALARM)
    if a is None:
        return Outcome(truth, d, MISS)
    onset, oom = truth.onset_time, truth.oom_time
    assert onset is not None and oom is not None
    if a < onset:
        return Outcome(truth, d, EARLY)
    if a >= oom:
        return Outcome(truth, d, LATE)
    error = math.inf if d.forecast_oom_time is None else abs(d.forecast_oom_time - oom) / (oom - a)
    return Outcome(truth, d, HIT, (oom - a) / (oom - onset), error)


def judge_all(truths: Iterable[Truth], detections: dict[Key, Detection]) -> list[Outcome]:
    """A series the detector did not report counts as never alerting."""
    return [judge(t, detections.get(t.key, Detection())) for t in truths]


def judge_firings(truth: Truth, firings: Sequence[Detection]) -> tuple[Outcome, bool]:
    """Judge every firing of a Prometheus alert, not only the first: (outcome, falsely paged).

    The outcome takes the first firing between the onset and the OOM; "falsely paged" says
    some firing came with no leak present (a non-leaking series, or before the onset).
    """
    verdicts = [judge(truth, f) for f in firings]
    in_time = [o for o in verdicts if o.verdict == HIT]
    outcome = in_time[0] if in_time else judge(truth, Detection())
    return outcome, any(o.verdict in (FALSE_ALARM, EARLY) for o in verdicts)


@dataclass(frozen=True)
class Scores:
    """A detector's figures over a set of outcomes (the whole corpus or one category)."""

    outcomes: tuple[Outcome, ...]

    def count(self, *verdicts: str) -> int:
        return sum(o.verdict in verdicts for o in self.outcomes)

    @property
    def positives(self) -> int:
        return sum(o.truth.leaking for o in self.outcomes)

    @property
    def negatives(self) -> int:
        return len(self.outcomes) - self.positives

    @property
    def precision(self) -> float:
        alerts = self.count(HIT, FALSE_ALARM, EARLY)
        return self.count(HIT) / alerts if alerts else math.nan

    @property
    def recall(self) -> float:
        return self.count(HIT) / self.positives if self.positives else math.nan

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else math.nan

    @property
    def median_lead(self) -> float:
        """Over detected leaks: how early the alerts that count came."""
        return median([o.lead for o in self.outcomes if o.verdict == HIT])

    @property
    def p10_lead(self) -> float:
        """Over detected leaks: the lead that 90 % of the alerts beat (the late tail)."""
        leads = [o.lead for o in self.outcomes if o.verdict == HIT and o.lead is not None]
        return float(np.percentile(leads, 10)) if leads else math.nan

    @property
    def median_lead_all(self) -> float:
        """Over all leaks, a miss (or a late or early alert) counting as no lead at all."""
        return median([o.lead or 0.0 for o in self.outcomes if o.truth.leaking])

    @property
    def median_delay_h(self) -> float:
        """Over detected leaks: hours from the onset to the alert (lead in absolute terms)."""
        return median([(o.detection.alert_time - o.truth.onset_time) / HOUR
                       for o in self.outcomes if o.verdict == HIT])  # type: ignore[operator]

    @property
    def median_forecast_error(self) -> float:
        return median([o.forecast_error for o in self.outcomes if o.verdict == HIT])

    def near_job_start(self, seconds: float) -> int:
        """Alerts raised so soon after a (re)start that the warm-up ramp is in every window."""
        return sum(o.detection.alert_time is not None
                   and o.truth.since_job_start(o.detection.alert_time) < seconds
                   for o in self.outcomes)

    def where(self, keep: Callable[[Truth], bool]) -> Scores:
        return Scores(tuple(o for o in self.outcomes if keep(o.truth)))


def median(values: Sequence[float | None]) -> float:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else math.nan


# ================================================================ report


@dataclass(frozen=True)
class Metric:
    """One row of the summary table: how to read it off Scores, and its target (if any)."""

    name: str
    target: str
    value: Callable[[Scores], float]
    show: Callable[[float], str]
    ok: Callable[[float], bool] | None = None


def ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def percent(x: float) -> str:
    return "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else f"{100 * x:.1f}%")


def false_alarm_metric(category: str, target_zero: bool) -> Metric:
    def alarms(s: Scores) -> float:
        return s.where(lambda t: t.category == category).count(FALSE_ALARM)

    return Metric(f"false alarms: {category}", "0" if target_zero else "-", alarms,
                  lambda x: f"{x:.0f}", (lambda x: x == 0) if target_zero else None)


SUMMARY: tuple[Metric, ...] = (
    Metric("precision", ">= 0.98", lambda s: s.precision, ratio, lambda x: x >= 0.98),
    Metric("recall", ">= 0.95", lambda s: s.recall, ratio, lambda x: x >= 0.95),
    Metric("F1", ">= 0.98", lambda s: s.f1, ratio, lambda x: x >= 0.98),
    false_alarm_metric("healthy", True),
    false_alarm_metric("step-change", True),
    false_alarm_metric("saturating-cache", False),
    false_alarm_metric("job-restart", False),
    false_alarm_metric(OTHER_CHIPS, False),
    Metric("alerts before the onset (leaking series)", "-", lambda s: s.count(EARLY),
           lambda x: f"{x:.0f}"),
    Metric("alerts after the OOM (leaking series)", "-", lambda s: s.count(LATE),
           lambda x: f"{x:.0f}"),
    Metric("first alerts within 2 h of a job start (all series)", "-",
           lambda s: s.near_job_start(2 * HOUR), lambda x: f"{x:.0f}"),
    Metric("median lead (detected leaks)", ">= 0.8", lambda s: s.median_lead, ratio,
           lambda x: x >= 0.8),
    Metric("10th-percentile lead (detected leaks)", ">= 0.6", lambda s: s.p10_lead, ratio,
           lambda x: x >= 0.6),
    Metric("median lead (all leaks, miss = 0)", "-", lambda s: s.median_lead_all, ratio),
    Metric("median hours from onset to alert (detected leaks)", "-", lambda s: s.median_delay_h,
           lambda x: "n/a" if math.isnan(x) else f"{x:.2f}"),
    Metric("median OOM-forecast error at alert", "<= 25%", lambda s: s.median_forecast_error,
           percent, lambda x: x <= 0.25),
)
THROUGHPUT_TARGET = 200_000.0


def cell(metric: Metric, scores: Scores | None) -> str:
    if scores is None:
        return "n/a"
    x = metric.value(scores)
    mark = "" if metric.ok is None else (" ✓" if not math.isnan(x) and metric.ok(x) else " ✗")
    return metric.show(x) + mark


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def summary_table(columns: Sequence[tuple[str, Scores | None]],
                  throughput: Throughput | None) -> list[str]:
    rows = [[m.name, m.target] + [cell(m, s) for _, s in columns] for m in SUMMARY]
    shown = "n/a"
    if throughput is not None:
        rate = throughput.rate(throughput.end_to_end_s)
        shown = f"{rate:,.0f}" + (" ✓" if rate >= THROUGHPUT_TARGET else " ✗")
    rows.append(["analyze throughput, end to end (samples/s)", ">= 200,000", shown]
                + ["-"] * (len(columns) - 1))
    return table(["metric", "target"] + [name for name, _ in columns], rows)


def categories() -> list[str]:
    """Leaking groups first, then every kind of non-leaking series."""
    return ([g.name for g in GROUPS if g.leak] + [OTHER_CHIPS]
            + [g.name for g in GROUPS if not g.leak])


def hours_to_oom(t: Truth) -> float:
    assert t.oom_time is not None and t.onset_time is not None
    return (t.oom_time - t.onset_time) / HOUR


def category_cell(s: Scores) -> str:
    """Leaking rows: detected/total, lead, forecast error; others: false alarms/total."""
    if not s.outcomes:
        return "-"
    if s.positives:
        return (f"{s.count(HIT)}/{s.positives} · lead {ratio(s.median_lead)} · "
                f"err {percent(s.median_forecast_error)}")
    return f"{s.count(FALSE_ALARM)}/{s.negatives} false"


def category_table(columns: Sequence[tuple[str, Scores | None]]) -> list[str]:
    cuts: list[tuple[str, Callable[[Truth], bool]]] = [
        (c, lambda t, c=c: t.category == c) for c in categories()]
    cuts += [("leaking, no step numbers", lambda t: t.leaking and not t.spec.steps),
             ("not leaking, no step numbers", lambda t: not t.leaking and not t.spec.steps),
             ("leaking, poll >= 20 s", lambda t: t.leaking and t.spec.poll_interval_s >= 20),
             ("leaking, OOM < 8 h after onset", lambda t: t.leaking and hours_to_oom(t) < 8),
             ("leaking, OOM >= 8 h after onset", lambda t: t.leaking and hours_to_oom(t) >= 8),
             ("leaking, 16 GiB chips",
              lambda t: t.leaking and t.spec.hbm_total_bytes == 16 * 2**30)]
    rows = []
    for name, keep in cuts:
        present = [s.where(keep) for _, s in columns if s is not None]
        n = len(present[0].outcomes) if present else 0
        rows.append([name, str(n)]
                    + ["n/a" if s is None else category_cell(s.where(keep)) for _, s in columns])
    return table(["category", "series"] + [name for name, _ in columns], rows)


def every_firing_table(every: Sequence[tuple[str, list[tuple[Outcome, bool]]]]) -> list[str]:
    """The baselines again, judged on every firing: what an operator paged by them would see."""
    rows = []
    for name, judged in every:
        s = Scores(tuple(o for o, _ in judged))
        false_clean = sum(paged for o, paged in judged if not o.truth.leaking)
        false_early = sum(paged for o, paged in judged if o.truth.leaking)
        rows.append([f"`{name}`", f"{s.count(HIT)}/{s.positives}", ratio(s.median_lead),
                     percent(s.median_forecast_error), f"{false_clean}/{s.negatives}",
                     f"{false_early}/{s.positives}"])
    return table(["rule", "leaks paged between onset and OOM", "median lead",
                  "median forecast error", "non-leaking series paged",
                  "leaking series paged before the onset"], rows)


def composition(cases: Sequence[Case]) -> list[str]:
    rows = []
    for g in GROUPS:
        mine = [(spec, truths) for spec, truths in cases if spec.group == g.name]
        if not mine:
            continue
        leaking = sum(t.leaking for _, ts in mine for t in ts)
        rows.append([g.name, str(len(mine)), str(leaking),
                     str(sum(s.hosts for s, _ in mine) * CHIPS - leaking),
                     str(sum(not spec.steps for spec, _ in mine))])
    return table(["group", "traces", "leaking series", "non-leaking series",
                  "traces without steps"], rows)


def failure_lines(name: str, scores: Scores) -> list[str]:
    bad = [o for o in scores.outcomes if o.verdict in (MISS, LATE, EARLY, FALSE_ALARM)]
    lines = [f"### {name}: {len(bad)} misses and false alarms", ""]
    return lines + [failure_line(o) for o in bad] + ([] if bad else ["none"])


def failure_line(o: Outcome) -> str:
    t, spec = o.truth, o.truth.spec
    facts = [f"alert {when(o.detection.alert_time)}"]
    if t.leaking:
        facts += [f"onset {when(t.onset_time)} (step {t.onset_step} of the job)",
                  f"OOM {when(t.oom_time)}"]
    return (f"- **{o.verdict}** {t.category}: host `{spec.host}` chip {t.chip}, "
            f"scenario {spec.scenario}, "
            f"seed {spec.seed}; {', '.join(facts)}; poll {spec.poll_interval_s} s, "
            f"drop {100 * spec.drop_probability:.1f}%, steps {'yes' if spec.steps else 'no'}. "
            f"Repro: `{spec.repro()}`")


def when(t: float | None) -> str:
    """A time as hours into the trace: every trace starts at START_TIME."""
    return "none" if t is None else f"+{(t - START_TIME) / HOUR:.2f} h"


#: Hits that still miss a target, worst first: (title, badness, badness above which it misses).
WEAK_HITS: tuple[tuple[str, Callable[[Outcome], float], float], ...] = (
    ("OOM forecasts (error > 25%)", lambda o: o.forecast_error or 0.0, 0.25),
    ("leads (lead < 0.75)", lambda o: -(o.lead or 0.0), -0.75),
)


def weak_hits(scores: Scores, title: str, badness: Callable[[Outcome], float], limit: float,
              n: int = 8) -> list[str]:
    """The hits furthest from a target: where to look first when a median misses it."""
    hits = sorted((o for o in scores.outcomes if o.verdict == HIT), key=badness, reverse=True)
    listed = [f"{failure_line(o)} Forecast {when(o.detection.forecast_oom_time)}, error "
              f"{percent(o.forecast_error or math.nan)}, lead {ratio(o.lead or math.nan)}."
              for o in hits[:n] if badness(o) > limit]
    return [f"### tpumon: worst {n} {title} among hits", ""] + (listed or ["none"])


def throughput_lines(tp: Throughput | None, rule_seconds: dict[str, float],
                     samples: int) -> list[str]:
    lines = ["## Throughput (one process)", ""]
    if tp is not None:
        lines += [f"- tpumon end to end, `analyze_file(csv)` (what `tpumon analyze` runs), "
                  f"CPU time: "
                  f"{tp.rate(tp.end_to_end_s):,.0f} samples/s ({tp.samples:,} samples in "
                  f"{tp.end_to_end_s:.2f} s)",
                  f"- of which reading the CSV (`read_trace_columns`): "
                  f"{tp.rate(tp.read_s):,.0f} samples/s",
                  f"- tpumon detector only (columns in memory): "
                  f"{tp.rate(tp.detector_s):,.0f} samples/s"]
    lines += [f"- baseline `{name}` (numpy, arrays in memory): {samples / s:,.0f} samples/s"
              for name, s in rule_seconds.items() if s > 0]
    return lines


# ================================================================ main


@dataclass
class Run:
    """Everything the report needs."""

    cases: list[Case]
    samples: int
    generate_s: float
    columns: list[tuple[str, Scores | None]]
    every_firing: list[tuple[str, list[tuple[Outcome, bool]]]]  # baselines judged on all firings
    throughput: Throughput | None
    rule_seconds: dict[str, float]
    violations: list[str]


def run_benchmark(seed: int, quick: bool, keep_trace: str | None,
                  analyze: AnalyzeFile | None) -> Run:
    start = time.perf_counter()
    cases = plan_corpus(seed, quick)
    truths = [t for _, ts in cases for t in ts]
    with tempfile.TemporaryDirectory() as tmp:
        path = keep_trace or os.path.join(tmp, "corpus")
        series = write_corpus(cases, path)
        generate_s = time.perf_counter() - start
        tpumon: Scores | None = None
        throughput, violations = None, []
        if analyze is not None:
            detections, throughput, violations = run_tpumon(analyze, path)
            tpumon = Scores(tuple(judge_all(truths, detections)))
    columns: list[tuple[str, Scores | None]] = [("tpumon", tpumon)]
    rule_seconds, every = {}, []
    for rule in (RULE_RAW, RULE_FLOOR):
        firings, rule_seconds[rule.name] = run_rule(rule, series)
        first = {k: f[0] if f else Detection() for k, f in firings.items()}
        columns.append((f"`{rule.name}`", Scores(tuple(judge_all(truths, first)))))
        every.append((rule.name, [judge_firings(t, firings.get(t.key, [])) for t in truths]))
    samples = sum(len(s.times) for s in series.values())
    return Run(cases, samples, generate_s, columns, every, throughput, rule_seconds, violations)


def render(run: Run, all_failures: bool) -> str:
    n_series = sum(len(ts) for _, ts in run.cases)
    leaking = sum(t.leaking for _, ts in run.cases for t in ts)
    lines = ["# Leak detector benchmark", "",
             f"Corpus: {len(run.cases)} traces, {n_series} chip-series ({leaking} leaking, "
             f"{n_series - leaking} not), {run.samples:,} samples; generated and written in "
             f"{run.generate_s:.1f} s. Poll {POLL_INTERVAL_S[0]:g}-{POLL_INTERVAL_S[1]:g} s "
             "(30-60 s in the slow-poll groups), "
             f"drops {100 * DROP_PROBABILITY[1]:g}% at most, jitter up to {POLL_JITTER_S[1]:g} s; "
             f"leaks OOM {OOM_STEPS[0]:,}-{OOM_STEPS[1]:,} steps after their onset "
             "(10,000-20,000 in fast-leak); slice groups are one job on 2-4 hosts of 4 chips; "
             "the groups marked so are written as JSON Lines.", ""]
    if run.columns[0][1] is None:
        lines += ["**tpumon.detect.replay is not there yet: tpumon's column is n/a.**", ""]
    lines += ["## Summary", ""] + summary_table(run.columns, run.throughput) + [""]
    lines += ["## Per category", "", "Leaking rows: detected/series · median lead · "
              "median forecast error; other rows: series with a false alarm.", ""]
    lines += category_table(run.columns) + [""]
    lines += ["## Baselines judged on every firing", "",
              "A Prometheus alert resolves and can fire again, so the first firing (above, the way "
              "tpumon's alert is judged) is not all an operator sees. Here a leak counts as caught "
              "by the first firing between its onset and the OOM.", ""]
    lines += every_firing_table(run.every_firing) + [""]
    lines += throughput_lines(run.throughput, run.rule_seconds, run.samples) + [""]
    lines += ["## Corpus", ""] + composition(run.cases) + [""]
    if run.violations:
        lines += ["## Contract violations", ""] + [f"- {v}" for v in run.violations] + [""]
    lines += ["## Failures", ""]
    for name, scores in run.columns if all_failures else run.columns[:1]:
        if scores is not None:
            lines += failure_lines(name, scores) + [""]
    tpumon = run.columns[0][1]
    for title, badness, limit in WEAK_HITS if tpumon is not None else ():
        lines += weak_hits(tpumon, title, badness, limit) + [""]
    return "\n".join(lines)


def targets_met(run: Run) -> bool:
    scores = run.columns[0][1]
    if scores is None or run.throughput is None:
        return False
    tp = run.throughput
    metrics_ok = all(m.ok(m.value(scores)) for m in SUMMARY if m.ok is not None)
    return metrics_ok and tp.rate(tp.end_to_end_s) >= THROUGHPUT_TARGET and not run.violations


def seed_scores(seed: int, analyze: AnalyzeFile, quick: bool = False) -> Scores:
    """tpumon alone on the corpus drawn from ``seed``: a held-out check, since every
    seed draws other traces (stairs at other times, other polls, chips and rates)."""
    cases = plan_corpus(seed, quick)
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(cases, tmp)
        detections = tpumon_detections(analyze(tmp))
    return Scores(tuple(judge_all([t for _, ts in cases for t in ts], detections)))


def seed_table(seeds: Iterable[int], analyze: AnalyzeFile, quick: bool = False) -> list[str]:
    """F1, false alarms and leads per corpus seed: a change must help on every seed, not
    only on the one its figures were first read on."""
    rows = []
    for seed in seeds:
        s = seed_scores(seed, analyze, quick)
        rows.append([str(seed), ratio(s.f1), str(s.count(FALSE_ALARM, EARLY)),
                     str(s.count(MISS, LATE)), ratio(s.median_lead), ratio(s.p10_lead)])
    return table(["seed", "F1", "false alarms", "missed or late", "median lead",
                  "10th-percentile lead"], rows)


def seed_range(text: str) -> list[int]:
    """``0-5`` or ``0,3,7``."""
    if "-" in text:
        first, last = text.split("-", 1)
        return list(range(int(first), int(last) + 1))
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small corpus (CI smoke test)")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--keep-trace", metavar="DIR",
                        help="write the corpus traces (corpus.csv, corpus.jsonl) here and keep "
                             "them")
    parser.add_argument("--all-failures", action="store_true",
                        help="list the baselines' failures too")
    parser.add_argument("--check", action="store_true", help="exit 1 when tpumon misses a target")
    parser.add_argument("--seeds", type=seed_range, metavar="A-B",
                        help="only tpumon's F1, false alarms and leads on each of these "
                             "corpus seeds (0-5 or 0,3,7)")
    args = parser.parse_args(argv)
    if args.seeds:
        analyze = load_analyze()
        if analyze is None:
            print("bench/detect.py: tpumon.detect.replay is not there", file=sys.stderr)
            return 1
        print("\n".join(["# Leak detector on several corpus seeds", ""]
                        + seed_table(args.seeds, analyze, args.quick)))
        return 0
    run = run_benchmark(args.seed, args.quick, args.keep_trace, load_analyze())
    print(render(run, args.all_failures))
    return 1 if args.check and not targets_met(run) else 0


if __name__ == "__main__":
    sys.exit(main())
