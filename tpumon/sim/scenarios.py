"""The simulated training runs by name: a :class:`Scenario` is a family of runs (each field a
value or a ``(low, high)`` range), :data:`SCENARIOS` the named ones that ``tpumon sim``,
the demo and the tests use, and :func:`realize` one run's :class:`Params`, every range
drawn with the workload's seed. The model that turns them into HBM samples is
:mod:`tpumon.sim.workload`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Union

V4_HBM_TOTAL_BYTES = 34088157184

MB = 10**6
GB = 10**9
MiB = 2**20

#: A scenario parameter: a value, or a (low, high) range drawn per seed.
Range = Union[float, "tuple[float, float]"]

# Fields that describe the healthy program's footprint: scaled with the chip's HBM.
_FOOTPRINT_FIELDS = (
    "runtime_reserved_bytes", "chip0_extra_bytes", "weights_bytes", "executable_bytes",
    "train_transient_bytes", "eval_transient_bytes", "eval_executable_bytes",
    "checkpoint_bytes", "cache_cap_bytes", "noise_bytes",
)
_NOT_DRAWN = ("name", "description", "leak_chips", "stair_irregular", "finish_reason")


@dataclass(frozen=True)
class Scenario:
    """Parameters of a simulated training run; see the module doc for the model.

    Byte sizes are for a v4 chip (34 GB HBM). A field set to ``(low, high)``
    is drawn per seed; "every" fields set to 0 disable that event.
    """

    name: str
    description: str
    # pace
    step_time_s: Range = (0.5, 0.75)
    step_rate_wobble: Range = (0.01, 0.03)  # peak relative deviation of the step rate
    warmup_s: Range = (60.0, 180.0)
    # footprint of the healthy program
    runtime_reserved_bytes: Range = (250 * MB, 600 * MB)
    chip0_extra_bytes: Range = (20 * MB, 120 * MB)  # chip 0 hosts infeed/outfeed buffers
    chip_imbalance: Range = 0.02  # per-chip relative spread of shard sizes
    weights_bytes: Range = (8 * GB, 12 * GB)
    weight_chunks: Range = (6, 12)
    executable_bytes: Range = (100 * MB, 400 * MB)
    optimizer_ratio: Range = (0.5, 0.8)  # optimizer state / weights
    train_transient_bytes: Range = (3 * GB, 6 * GB)  # activations at the step's peak
    idle_fraction: Range = (0.03, 0.12)  # part of a step with no activations alive
    eval_every_steps: Range = (500, 1500)
    eval_s: Range = (20.0, 60.0)
    eval_transient_bytes: Range = (1 * GB, 4 * GB)
    eval_executable_bytes: Range = (30 * MB, 300 * MB)  # compiled at the first eval, kept
    checkpoint_every_steps: Range = (1000, 3000)
    checkpoint_s: Range = (3.0, 10.0)
    checkpoint_bytes: Range = (200 * MB, 600 * MB)
    cache_cap_bytes: Range = (300 * MB, 700 * MB)
    cache_tau_s: Range = (900.0, 1500.0)  # time constant of the cache filling up
    noise_bytes: Range = (2 * MB, 8 * MB)
    duty_train_pct: Range = (85.0, 97.0)
    duty_eval_pct: Range = (40.0, 75.0)
    # faults
    leak_bytes_per_step: Range = 0
    leak_chips: tuple[int, ...] | None = None  # None: every chip leaks
    leak_chip_spread: Range = 0.03  # per-chip relative spread of the leak rate
    leak_onset_step: Range = 0  # steps into each job before the leak and the stairs start
    stair_bytes: Range = 0
    stair_every_steps: Range = 500
    step_change_bytes: Range = 0
    step_change_at_step: Range = (3000, 9000)  # steps into the job
    restarts: int = 0
    restart_after_s: Range = (7200.0, 14400.0)  # life of a job that gets restarted
    restart_downtime_s: Range = (120.0, 420.0)
    # more faults (last, so that the draws of the fields above stay as they were)
    stair_irregular: bool = False  # stairs at random steps (a Poisson process), not every N
    leak_change_step: Range = 0  # steps after the onset at which the leak's rate changes
    leak_change_factor: Range = 1.0  # the rate after the change, as a multiple of before
    # runtime metrics (scalar defaults draw nothing, so older scenarios' seeds are unchanged)
    stall_after_s: Range = 0.0  # training seconds into each job before a stall; 0: none
    stall_s: Range = 300.0  # the stall: duty cycle near 0, the step held, HBM held
    dcn_slow_after_s: Range = 0.0  # seconds into each job before DCN slows; 0: never
    dcn_slowdown: Range = 4.0  # factor on this host's DCN latencies from then on
    finish_after_s: Range = 0.0  # the (last) job ends this long after it starts; 0: never
    finish_reason: str = "exit"  # how: "exit" (cleanly) or "host_oom" (the kernel kills it)


@dataclass(frozen=True)
class Params:
    """A :class:`Scenario` as one :class:`Workload` realised it: every range drawn (an int
    where both bounds were ints), the program's footprint scaled to the chip's HBM."""

    name: str
    description: str
    leak_chips: tuple[int, ...] | None
    restarts: float  # an int unless a range with a float bound was given
    step_time_s: float
    step_rate_wobble: float
    warmup_s: float
    runtime_reserved_bytes: float
    chip0_extra_bytes: float
    chip_imbalance: float
    weights_bytes: float
    weight_chunks: float
    executable_bytes: float
    optimizer_ratio: float
    train_transient_bytes: float
    idle_fraction: float
    eval_every_steps: float
    eval_s: float
    eval_transient_bytes: float
    eval_executable_bytes: float
    checkpoint_every_steps: float
    checkpoint_s: float
    checkpoint_bytes: float
    cache_cap_bytes: float
    cache_tau_s: float
    noise_bytes: float
    duty_train_pct: float
    duty_eval_pct: float
    leak_bytes_per_step: float
    leak_chip_spread: float
    leak_onset_step: float
    stair_bytes: float
    stair_every_steps: float
    step_change_bytes: float
    step_change_at_step: float
    restart_after_s: float
    restart_downtime_s: float
    stair_irregular: bool
    leak_change_step: float
    leak_change_factor: float
    stall_after_s: float
    stall_s: float
    dcn_slow_after_s: float
    dcn_slowdown: float
    finish_after_s: float
    finish_reason: str


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy",
                 "No leak: warm-up, sawtooth, eval, checkpoints, a cache that saturates."),
        Scenario("linear-leak", "Every chip's floor grows by 98-195 KiB per step (about 117 "
                 "with the default seed) until the job OOMs.",
                 leak_bytes_per_step=(100_000, 200_000)),
        Scenario("fast-leak", "Like linear-leak at 440-540 KiB per step (about 455 with the "
                 "default seed): called within two hours of simulated time, OOM after "
                 "about six (make demo's default).",
                 leak_bytes_per_step=(450_000, 550_000)),
        Scenario("staircase-leak", "The floor jumps by a fixed amount every few hundred steps.",
                 stair_bytes=(48 * MiB, 80 * MiB), stair_every_steps=(400, 600)),
        Scenario("chip0-leak", "Only chip 0 leaks (SPMD imbalance); the other chips are healthy.",
                 leak_bytes_per_step=(100_000, 200_000), leak_chips=(0,)),
        Scenario("irregular-staircase", "The floor jumps by 190-380 MiB at random times "
                 "(recompilations, a cache that never stops growing), flat between.",
                 stair_bytes=(200 * MB, 400 * MB), stair_every_steps=(6000, 12000),
                 stair_irregular=True),
        Scenario("leak-rate-change", "A linear leak whose rate changes part-way (x1.5-3).",
                 leak_bytes_per_step=(100_000, 200_000), leak_change_step=(5000, 20000),
                 leak_change_factor=(1.5, 3.0)),
        Scenario("step-change",
                 "One permanent jump of ~1.4 GiB, flat before and after: not a leak.",
                 step_change_bytes=(1.2 * GB, 1.8 * GB)),
        Scenario("job-exit",
                 "Healthy job runs three hours and exits cleanly; nothing runs after it.",
                 finish_after_s=3 * 3600.0),
        Scenario("host-oom",
                 "Healthy HBM; after two hours the job's host memory runs out and the "
                 "kernel's OOM killer ends it (a line in the simulated kernel log).",
                 finish_after_s=2 * 3600.0, finish_reason="host_oom"),
        Scenario("job-restart",
                 "Healthy job dies, runtime gone for minutes, restarts from a checkpoint.",
                 restarts=1),
        Scenario("saturating-cache",
                 "Healthy run whose cache grows ~1.9 GiB over hours, then saturates.",
                 cache_cap_bytes=(1.5 * GB, 2.5 * GB), cache_tau_s=(5400.0, 10800.0)),
        Scenario("stall", "Healthy job that stalls for minutes (a starved input pipeline, a hung "
                 "collective): duty cycle near 0, the step held, HBM held.",
                 stall_after_s=(1200.0, 2400.0), stall_s=(300.0, 600.0)),
        Scenario("slow-dcn", "Healthy job whose DCN transfers on this host get 3-5x slower "
                 "(a bad NIC, a congested link) while the rest of the slice stays fast.",
                 dcn_slow_after_s=(1200.0, 2400.0), dcn_slowdown=(3.0, 5.0)),
    )
}


def draw(value: Range, rng: random.Random) -> float:
    """A value as is, or a draw from a (low, high) range; int bounds give an int."""
    if not isinstance(value, tuple):
        return value
    low, high = value
    if isinstance(low, int) and isinstance(high, int):
        return rng.randint(low, high)
    return rng.uniform(low, high)


def realize(scenario: Scenario, rng: random.Random, scale: float) -> Params:
    drawn = {f.name: draw(getattr(scenario, f.name), rng)
             for f in fields(scenario) if f.name not in _NOT_DRAWN}
    for name in _FOOTPRINT_FIELDS:
        drawn[name] = int(drawn[name] * scale)
    p = Params(name=scenario.name, description=scenario.description,
               leak_chips=scenario.leak_chips, stair_irregular=scenario.stair_irregular,
               finish_reason=scenario.finish_reason, **drawn)
    _validate(p)
    return p


def _validate(p: Params) -> None:
    if p.step_time_s <= 0 or p.warmup_s < 0 or p.eval_s < 0 or p.checkpoint_s < 0:
        raise ValueError("step_time_s must be positive and durations non-negative")
    for name in ("leak_bytes_per_step", "stair_bytes", "step_change_bytes", "restarts",
                 "leak_onset_step", "eval_every_steps", "checkpoint_every_steps",
                 "stair_every_steps"):
        if getattr(p, name) < 0:
            raise ValueError(f"{name} must not be negative (the floor only grows within a job)")
    if not 0 <= p.idle_fraction < 1 or not 0 <= p.step_rate_wobble < 0.5:
        raise ValueError("idle_fraction must be in [0, 1) and step_rate_wobble in [0, 0.5)")
