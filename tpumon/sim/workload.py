"""A deterministic model of the HBM a TPU VM's chips report during long training runs.

tpumon's detector must tell a leak of ~100 KB per step from GB-sized
in-step transients, start-up ramps, eval and checkpoint bumps, a cache that
fills and saturates, restarts and one-off jumps. Real TPUs are not available
to its tests, so this module reproduces those nuisances with named
scenarios. It feeds the gRPC simulator server (one :meth:`Workload.sample`
per poll), trace generation, benchmarks and the detector's tests.

Model, per job (a job is one run of the training process; a restart starts a
new one):

- warm-up (``warmup_s``): the runtime reserves some HBM, weights load in
  chunks (usage rises in steps), the train executable appears when compiling
  ends. The step reads as the resume step (0 for a fresh run).
- training: the *floor* (memory alive across steps) is weights + executable
  + optimizer state (from step 1) + a cache that fills exponentially towards
  its cap + the eval executable (from the first eval on) + the scenario's
  fault (linear leak, staircase, one-off jump). A leak or staircase starts
  ``leak_onset_step`` steps into each job (0: from the first step), since
  real leaks often begin mid-run (a code path first reached late). A poll
  lands at a random phase of a step; the sample is floor + activations at
  that phase (a triangle up to several GB, zero in the idle part of the
  step) + a few MB of allocator noise. Noise and transients are never
  negative, so every sample is >= the floor: the floor is the lower
  envelope a detector fits.
- every ``eval_every_steps`` steps training pauses for ``eval_s`` seconds of
  eval with its own transient; every ``checkpoint_every_steps`` steps the
  host-transfer buffers of a save add a bump for ``checkpoint_s`` seconds
  while training goes on.
- OOM: when floor + the largest transient at that moment would exceed the
  chip's HBM on any chip, the job dies and the runtime is gone from then on.
  The floor only grows within a job, so the OOM moment is found by bisection
  at construction (:attr:`Workload.oom_time`), not discovered by polling.

Step counting is in steps done in the current job (``n``); the reported step
is ``resume_step + n``. The step rate wobbles slowly by a few percent (two
seeded sinusoids) so bytes/step and bytes/second are not exactly
proportional, as on real hosts.

Scenario fields hold either a value or a ``(low, high)`` range; each
:class:`Workload` draws its own values from the ranges with its seed (both
bounds ints: an int), so one scenario name covers a family of runs. The
realised values are in :attr:`Workload.params`. Memory sizes of the healthy
program are written for a v4 chip and scaled to ``hbm_total_bytes`` (the
model is sized to fit the chip); fault sizes (leak, staircase, step change)
are bytes as given.

Everything is pure computation: no I/O, no clocks. Given the seed, the
floor is a function of time alone; the transients and noise come from a
seeded stream, so a sample sequence is reproducible for a given sequence of
sample times.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tpumon.sim.scenarios import SCENARIOS, V4_HBM_TOTAL_BYTES, Params, Scenario, draw, realize

__all__ = [
    "V4_HBM_TOTAL_BYTES",
    "Scenario",
    "Params",
    "SCENARIOS",
    "WorkloadSample",
    "Job",
    "Workload",
]

_NEVER = 1 << 60  # "every 0 steps" means never: a period no run reaches
_SEARCH_STEPS = 10**13  # OOM search horizon, steps (centuries at any step time)


@dataclass(frozen=True, slots=True)
class WorkloadSample:
    """What the runtime would report at one poll."""

    time: float
    runtime_up: bool  # False between jobs / after OOM: the runtime serves nothing
    step: int | None  # None when runtime is down
    hbm_used_bytes: tuple[int, ...]  # per chip (empty when runtime down)
    hbm_total_bytes: int
    duty_cycle_pct: tuple[float, ...]  # per chip (empty when runtime down)
    stalled: bool = False  # the job is in its stall (scenario "stall")
    dcn_slowdown: float = 1.0  # factor on this host's DCN latencies now


@dataclass(frozen=True, slots=True)
class Job:
    """One run of the training process: ground truth for tests."""

    start_time: float
    end_time: float  # math.inf if it never ends
    end_reason: str | None  # "oom", "crash" (restarted), "exit" (finished), "host_oom" or None
    resume_step: int
    load_times: tuple[float, ...]  # seconds after start at which weight chunks finished loading
    load_fractions: tuple[float, ...]  # cumulative fraction of the weights loaded by then
    executable_time: float  # seconds after start at which the train executable appears


@dataclass(frozen=True, slots=True)
class _Chip:
    """Per-chip sizes, realised once so that sampling is only arithmetic."""

    reserved: float
    weights: float
    executable: float
    optimizer: float
    cache: float
    eval_executable: float
    leak: float
    stair: float
    jump: float
    train_peak: float
    eval_peak: float
    checkpoint: float
    noise: float
    duty: float
    static: float  # reserved + weights + executable: all there once training runs


_WARMUP, _TRAIN, _EVAL = 0, 1, 2


class Workload:
    """One TPU VM's chips running a simulated training job (and its restarts)."""

    def __init__(
        self,
        scenario: Scenario | str,
        *,
        chips: int = 4,
        hbm_total_bytes: int = V4_HBM_TOTAL_BYTES,
        seed: int = 0,
        start_time: float = 0.0,
        **overrides: Any,  # Scenario fields, of their types
    ) -> None:
        if isinstance(scenario, str):
            if scenario not in SCENARIOS:
                raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
            scenario = SCENARIOS[scenario]
        if chips < 1 or hbm_total_bytes <= 0:
            raise ValueError("chips and hbm_total_bytes must be positive")
        self._scenario = replace(scenario, **overrides) if overrides else scenario
        self._total = int(hbm_total_bytes)
        init_rng = random.Random(f"tpumon-sim:{seed}:params")
        self._rng = random.Random(f"tpumon-sim:{seed}:samples")
        p = self._params = realize(self._scenario, init_rng, hbm_total_bytes / V4_HBM_TOTAL_BYTES)
        self._chips = _make_chips(p, chips, init_rng)
        self._eval_every = _every(p.eval_every_steps)
        self._ckpt_every = _every(p.checkpoint_every_steps)
        self._stair_every = _every(p.stair_every_steps)
        self._stair_steps = _poisson_steps(p.stair_every_steps, seed) if p.stair_irregular \
            else None
        self._leak_change = _every(p.leak_change_step)
        self._leak_onset = int(p.leak_onset_step)
        self._ckpt_steps = max(1, round(p.checkpoint_s / p.step_time_s))
        self._cycle_s = self._eval_every * p.step_time_s + p.eval_s
        self._cache_tau_steps = max(p.cache_tau_s / p.step_time_s, 1e-9)
        self._wobble_terms = _wobble_terms(p.step_rate_wobble, init_rng)
        self._jobs = self._plan_jobs(start_time, init_rng)
        self._starts = [j.start_time for j in self._jobs]

    # ------------------------------------------------------------ public

    @property
    def scenario(self) -> Scenario:
        """The scenario with overrides applied (ranges as given)."""
        return self._scenario

    @property
    def params(self) -> Params:
        """The scenario as realised for this seed: every range drawn, sizes scaled to the chip."""
        return self._params

    @property
    def chips(self) -> int:
        return len(self._chips)

    @property
    def hbm_total_bytes(self) -> int:
        return self._total

    @property
    def jobs(self) -> tuple[Job, ...]:
        return self._jobs

    @property
    def oom_time(self) -> float | None:
        """When the job runs out of HBM (the runtime is gone from then on), or None."""
        last = self._jobs[-1]
        return last.end_time if last.end_reason == "oom" else None

    @property
    def irregular_stair_steps(self) -> tuple[int, ...]:
        """Steps after the leak's onset at which irregular stairs come; () if regular."""
        return tuple(self._stair_steps or ())

    @property
    def leak_bytes_per_step_by_chip(self) -> tuple[float, ...]:
        """Ground truth linear leak rate of each chip (0 where it does not leak)."""
        return tuple(c.leak for c in self._chips)

    def sample(self, t: float) -> WorkloadSample:
        """What the runtime reports at sim time ``t``.

        Draws the step phase and noise from the seeded stream, so the result
        depends on the seed and on the sequence of earlier calls.
        """
        job = self._job_at(t)
        if job is None:
            return WorkloadSample(t, False, None, (), self._total, ())
        stalled, t_job = self._stall(job, t)
        kind, n = self._locate(job, t_job)
        floors = self._floors(job, kind, n)
        rand = self._rng.random
        if kind == _WARMUP:
            extras = [0.0] * len(floors)
            duty = [5.0 * rand() for _ in floors]
        elif kind == _TRAIN:
            shape = _triangle(rand(), self._params.idle_fraction)
            saving = n >= self._ckpt_every and n % self._ckpt_every < self._ckpt_steps
            slow = 0.8 if saving else 1.0
            extras = [c.train_peak * shape + (c.checkpoint if saving else 0.0) for c in self._chips]
            duty = [c.duty * slow + 2.0 * rand() - 1.0 for c in self._chips]
        else:
            shape = _triangle(rand(), 0.0)
            eval_duty = self._params.duty_eval_pct
            extras = [c.eval_peak * shape for c in self._chips]
            duty = [eval_duty + 6.0 * rand() - 3.0 for _ in self._chips]
        total = self._total
        used = tuple(
            min(total, int(f + e + c.noise * rand()))
            for f, e, c in zip(floors, extras, self._chips, strict=True)
        )
        step = job.resume_step + (0 if kind == _WARMUP else int(n))
        if stalled:
            duty = [1.5 * rand() for _ in duty]
        p = self._params
        slow = p.dcn_slowdown if 0 < p.dcn_slow_after_s <= t - job.start_time else 1.0
        return WorkloadSample(t, True, step, used, total,
                              tuple(min(100.0, max(0.0, d)) for d in duty), stalled, slow)

    def _stall(self, job: Job, t: float) -> tuple[bool, float]:
        """Whether the job is in its stall at ``t``, and the time its steps and memory are
        read at: held at the stall's start during it, ``stall_s`` behind after it (the
        scenario has no leak, so the OOM search need not know)."""
        p = self._params
        if p.stall_after_s <= 0:
            return False, t
        begin = job.start_time + p.warmup_s + p.stall_after_s
        if t < begin:
            return False, t
        return (True, begin) if t < begin + p.stall_s else (False, t - p.stall_s)

    def floor_bytes(self, t: float) -> tuple[int, ...]:
        """Ground truth floor per chip at ``t`` (no transients, no noise); empty when down."""
        job = self._job_at(t)
        if job is None:
            return ()
        kind, n = self._locate(job, self._stall(job, t)[1])
        return tuple(int(f) for f in self._floors(job, kind, n))

    # ------------------------------------------------------------ time -> state

    def _job_at(self, t: float) -> Job | None:
        i = bisect.bisect_right(self._starts, t) - 1
        if i < 0 or t >= self._jobs[i].end_time:
            return None
        return self._jobs[i]

    def _locate(self, job: Job, t: float) -> tuple[int, float | int]:
        """(phase kind, value): seconds since start in warm-up, else steps done in the job."""
        since = t - job.start_time
        p = self._params
        if since < p.warmup_s:
            return _WARMUP, since
        tau = since - p.warmup_s
        x = tau + self._wobble(tau)  # seconds of "nominal pace" training clock
        k = int(x // self._cycle_s)
        r = x - k * self._cycle_s
        if r < self._eval_every * p.step_time_s:
            return _TRAIN, k * self._eval_every + min(int(r / p.step_time_s), self._eval_every - 1)
        return _EVAL, (k + 1) * self._eval_every

    def _wobble(self, tau: float) -> float:
        return sum(a * (math.sin(w * tau + ph) - math.sin(ph)) for a, w, ph in self._wobble_terms)

    def _time_at_clock(self, job: Job, x: float) -> float:
        """Inverse of the wobbled clock; a contraction since the wobble's slope is << 1."""
        tau = x
        for _ in range(60):
            nxt = x - self._wobble(tau)
            if abs(nxt - tau) < 1e-9:
                break
            tau = nxt
        return job.start_time + self._params.warmup_s + tau

    # ------------------------------------------------------------ floors

    def _floors(self, job: Job, kind: int, value: float) -> list[float]:
        if kind == _WARMUP:
            i = bisect.bisect_right(job.load_times, value)
            loaded = job.load_fractions[i - 1] if i else 0.0
            compiled = value >= job.executable_time
            return [c.reserved + c.weights * loaded + c.executable * compiled for c in self._chips]
        return self._train_floors(int(value))

    def _train_floors(self, n: int) -> list[float]:
        cache = -math.expm1(-n / self._cache_tau_steps)
        optimizer = n >= 1
        evaluated = n >= self._eval_every
        steps = max(0, n - self._leak_onset)  # steps leaked so far: a leak can start mid-run
        stairs = steps // self._stair_every if self._stair_steps is None else \
            bisect.bisect_right(self._stair_steps, steps)
        # a rate that changes part-way: steps after the change leak at factor x the rate
        leaked = steps + (self._params.leak_change_factor - 1.0) * max(0, steps - self._leak_change)
        jumped = n >= self._params.step_change_at_step
        return [
            c.static + c.optimizer * optimizer + c.cache * cache + c.eval_executable * evaluated
            + c.leak * leaked + c.stair * stairs + c.jump * jumped
            for c in self._chips
        ]

    # ------------------------------------------------------------ jobs and OOM

    def _plan_jobs(self, start_time: float, rng: random.Random) -> tuple[Job, ...]:
        """Lay out the jobs: each restart resumes from the last checkpoint; an OOM ends it all."""
        p, sc = self._params, self._scenario
        jobs: list[Job] = []
        begin, resume = start_time, 0
        for i in range(int(p.restarts) + 1):
            job = self._new_job(begin, resume, rng)
            oom = self._oom_time(job)
            life = p.restart_after_s if i == 0 else draw(sc.restart_after_s, rng)
            planned_end = begin + max(life, p.warmup_s + 60.0) if i < p.restarts else math.inf
            if oom is not None and oom < planned_end:
                jobs.append(replace(job, end_time=oom, end_reason="oom"))
                break
            if planned_end == math.inf:
                finish = begin + p.finish_after_s if p.finish_after_s > 0 else math.inf
                finished = finish < math.inf and (oom is None or finish < oom)
                jobs.append(replace(job, end_time=finish, end_reason=p.finish_reason)
                            if finished else job)
                break
            jobs.append(replace(job, end_time=planned_end, end_reason="crash"))
            kind, n = self._locate(job, planned_end)
            done = 0 if kind == _WARMUP else int(n)
            resume += done // self._ckpt_every * self._ckpt_every
            downtime = p.restart_downtime_s if i == 0 else draw(sc.restart_downtime_s, rng)
            begin = planned_end + downtime
        return tuple(jobs)

    def _new_job(self, begin: float, resume: int, rng: random.Random) -> Job:
        p = self._params
        chunks = max(1, int(p.weight_chunks))
        times = sorted(rng.uniform(0.05, 0.8) * p.warmup_s for _ in range(chunks))
        sizes = [rng.uniform(0.5, 1.5) for _ in range(chunks)]
        cumulative, acc = [], 0.0
        for s in sizes:
            acc += s
            cumulative.append(acc / sum(sizes))
        cumulative[-1] = 1.0
        return Job(begin, math.inf, None, resume, tuple(times), tuple(cumulative),
                   rng.uniform(0.85, 0.97) * p.warmup_s)

    def _oom_time(self, job: Job) -> float | None:
        """First moment floor + transient exceeds HBM on some chip, or None.

        Three ways to hit it, each monotone in steps because the floor only
        grows within a job: a training step's peak, a checkpoint's bump on
        top of it, and an eval's peak.
        """
        chips, total = self._chips, self._total
        E, ce, w = self._eval_every, self._ckpt_every, self._ckpt_steps
        st, cycle = self._params.step_time_s, self._cycle_s

        def over(n: int, extra: Callable[[_Chip], float]) -> bool:
            floors = self._train_floors(n)
            return any(f + extra(c) > total for f, c in zip(floors, chips, strict=True))

        def train_clock(n: int) -> float:
            return (n // E) * cycle + (n % E) * st

        candidates: list[float] = []
        n = _first_true(lambda n: over(n, lambda c: c.train_peak), 0, _SEARCH_STEPS)
        if n is not None:
            candidates.append(train_clock(n))
        saving = lambda c: c.train_peak + c.checkpoint  # noqa: E731
        m = _first_true(lambda m: over(m * ce + w - 1, saving), 1, _SEARCH_STEPS // ce)
        if m is not None:
            n = _first_true(lambda n: over(n, saving), m * ce, m * ce + w - 1)
            candidates.append(train_clock(n))  # type: ignore[arg-type]
        k = _first_true(lambda k: over(k * E, lambda c: c.eval_peak), 1, _SEARCH_STEPS // E)
        if k is not None:
            candidates.append((k - 1) * cycle + E * st)
        if not candidates:
            return None
        return self._time_at_clock(job, min(candidates))


# ---------------------------------------------------------------- helpers


def _make_chips(p: Params, chips: int, rng: random.Random) -> tuple[_Chip, ...]:
    leaking = range(chips) if p.leak_chips is None else p.leak_chips
    result = []
    for i in range(chips):
        shard = 1.0 + rng.uniform(-p.chip_imbalance, p.chip_imbalance)
        leak = max(0.0, 1.0 + rng.uniform(-1.0, 1.0) * p.leak_chip_spread) if i in leaking else 0.0
        weights = p.weights_bytes * shard
        reserved = p.runtime_reserved_bytes + (p.chip0_extra_bytes if i == 0 else 0)
        result.append(_Chip(
            reserved=reserved,
            weights=weights,
            executable=p.executable_bytes,
            optimizer=weights * p.optimizer_ratio,
            cache=p.cache_cap_bytes * shard,
            eval_executable=p.eval_executable_bytes,
            leak=p.leak_bytes_per_step * leak,
            stair=p.stair_bytes * leak,
            jump=p.step_change_bytes * shard,
            train_peak=p.train_transient_bytes * shard,
            eval_peak=p.eval_transient_bytes * shard,
            checkpoint=p.checkpoint_bytes * shard,
            noise=p.noise_bytes,
            duty=min(99.0, p.duty_train_pct + rng.uniform(-1.0, 1.0)),
            static=reserved + weights + p.executable_bytes,
        ))
    return tuple(result)


def _wobble_terms(amplitude: float, rng: random.Random) -> tuple[tuple[float, float, float], ...]:
    """Two slow sinusoids (minutes and hours) whose slopes add to at most ``amplitude``."""
    terms = []
    for share, (lo, hi) in ((0.6, (600.0, 1800.0)), (0.4, (3600.0, 10800.0))):
        omega = 2 * math.pi / rng.uniform(lo, hi)
        terms.append((amplitude * share / omega, omega, rng.uniform(0, 2 * math.pi)))
    return tuple(terms)


def _poisson_steps(every: float, seed: int, count: int = 4096) -> list[int]:
    """Steps (after the onset) of ``count`` stairs at random, on average ``every`` apart."""
    rng = random.Random(f"tpumon-sim:{seed}:stairs")
    steps, n = [], 0.0
    for _ in range(count):
        n += rng.expovariate(1.0 / max(every, 1.0))
        steps.append(max(int(n), 1))
    return steps


def _every(steps: float) -> int:
    return int(steps) if steps > 0 else _NEVER


def _triangle(phase: float, idle: float) -> float:
    """Activations alive at ``phase`` of a step, 0..1: idle, forward builds up, backward frees."""
    if phase < idle:
        return 0.0
    v = (phase - idle) / (1.0 - idle)
    return v / 0.55 if v < 0.55 else (1.0 - v) / 0.45


def _first_true(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """Smallest i in [lo, hi] with pred(i), for pred monotone (False..True); None if none."""
    if hi < lo or not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
