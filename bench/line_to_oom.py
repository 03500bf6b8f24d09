"""Which healthy jobs pass through a leak's line, and how far their truth is from it (issue 40).

A diagnostic of the detector's false pages on ``bench/nuisances.py``'s healthy jobs, from
their noise-free truth, not from the detector.

For every healthy job, at every moment ``t`` (a 5-minute grid) of every training segment
(after its warm-up), and every evidence window ``W`` (30 minutes on, by 1.25x, back to the
warm-up's end), each chip's true floor over ``[t - W, t]`` is fitted with a straight line.
That line is a linear leak with its onset at ``t - W`` on top of the job's own history: a
member of the leak families (any healthy history, then a linear leak that OOMs 2-20 h after
its onset). A detector whose lead on such leaks is 0.75 must page it by ``t`` when it would
OOM (floor + the transient peak at capacity) within ``3 W``: a *must-page moment*. The
healthy truth and that leak differ over the window by the line's residuals (RMS ``r``);
with the job's gaussian poll noise (sd ``sigma``) alone, the most powerful test between the
two, knowing both exactly and using every poll (n = W / poll), separates them by
``d' = r * sqrt(n) / sigma``: the curvature the truth has and the line lacks. (Generous to
a detector: a poll reads the floor only in the idle share of its step, the in-step
transient hides it in the rest, and the detector's floors are bucket minima.)

With ``--pages FILE`` (``bench/nuisances.py --json FILE`` of the same seed and scale), each
family's jobs are cross-tabulated: with or without a must-page moment, paged or not.

Usage: ``.venv/bin/python bench/line_to_oom.py [--seed N] [--scale F] [--pages FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nuisances as nz  # noqa: E402  (the sibling bench module: its jobs, exactly)

HOUR = 3600.0
GRID_S = 60.0
END_EVERY_S = 300.0
MIN_WINDOW_S = 1800.0
WINDOW_FACTOR = 1.25
LEAD = 0.75  # the median lead: page by tto = EXTRAPOLATION * W
EXTRAPOLATION = LEAD / (1 - LEAD)


def _prefix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Prefix sums of 1, x, y, xx, xy, yy (rows), with a leading zero column."""
    rows = np.vstack([np.ones_like(x), x, y, x * x, x * y, y * y])
    return np.hstack([np.zeros((6, 1)), np.cumsum(rows, axis=1)])


def segment_moments(x: np.ndarray, y: np.ndarray, windows: np.ndarray,
                    ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each (end index, window length in points): the least-squares line through
    ``y[end - w + 1 : end + 1]`` (x in hours): its slope per hour, its value at the end
    and the RMS of its residuals; NaN where the window reaches before the start."""
    p = _prefix(x, y)
    e = ends[:, None] + 1
    s = e - windows[None, :]
    ok = s >= 0
    s = np.where(ok, s, 0)
    n, sx, sy, sxx, sxy, syy = (p[k][e] - p[k][s] for k in range(6))
    with np.errstate(invalid="ignore", divide="ignore"):
        vx = sxx - sx * sx / n
        b = (sxy - sx * sy / n) / vx
        a = (sy - b * sx) / n
        sse = np.maximum(syy - sy * sy / n - b * (sxy - sx * sy / n), 0.0)
        rms = np.sqrt(sse / n)
        at_end = a + b * x[ends][:, None]
    nan = ~ok | (windows[None, :] < 3)
    return (np.where(nan, np.nan, b), np.where(nan, np.nan, at_end),
            np.where(nan, np.nan, rms))


def least_separation(m: nz.Model) -> float:
    """The least d' between any chip's truth and a linear leak that must be paged at that
    moment (see the module docstring); inf when the job has no must-page moment. From the
    job's model alone (``nuisances.make_model``): no polls are sampled."""
    worst = math.inf
    offsets = (m.offsets - m.offsets[0]) / nz.GB
    for seg in m.segments:
        start, stop = seg.warm_end, min(seg.stop, m.end)
        if stop - start < MIN_WINDOW_S:
            continue
        t = np.arange(start, stop, GRID_S)
        x = (t - start) / HOUR
        y = m.level(m.parts(t), 0) / nz.GB
        ends = np.arange(int(MIN_WINDOW_S / GRID_S), len(t), int(END_EVERY_S / GRID_S))
        count = int(math.log(len(t) * GRID_S / MIN_WINDOW_S) / math.log(WINDOW_FACTOR)) + 1
        windows = np.unique((MIN_WINDOW_S / GRID_S * WINDOW_FACTOR ** np.arange(count))
                            .astype(int))
        slope, level, rms = segment_moments(x, y, windows, ends)
        hours = windows[None, :] * GRID_S / HOUR
        d = rms * nz.GB * np.sqrt(windows[None, :] * GRID_S / m.poll) / m.noise
        for off in offsets:  # the chips differ by a constant offset only
            with np.errstate(invalid="ignore", divide="ignore"):
                tto = ((m.capacity - m.peak) / nz.GB - level - off) / slope
                must = (slope > 0) & (tto > 0) & (tto <= EXTRAPOLATION * hours) & \
                    (hours + tto >= nz.OOM_HOURS[0]) & (hours + tto <= nz.OOM_HOURS[1])
            if must.any():
                worst = min(worst, float(np.min(d[must])))
    return worst


def _paged_jobs(path: str | None) -> dict[tuple[str, int], bool] | None:
    if path is None:
        return None
    with open(path) as f:
        jobs = json.load(f)["jobs"]
    return {(j["family"], j["seed"]): any(c["paged"] for c in j["chips"]) for j in jobs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="as bench/nuisances.py's")
    parser.add_argument("--scale", type=float, default=1.0, help="as bench/nuisances.py's")
    parser.add_argument("--pages", metavar="FILE", help="bench/nuisances.py --json output "
                        "of the same seed and scale: cross-tabulate its paged jobs")
    parser.add_argument("--families", default=",".join(nz.HEALTHY),
                        help=f"comma-separated, of: {', '.join(nz.HEALTHY)}")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    if not set(families) <= set(nz.HEALTHY):
        parser.error(f"--families: not a healthy family: {args.families}")
    started = time.perf_counter()
    paged = _paged_jobs(args.pages)
    lines = ["| healthy family | jobs | with a must-page moment | their least d' (min, "
             "median) | paged: with / without such a moment |", "|---|---|---|---|---|"]
    for family in families:
        seps, cross = [], [[0, 0], [0, 0]]
        for fam, seed in nz.tasks([family], args.seed, args.scale):
            sep = least_separation(nz.make_model(fam, seed))
            seps.append(sep)
            if paged is not None:
                if (fam, seed) not in paged:
                    sys.exit(f"line_to_oom: {args.pages} has no job {fam} {seed}: "
                             "another seed or scale?")
                cross[math.isfinite(sep)][paged[(fam, seed)]] += 1
        must = [x for x in seps if math.isfinite(x)]
        spread = f"{min(must):.0f}, {statistics.median(must):.0f}" if must else "-"
        pages = "-" if paged is None else \
            f"{cross[1][1]} of {len(must)} / {cross[0][1]} of {len(seps) - len(must)}"
        lines.append(f"| {family} | {len(seps)} | {len(must)} | {spread} | {pages} |")
    print("\n".join(lines))
    print(f"\nseed {args.seed}, scale {args.scale}: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
