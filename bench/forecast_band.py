"""The OOM forecast's band: calibrate it on the detector's own errors, judge it on others.

At every page of a leak whose OOM is known, the ratio of the real time left to the
forecast one is kept, with the forecast's extrapolation (forecast time to OOM over the
evidence window). Split-conformal: the calibration pages give, per extrapolation bin, the
ratios' central ``--coverage`` (the ends at the finite-sample conformal ranks); the judge
pages, which the calibration never saw, say how often that band held the OOM and how
wide it was. The two families are apart on purpose: the simulator's leaks
(``bench/detect.py``) and leaks mixed with a healthy job's nuisances
(``bench/nuisances.py``), each at other seeds for calibration and judgement.

Calibration: detect.py seeds 0-3 and nuisances.py seed 0 (leak families); judge: seeds
4-7 and seed 1. Prints the table for ``tpumon/detect/forecast_band.py`` and, for the table
now in that module, its coverage and width on the judge pages (docs/benchmarks.md, "The
forecast's band"). About 7 minutes on the 2-core VM.

Usage: ``.venv/bin/python bench/forecast_band.py [--quick]``
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from typing import NamedTuple, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import detect  # type: ignore[import-not-found]  # noqa: E402
import nuisances  # type: ignore[import-not-found]  # noqa: E402

from tpumon.detect import forecast_band  # noqa: E402
from tpumon.detect.replay import analyze_path  # noqa: E402

EDGES = (1.0, 2.0, 3.0, 4.0, math.inf)  # extrapolation bins: forecast / evidence window


class Page(NamedTuple):
    """A leak's first page: the forecast time left and the real one (s), its evidence."""

    family: str
    forecast: float
    real: float
    window: float

    @property
    def ratio(self) -> float:
        return self.real / self.forecast

    @property
    def ahead(self) -> float:
        return self.forecast / self.window if self.window > 0 else math.inf


def _page(family: str, alert: dict | None, oom: float | None) -> Page | None:
    """A page worth scoring: raised before the OOM, with a forecast."""
    if alert is None or oom is None or alert["time"] >= oom \
            or alert.get("predicted_oom_time") is None:
        return None
    forecast = max(alert["predicted_oom_time"] - alert["time"], 60.0)
    return Page(family, forecast, oom - alert["time"], alert.get("window_seconds") or 0.0)


def simulator_pages(seeds: Sequence[int], quick: bool) -> list[Page]:
    """The first page of every leaking chip of bench/detect.py's corpus of each seed."""
    pages = []
    for seed in seeds:
        cases = detect.plan_corpus(seed, quick)
        truth = {t.key: t for _, ts in cases for t in ts}
        with tempfile.TemporaryDirectory() as tmp:
            detect.write_corpus(cases, tmp)
            for r in analyze_path(tmp):
                t = truth.get((r.host, str(r.chip)))
                if t is not None and t.leaking:
                    page = _page(f"simulator {t.category}", r.alert, t.oom_time)
                    if page:
                        pages.append(page)
        print(f"  detect.py seed {seed}: {len(pages)} pages so far", flush=True)
    return pages


def nuisance_pages(seed: int, scale: float) -> list[Page]:
    """The first page of every leaking chip of bench/nuisances.py's leak families."""
    pages = []
    for job in nuisances.run_sweep(list(nuisances.LEAKS), seed, scale):
        for chip in job["chips"]:
            alert = chip["alert"]
            if chip["leaking"] and alert is not None:
                page = _page(f"nuisances {job['family']}", {
                    "time": alert["time"], "predicted_oom_time": alert["predicted"],
                    "window_seconds": alert["window"]}, job["oom"])
                if page:
                    pages.append(page)
    print(f"  nuisances.py seed {seed}: {len(pages)} pages", flush=True)
    return pages


def calibrate(pages: list[Page], coverage: float) -> list[forecast_band.Band]:
    """Per bin, the ratios at the conformal ranks of the central ``coverage`` (with the
    forecast itself inside: low at most 1, high at least 1)."""
    bands, lower = [], 0.0
    tail = (1 - coverage) / 2
    for upper in EDGES:
        ratios = sorted(p.ratio for p in pages if lower <= p.ahead < upper)
        n = len(ratios)
        if n < 20:
            raise SystemExit(f"forecast_band: {n} calibration pages {lower}-{upper} windows "
                             "ahead, too few for a band")
        low = ratios[max(math.floor((n + 1) * tail) - 1, 0)]
        high = ratios[min(math.ceil((n + 1) * (1 - tail)) - 1, n - 1)]
        bands.append(forecast_band.Band(upper, round(min(low, 1.0), 3),
                                        round(max(high, 1.0), 3)))
        lower = upper
    return bands


def judge(pages: list[Page]) -> tuple[float, float]:
    """The module's band on these pages: the share it held, and its median width (latest
    over earliest)."""
    held, widths = 0, []
    for p in pages:
        low, high = forecast_band.oom_band(p.forecast, p.window)
        held += low <= p.real <= high
        widths.append(high / low)
    return held / len(pages), statistics.median(widths)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small corpora (a smoke run)")
    parser.add_argument("--coverage", type=float, default=forecast_band.COVERAGE)
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0
    seeds = (0, 1, 4, 5) if args.quick else (0, 1, 2, 3, 4, 5, 6, 7)
    half = len(seeds) // 2
    print("calibration pages:")
    fitted = simulator_pages(seeds[:half], args.quick) + nuisance_pages(0, scale)
    print("judge pages:")
    sim, nuis = simulator_pages(seeds[half:], args.quick), nuisance_pages(1, scale)
    print(f"\nBANDS, calibrated on {len(fitted)} pages at coverage {args.coverage}:")
    for b in calibrate(fitted, args.coverage):
        print(f"    Band({b.up_to}, {b.low}, {b.high}),")
    print("\n| judge pages | pages | OOM inside the band | median width (latest / earliest) |")
    print("|---|---|---|---|")
    for name, pages in (("detect.py seeds " + ",".join(map(str, seeds[half:])), sim),
                        ("nuisances.py seed 1", nuis), ("both", sim + nuis)):
        held, width = judge(pages)
        print(f"| {name} | {len(pages)} | {held:.3f} | {width:.2f} |")


if __name__ == "__main__":
    main()
