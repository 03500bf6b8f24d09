"""Leak detector speed, with a bit-identical check of its results against a reference.

`tpumon analyze` must get through >= 200,000 samples/s on one core, parse and leak
detection together. This times, in CPU seconds (``time.process_time``, median of
``--runs``), on one trace file (e.g. the one ``bench/detect.py --quick --keep-trace FILE``
writes):

- ``analyze_file(path)`` end to end (reading the trace and replaying every series), and
- the detector alone: ``replay_series`` on columns read beforehand.

Speed work on the detector must not change a single result, so the script also dumps
every series' result (``SeriesResult.to_json()``, the full ``Assessment`` and the
``alert`` dict) to JSON and, with ``--compare REF.json``, checks that dump is exactly
equal to a reference made by the code before the change (every field, every float bit
for bit); any difference is named (series and field) and the exit status is 1.

It also checks feed-mode equivalence on a few series: the agent feeds one poll at a
time, analyze a whole series at once, so one array, single samples and chunks of 777
must give the same ``assessment`` and ``alert``.

With ``--baseline-ref REF`` (e.g. HEAD) it also times tpumon's replay as it is at that git
revision (``git archive``, imported under a name of its own), runs interleaved with the
current code's: on a shared machine, before and after are only comparable from one process.

    python bench/detect_speed.py TRACE [--dump OUT.json] [--compare REF.json]
                                 [--runs 3] [--feed-series 16] [--baseline-ref HEAD]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import types
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tpumon.detect.detector import ChipDetector  # noqa: E402
from tpumon.detect.job_replay import SeriesResult, replay_series  # noqa: E402
from tpumon.detect.replay import analyze_file  # noqa: E402
from tpumon.trace.read import read_trace_columns  # noqa: E402

FEED_CHUNK = 777


# ================================================================ results


def plain(value: Any) -> Any:
    """JSON-ready form of an assessment field (enums by value); floats stay floats."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return getattr(value, "value", value)


def assessment_dict(a: Any) -> dict:
    return {f.name: plain(getattr(a, f.name)) for f in dataclasses.fields(a)}


def dump_results(results: list[SeriesResult]) -> list[dict]:
    """Everything a result holds: the contract's JSON, the full assessment and the alert."""
    return [{"series": f"{r.host}/{r.chip}", "json": r.to_json(),
             "assessment": assessment_dict(r.assessment), "alert": plain(r.alert)}
            for r in results]


def differences(ref: Any, new: Any, where: str) -> list[str]:
    """Every place where ``new`` is not exactly ``ref``: same types, floats bit for bit."""
    if type(ref) is not type(new):
        return [f"{where}: {ref!r} ({type(ref).__name__}) != {new!r} ({type(new).__name__})"]
    if isinstance(ref, dict):
        out = [f"{where}.{k}: missing in one of them" for k in sorted(set(ref) ^ set(new))]
        for k in ref:
            if k in new:
                out += differences(ref[k], new[k], f"{where}.{k}")
        return out
    if dataclasses.is_dataclass(ref) and not isinstance(ref, type):
        # field by field: a NaN field (a jump's unknown step) is never == itself
        return [d for f in dataclasses.fields(ref) for d in differences(
            getattr(ref, f.name), getattr(new, f.name), f"{where}.{f.name}")]
    if isinstance(ref, (list, tuple)):
        if len(ref) != len(new):
            return [f"{where}: {len(ref)} entries != {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(ref, new, strict=True))
                for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(ref, float):
        same = (math.isnan(ref) and math.isnan(new)) or ref.hex() == new.hex()
        return [] if same else [f"{where}: {ref!r} != {new!r}"]
    return [] if ref == new else [f"{where}: {ref!r} != {new!r}"]


def compare_dumps(ref: list[dict], new: list[dict]) -> list[str]:
    """Differences series by series (matched by host/chip), then in the series' order."""
    out = []
    ref_by, new_by = {d["series"]: d for d in ref}, {d["series"]: d for d in new}
    out += [f"{s}: only in the reference" for s in ref_by if s not in new_by]
    out += [f"{s}: not in the reference" for s in new_by if s not in ref_by]
    for series, r in ref_by.items():
        if series in new_by:
            out += differences(r, new_by[series], series)
    if not out and [d["series"] for d in ref] != [d["series"] for d in new]:
        out.append("series in a different order")
    return out


# ================================================================ feed modes


def feed(series, chunk: int | None) -> ChipDetector:
    """A detector fed one series whole (``chunk`` None) or ``chunk`` samples at a time."""
    detector = ChipDetector()
    n = len(series.times)
    size = n if chunk is None else chunk
    for a in range(0, n, max(size, 1)):
        b = a + size
        detector.update(series.times[a:b], series.steps[a:b], series.used[a:b], series.total[a:b])
    return detector


def feed_series_to_check(columns: dict, count: int) -> list[tuple[str, str]]:
    """One chip of each of the first ``count`` hosts: different scenarios and poll rates."""
    keys, hosts = [], set()
    for host, chip in columns:
        if host not in hosts and len(keys) < count:
            hosts.add(host)
            keys.append((host, chip))
    return keys


def check_feed_modes(columns: dict, count: int) -> list[str]:
    """Differences between a series fed whole and fed a sample or a chunk at a time."""
    out = []
    for key in feed_series_to_check(columns, count):
        modes = (("whole", None), ("single", 1), (f"chunks of {FEED_CHUNK}", FEED_CHUNK))
        runs = {mode: feed(columns[key], chunk) for mode, chunk in modes}
        ref = runs.pop("whole")
        expected = {"assessment": assessment_dict(ref.assessment), "alert": plain(ref.alert)}
        for mode, d in runs.items():
            got = {"assessment": assessment_dict(d.assessment), "alert": plain(d.alert)}
            out += differences(expected, got, f"{key[0]}/{key[1]} fed {mode}")
        print(f"feed modes {key[0]}/{key[1]}: {len(columns[key].times)} samples, "
              f"{ref.assessment.verdict.value}, alert {'yes' if ref.alert else 'no'}")
    return out


# ================================================================ timing


def speedup(before: list[float], after: list[float]) -> float:
    """Median over rounds of before/after: both ran in the same round, under the same load
    from whatever else shares the machine, which a ratio of medians would not cancel."""
    return statistics.median(b / a for b, a in zip(before, after, strict=True))


def cpu_seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    """CPU seconds of one call of ``fn()``, and its result."""
    t0 = time.process_time()
    result = fn()
    return time.process_time() - t0, result


def detector_only(columns: dict, replay: Callable = replay_series) -> list:
    return [replay(host, chip, c.times, c.steps, c.used, c.total)
            for (host, chip), c in columns.items()]


def load_baseline(ref: str) -> types.SimpleNamespace:
    """tpumon as it is at git revision ``ref``, imported beside today's under a name of its
    own (every ``tpumon`` in its imports renamed: any revision, whatever its layout), for
    its replay in the same process; returns a namespace with its ``analyze_file`` and
    ``replay_series``."""
    import importlib

    from revision import import_revision

    package = import_revision(ref)
    replay = importlib.import_module(f"{package}.detect.replay")
    series = getattr(replay, "replay_series", None) or importlib.import_module(
        f"{package}.detect.job_replay").replay_series
    return types.SimpleNamespace(analyze_file=replay.analyze_file, replay_series=series)


def timed(columns: dict, path: str, runs: int, baseline: types.SimpleNamespace | None,
          ref: str | None) -> tuple[dict[str, list[float]], list[SeriesResult]]:
    """CPU seconds of each variant in each of ``runs`` rounds, the variants interleaved
    within a round; and the current analyze_file's results."""
    variants: dict[str, Callable[[], Any]] = {
        "analyze_file": lambda: analyze_file(path),
        "detector alone": lambda: detector_only(columns)}
    if baseline is not None:
        variants[f"analyze_file @ {ref}"] = lambda: baseline.analyze_file(path)
        variants[f"detector alone @ {ref}"] = lambda: detector_only(columns,
                                                                    baseline.replay_series)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    results: list[SeriesResult] = []
    for _ in range(runs):
        for name, fn in variants.items():
            spent, out = cpu_seconds(fn)
            seconds[name].append(spent)
            if name == "analyze_file":
                results = out
    return seconds, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="trace file (CSV or JSON Lines)")
    parser.add_argument("--dump", metavar="OUT.json", help="write the results here")
    parser.add_argument("--compare", metavar="REF.json", help="exit 1 unless results equal these")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median), default 3")
    parser.add_argument("--baseline-ref", metavar="REF",
                        help="also time tpumon/detect/ at this git revision (e.g. HEAD)")
    parser.add_argument("--feed-series", type=int, default=16,
                        help="series to check feed-mode equivalence on (0: skip), default 16")
    args = parser.parse_args(argv)

    columns = read_trace_columns(args.trace)
    samples = sum(len(c.times) for c in columns.values())
    baseline = load_baseline(args.baseline_ref) if args.baseline_ref else None
    seconds, results = timed(columns, args.trace, args.runs, baseline, args.baseline_ref)
    print(f"{len(columns)} series, {samples} samples; CPU time (analyze_file: end to end, "
          f"reading included), median of {args.runs} runs (min):")
    for name, runs in seconds.items():
        med, best = statistics.median(runs), min(runs)
        print(f"  {name:<32} {med:6.3f} s, {samples / med:9,.0f} samples/s "
              f"({best:.3f} s, {samples / best:,.0f}/s)")
    if baseline is not None:
        print(f"speed-up over {args.baseline_ref}, median of the rounds' ratios: " + ", ".join(
            f"{name} {speedup(seconds[f'{name} @ {args.baseline_ref}'], seconds[name]):.2f}x"
            for name in ("analyze_file", "detector alone")))

    dump = dump_results(results)
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(dump, f, indent=1)
    problems = check_feed_modes(columns, args.feed_series) if args.feed_series else []
    if args.compare:
        with open(args.compare) as f:
            problems += compare_dumps(json.load(f), dump)
    for p in problems[:50]:
        print("DIFFERENT:", p)
    if len(problems) > 50:
        print(f"... and {len(problems) - 50} more differences")
    if args.compare or args.feed_series:
        print("identical" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
