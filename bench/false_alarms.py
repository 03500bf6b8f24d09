"""False alarms on chips that do not leak: a sweep harsher than bench/detect.py's corpus.

bench/detect.py scores the detector on the simulator's scenarios, each drawn with a leak or
one nuisance at a time. Here every chip is healthy and the nuisances are what a leak could
be taken for, drawn at random sizes and times with tests/test_detect.py's generators
(a sawtooth of 1-6 GB over an 18 GB floor, 2 % of polls dropped, 12 h, 15/30/60 s polls):

- ``steps``: one or two step changes of 0.3-2 GB at random hours (a new program, a cache
  that filled at once);
- ``holds``: one or two step changes of 0.8-2 GB and one to five buffers of 0.5-2 GB held
  6-48 minutes (30 s polls, 10 h); ``holds+cache``: the same chips with a cache filling
  2-5 GB (time constant 9-36 minutes) from a random hour;
- ``cache``: a cache filling 1-6 GB (time constant 6-60 minutes) from a random hour.

A cache that fills steadily for a fifth of its fill time looks like a leak until it slows,
so some alarms are expected on the last two; the sweep is for comparing detectors (a change
must not page where the tree before it does not), not a target. Figures and their use:
docs/benchmarks.md, issue 20, "Session 13, second round". Seeded: the same chips each run.

Usage: ``.venv/bin/python bench/false_alarms.py [--per-poll N] [--holds N] [--verbose]``;
prints each family's alarms (an alert raised, or the verdict ``leak``) out of its chips.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_detect import GB, T0, _stairs_and_holds, _synthetic  # type: ignore[import-not-found]  # noqa: E402,E501

from tpumon.detect import ChipDetector, Verdict  # noqa: E402

POLLS = (15.0, 30.0, 60.0)
Series = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def pages(series: Series) -> bool:
    detector = ChipDetector()
    detector.update(*series)
    return detector.alert is not None or detector.assessment.verdict is Verdict.LEAK


def flat_chip(rng: np.random.Generator, poll: float, seed: int) -> Series:
    return _synthetic(12.0, poll, 18 * GB, 0.0, float(rng.uniform(1, 6)) * GB,
                      float(rng.uniform(0, 0.3)), 5e7, 0.02, seed)


def cache_filling(t: np.ndarray, at: float, tau: float, size: float) -> np.ndarray:
    hours = (t - T0) / 3600
    return size * np.where(hours > at, 1 - np.exp(-(hours - at) / tau), 0.0)


def steps(per_poll: int) -> Iterator[tuple[str, Series]]:
    rng = np.random.default_rng(1)
    for poll in POLLS:
        for seed in range(per_poll):
            t, s, u, total = flat_chip(rng, poll, seed)
            hours = (t - T0) / 3600
            for _ in range(int(rng.integers(1, 3))):
                u = u + float(rng.uniform(0.3, 2.0)) * GB * (hours >= float(rng.uniform(1, 10)))
            yield f"steps, {poll:g} s polls", (t, s, u, total)


def holds(count: int) -> Iterator[tuple[str, Series]]:
    rng = np.random.default_rng(0)
    for seed in range(count):
        stairs = [(float(rng.uniform(1, 8)), float(rng.uniform(0.8, 2.0)) * GB)
                  for _ in range(int(rng.integers(1, 3)))]
        held = []
        for _ in range(int(rng.integers(1, 6))):
            start = float(rng.uniform(0.5, 9))
            held.append((start, start + float(rng.uniform(0.1, 0.8)),
                         float(rng.uniform(0.5, 2.0)) * GB))
        t, s, u, total = _stairs_and_holds(stairs, held, 10.0, seed)
        yield "holds, 30 s polls", (t, s, u, total)
        at, tau, size = (float(rng.uniform(2, 7)), float(rng.uniform(0.15, 0.6)),
                         float(rng.uniform(2, 5)) * GB)
        yield "holds+cache, 30 s polls", (t, s, u + cache_filling(t, at, tau, size), total)


def caches(per_poll: int) -> Iterator[tuple[str, Series]]:
    rng = np.random.default_rng(2)
    for poll in POLLS:
        for seed in range(per_poll):
            t, s, u, total = flat_chip(rng, poll, seed)
            at, tau, size = (float(rng.uniform(1, 8)), float(rng.uniform(0.1, 1.0)),
                             float(rng.uniform(1, 6)) * GB)
            yield f"cache, {poll:g} s polls", (t, s, u + cache_filling(t, at, tau, size), total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-poll", type=int, default=200,
                        help="chips per poll interval for steps (caches get half)")
    parser.add_argument("--holds", type=int, default=150, help="chips with held buffers")
    parser.add_argument("--verbose", action="store_true", help="a line per chip that pages")
    args = parser.parse_args()
    counts: dict[str, list[int]] = {}
    for family in (steps(args.per_poll), holds(args.holds), caches(args.per_poll // 2)):
        for name, series in family:
            paged = pages(series)
            seen = counts.setdefault(name, [0, 0])
            seen[0] += int(paged)
            seen[1] += 1
            if paged and args.verbose:
                print(f"  pages: {name} #{seen[1] - 1}", flush=True)
    print("| chips | pages | of |")
    print("|---|---|---|")
    for name, (alarms, total) in counts.items():
        print(f"| {name} | {alarms} | {total} |")


if __name__ == "__main__":
    main()
