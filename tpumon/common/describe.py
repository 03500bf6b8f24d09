"""How every view says what one assessment says: its growth, its time to OOM, and what a
set of chips' verdicts add up to. ``status``, ``watch``, the agent's index page, /report,
the log, notifications, ``analyze`` and the slice view all write these through the
functions here, so one poll reads the same, byte for byte, wherever it is shown (never
"3.9 h" in a table beside "OOM in 4.1 h" in its reason).

The time to OOM is counted from the assessment's own moment (the end of its evidence
window, the moment the forecast was made), not from whenever a view happens to render
it: two views of one poll then cannot disagree by the seconds between them. The detector
refits every few minutes while a floor grows, so the figure is at most that old.

Free of numpy, so that a command that only prints (``tpumon status``) does not load the
detector.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from tpumon.common.units import format_growth, format_hours


def describe_growth(bytes_per_step: float | None, bytes_per_hour: float | None) -> str:
    """Growth as people read it: per step when steps are known, else per hour."""
    return format_growth(bytes_per_step, bytes_per_hour)


def describe_time_left(seconds: float | None) -> str:
    """A time to OOM as every view writes it: '45 min', '4.1 h', '12 d'; '-' for None."""
    return "-" if seconds is None else format_hours(seconds)


def describe_oom(seconds: float | None) -> str:
    """'OOM in 4.1 h', as a reason, a log line and a page say it; '' without a forecast."""
    return "" if seconds is None else f"OOM in {describe_time_left(seconds)}"


def time_to_oom(a: Any, now: float | None = None) -> float | None:
    """Seconds from an assessment's own moment (the end of its evidence window) to its
    forecast OOM; None without a forecast. ``a`` is an
    :class:`~tpumon.detect.Assessment` (anything with its fields). Every forecast the
    detector makes has its window; one made without (by hand) is counted from ``now``,
    where given."""
    oom, start, width = a.predicted_oom_time, a.window_start, a.window_seconds
    if oom is None:
        return None
    if start is None or width is None:
        return None if now is None else max(oom - now, 0.0)
    return max(oom - (start + width), 0.0)


def oom_cell(seconds: float | None, growth_per_hour: float | None) -> str:
    """An 'OOM in' column (status, watch, the index page, the slice view): the time to OOM
    whenever the floor grows, whatever the verdict (an 'ok' chip with slow growth has a
    forecast too, and its reason says the same figure); '-' when it does not grow."""
    if seconds is None or not (growth_per_hour or 0) > 0:
        return "-"
    return describe_time_left(seconds)


def chip_time_to_oom(chip: Mapping[str, Any], doc_time: float | None) -> float | None:
    """A status document chip's time to OOM: the agent's own figure
    (``time_to_oom_seconds``), or, from an agent older than it, the forecast less the
    document's time."""
    left = chip.get("time_to_oom_seconds")
    if isinstance(left, (int, float)):
        return float(left)
    oom = chip.get("predicted_oom_time")
    if isinstance(oom, (int, float)) and isinstance(doc_time, (int, float)):
        return max(oom - doc_time, 0.0)
    return None


#: How a verdict reads to a person, in every view that shows one (status, watch, the slice
#: view, analyze, the index page, the report, the log) and in the summaries' counts; JSON
#: and Prometheus keep the verdict itself. At most 10 characters: watch's 80 columns
#: dropped its Floor column for "step change".
VERDICT_LABELS: Mapping[str, str] = {
    "leak": "leak", "growing": "growing", "step_change": "stepped up", "ok": "ok",
    "warming_up": "warming up", "insufficient_data": "collecting", "unknown": "unknown",
}


def verdict_label(verdict: str | None) -> str:
    """A verdict as every view writes it ('collecting' for ``insufficient_data``, '-' for
    none): the same chip must not read `insufficient_data` in one view and 'collecting' in
    the next. A verdict not known here is shown as it came (escaped by the caller)."""
    if verdict is None:
        return "-"
    return VERDICT_LABELS.get(verdict, verdict)


#: How a verdict reads in a count of chips, in the order a summary lists them: as every
#: view writes it, but "2 leaking"
_VERDICT_WORDS: Mapping[str, str] = {
    verdict: "leaking" if verdict == "leak" else VERDICT_LABELS[verdict]
    for verdict in ("leak", "growing", "step_change", "ok", "warming_up", "insufficient_data")
}
#: The verdicts that know nothing of growth yet: a summary never says "no leak" over them.
UNKNOWN = frozenset({"warming_up", "insufficient_data", None, "unknown"})


def summarize_verdicts(verdicts: Iterable[str | None]) -> str:
    """What a set of chips' verdicts add up to, saying only what is known: '4 chips: no
    leak' when every chip has a fitted verdict and none leaks; else the count by verdict,
    worst first ('4 chips: 1 leaking, 1 warming up, 2 collecting'; a chip without a verdict
    is 'no verdict'). Every view that sums chips up (the report's title, ``status
    --slice``) says it with this."""
    counts = Counter(verdicts)
    n = sum(counts.values())
    head = f"{n} chip{'s' if n != 1 else ''}"
    if n == 0:
        return f"{head}"
    if not (counts.keys() & UNKNOWN) and not counts["leak"] and not counts["growing"]:
        if set(counts) == {"ok"}:
            return f"{head}: no leak"
        parts = [f"{counts[v]} {_VERDICT_WORDS[v]}" for v in _VERDICT_WORDS if counts[v]]
        return f"{head}: no leak ({', '.join(parts)})"
    parts = [f"{counts[v]} {_VERDICT_WORDS[v]}" for v in _VERDICT_WORDS if counts[v]]
    others = n - sum(counts[v] for v in _VERDICT_WORDS)
    if others:
        parts.append(f"{others} no verdict")
    return f"{head}: {', '.join(parts)}"
