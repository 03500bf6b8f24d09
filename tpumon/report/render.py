"""The report's picture: one panel per chip on a shared time axis, as a PNG.

Drawn with matplotlib's Agg canvas directly (no pyplot: no display, no global state, safe
in any thread). Imported only by ``tpumon report``: the agent never loads matplotlib.
"""

from __future__ import annotations

import io
import math
import time
import warnings

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from tpumon.detect.forecast_band import BAND_LABEL
from tpumon.diagnose.job_ends import TRACE_ENDED_AT_OOM
from tpumon.report.data import ChipReport, Forecast, HostReport
from tpumon.common.describe import (VERDICT_LABELS, describe_growth, describe_oom,
                                    time_to_oom, verdict_label)
from tpumon.common.units import format_bytes, format_span, utc

GiB = 2**30

RAW = "#c9d6e3"
FLOOR = "#1f4e79"
TREND = "#e6550d"
LIMIT = "#555555"
RESTART = "#7b3294"
JUMP = "#1a9850"
EXCURSION = "#8c8c8c"
ALERT = "#c00000"
ENDED = "#000000"  # a job's end the agent saw
GAP = "#b0b0b0"
VERDICT_COLOURS = {"leak": "#c00000", "growing": "#b8860b", "step_change": "#d98000",
                   "ok": "#2e7d32",
                   "warming_up": "#666666", "insufficient_data": "#666666"}
RIBBON = {verdict: (colour, VERDICT_LABELS[verdict]) for verdict, colour in (
    ("warming_up", "#bdbdbd"), ("insufficient_data", "#e3e3e3"), ("ok", "#a1d99b"),
    ("growing", "#fee08b"), ("leak", "#fb6a4a"), ("step_change", "#fdae6b"))}

WIDTH_IN = 14.0
PANEL_IN = 3.6
HEADER_IN = 1.2
FOOTER_IN = 0.55
DPI = 100
PLOT_LEFT, PLOT_RIGHT = 0.06, 0.985  # the panels' edges, as fractions of the width
MAX_JUMP_LABELS = 4  # more jumps on a panel get one label for all


# ------------------------------------------------------------------------- wording

def hhmm(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


def size(b: float, signed: bool = False) -> str:
    """Bytes as every tpumon output writes them (binary units: tpumon/common/units.py)."""
    return format_bytes(b, signed=signed)


def per_step(r: ChipReport) -> str | None:
    """The growth per step, as every view writes it (tpumon.common.describe)."""
    s = r.assessment.slope_bytes_per_step
    return None if s is None else describe_growth(s, None)


def per_hour(r: ChipReport) -> str | None:
    """The growth per hour, as every view writes it where steps are not known."""
    s = r.assessment.slope_bytes_per_hour
    return None if s is None else describe_growth(None, s)


def step_text(step: float | None) -> str:
    """A step as every view writes a forecast's (rounded, not truncated)."""
    return "" if step is None or math.isnan(step) else f"step {step:,.0f}"


def oom_text(r: ChipReport, with_end: bool = True) -> str | None:
    """'OOM in 5.4 h at step 80,722 (2025-06-16 06:28 UTC)', from the last fit; where the
    samples end at an OOM, said so first, as analyze says it (``with_end``: where no reason
    beside it says so already)."""
    f = r.forecast
    if f is None:
        return None
    at = step_text(f.step)
    oom = describe_oom(time_to_oom(r.assessment)) or describe_oom(f.time - f.now)
    said = oom + (f" at {at}" if at else "") + f" ({utc(f.time)})"
    return f"{TRACE_ENDED_AT_OOM} (before it: {said})" if with_end and r.ended_at_oom else said


def panel_title(r: ChipReport) -> str:
    parts = [f"chip {r.chip}: {verdict_label(r.verdict).upper()}"]
    growth = [g for g in (per_step(r), per_hour(r)) if g]
    if growth:
        parts.append("floor " + ", ".join(growth))
    oom = oom_text(r)
    if oom:
        parts.append(oom)
    return "  |  ".join(parts)


# ------------------------------------------------------------------------- drawing

def render_png(report: HostReport) -> bytes:
    """The host's report picture as PNG bytes."""
    n = len(report.chips)
    handles = _legend_handles(report)
    columns = 6
    rows = -(-len(handles) // columns)
    header = HEADER_IN + 0.24 * rows
    height = header + PANEL_IN * n + FOOTER_IN
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=PLOT_LEFT, right=PLOT_RIGHT, top=1 - header / height,
                        bottom=FOOTER_IN / height, hspace=0.32)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    t0 = report.start
    x_end = _x_end(report)
    for ax, chip in zip(axes, report.chips, strict=True):
        _panel(ax, chip, t0, x_end)
    axes[-1].set_xlim(0, (x_end - t0) / 3600)
    axes[-1].xaxis.set_major_locator(MaxNLocator(nbins=18, steps=[1, 2, 5, 10]))
    axes[-1].set_xlabel(f"hours since {utc(t0)}", fontsize=11)
    _step_axis(axes[0], report, t0)
    identity = f"host {report.host}" + (f" (worker {report.worker})" if report.worker else "")
    fig.suptitle(f"tpumon report: {identity}, {n} chip{'s' if n != 1 else ''}, "
                 f"{format_span(report.start, report.end)} "
                 f"({(report.end - report.start) / 3600:.1f} h)",
                 x=0.06, ha="left", y=1 - 0.12 / height, va="top", fontsize=14,
                 fontweight="bold")
    fig.legend(handles=handles, loc="upper left", ncol=columns, fontsize=9.5, frameon=False,
               bbox_to_anchor=(0.055, 1 - 0.5 / height), columnspacing=1.5)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return out.getvalue()


#: The time axis reaches out to a forecast OOM up to this many times the data's span past
#: its end, or OOM_REACH_HOURS, whichever is longer (an OOM inside the 6 h horizon of
#: TPUMonOOMForecast is always drawn); a farther one runs off the edge, its time written
#: there, so that the data keep at least a quarter of the width.
OOM_REACH_SPANS = 3.0
OOM_REACH_HOURS = 6.0


def _x_end(report: HostReport) -> float:
    """Right end of the time axis: the data, and the forecast OOM (its X) when it is not
    too far out (beyond, the forecast line runs off the edge with the time written on it)."""
    span = max(report.end - report.start, 3600.0)
    reach = report.end + max(OOM_REACH_SPANS * span, OOM_REACH_HOURS * 3600.0)
    end = report.end
    for c in report.chips:
        if c.forecast is not None:
            end = max(end, min(c.forecast.time + 0.04 * span, reach))
    return end + 0.01 * span


def _panel(ax, r: ChipReport, t0: float, x_end: float) -> None:
    h = lambda t: (np.asarray(t, dtype=float) - t0) / 3600  # noqa: E731
    times, low, high = _per_pixel(r, (x_end - t0) / max(r.end - r.start, 1e-9))
    ax.fill_between(h(times), low / GiB, high / GiB, color=RAW, linewidth=0, step="mid",
                    zorder=1)
    ft, fv = _broken(r.floor_times, r.floors, 1.5 * _bucket(r))
    ax.plot(h(ft), fv / GiB, color=FLOOR, linewidth=1.0, zorder=6, drawstyle="steps-post")
    ax.axhline(r.total / GiB, color="black", linewidth=1.3, zorder=2)
    ax.text(0.998, r.total / GiB, f"HBM {format_bytes(r.total)} ",
            transform=ax.get_yaxis_transform(),
            va="bottom", ha="right", fontsize=8.5)
    bottom = _bottom(r)
    ax.set_ylim(bottom, r.total / GiB + 0.09 * (r.total / GiB - bottom))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.set_ylabel("HBM (GiB)", fontsize=10)
    ax.grid(True, color="#e6e6e6", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    _ribbon(ax, r, h)
    for a, b in r.gaps:
        ax.axvspan(float(h(a)), float(h(b)), facecolor="none", edgecolor=GAP, hatch="///",
                   linewidth=0, zorder=1)
    if r.trend is not None:
        tr = r.trend
        ax.fill_between(h(tr.times), tr.low / GiB, tr.high / GiB, color=TREND, alpha=0.25,
                        linewidth=0, zorder=4)
        ax.plot(h(tr.times), tr.value / GiB, color=TREND, linewidth=2.6, zorder=5)
    if r.forecast is not None:
        _forecast(ax, r, r.forecast, h, x_end)
    for e in r.excursions:
        ax.plot(h(e.time), e.value / GiB, marker="v" if e.drop else "^", markersize=5,
                color=EXCURSION, linestyle="none", zorder=3)
    labels: list[tuple[float, str, str]] = []
    for job in r.restarts:
        ax.axvline(h(job.start), color=RESTART, linestyle="--", linewidth=1.5, zorder=6)
        at = step_text(job.start_step)
        labels.append((float(h(job.start)), "restart" + (f" ({at})" if at else ""), RESTART))
    for j in r.jumps:
        after = _floor_after(r, j.time)
        ax.plot(h(j.time), after / GiB, marker="^" if j.size > 0 else "v", markersize=10,
                color=JUMP, markeredgecolor="white", linestyle="none", zorder=7)
        if len(r.jumps) <= MAX_JUMP_LABELS:
            at = step_text(j.step)
            ax.annotate(f"jump {size(j.size, signed=True)}" + (f" ({at})" if at else ""),
                        (float(h(j.time)), after / GiB),
                        xytext=(6, 8 if j.size > 0 else -14), textcoords="offset points",
                        fontsize=8.5, color=JUMP, fontweight="bold", zorder=8)
    if len(r.jumps) > MAX_JUMP_LABELS:  # one label for them all
        ups = sum(1 for j in r.jumps if j.size > 0)
        labels.append((float(h(r.jumps[0].time)),
                       f"{len(r.jumps)} level jumps ({ups} up), "
                       f"{size(sum(j.size for j in r.jumps), signed=True)} in all", JUMP))
    for end in r.ends:  # the agent saw the job end here (docs/job-ends.md)
        ax.axvline(h(end.time), color=ENDED, linewidth=2.0, linestyle="-.", zorder=6)
        at = step_text(end.step)
        labels.append((float(h(end.time)), f"job ended: {end.cause}" + (f" ({at})" if at else ""),
                       ENDED))
    if r.alert is not None:
        ax.axvline(h(r.alert["time"]), color=ALERT, linewidth=2.0, zorder=6)
        at = step_text(r.alert.get("step"))
        labels.append((float(h(r.alert["time"])),
                       f"leak alert {hhmm(r.alert['time'])}" + (f", {at}" if at else ""), ALERT))
    _top_labels(ax, labels, (x_end - t0) / 3600)
    colour = VERDICT_COLOURS.get(r.verdict, "black")
    ax.set_title(panel_title(r), loc="left", fontsize=11.5, color=colour, fontweight="bold")
    ax.tick_params(labelsize=9.5, labelbottom=True)


def _per_pixel(r: ChipReport, stretch: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The raw-sample envelope in bins at least a pixel wide, on an axis ``stretch`` times
    the data's span (reaching out to an OOM): bins narrower than a pixel are each blended
    to a faint sliver, and the band is all but invisible."""
    pixels = max(1, int(WIDTH_IN * DPI * (PLOT_RIGHT - PLOT_LEFT) / stretch))
    k = -(-len(r.envelope_times) // pixels)
    if k <= 1:
        return r.envelope_times, r.envelope_low, r.envelope_high
    n = -(-len(r.envelope_times) // k) * k
    pad = np.full(n - len(r.envelope_times), np.nan)

    def grouped(values: np.ndarray) -> np.ndarray:
        return np.r_[values, pad].reshape(-1, k)
    with warnings.catch_warnings():  # a group all NaN (inside a gap) stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return (np.nanmean(grouped(r.envelope_times), axis=1),
                np.nanmin(grouped(r.envelope_low), axis=1),
                np.nanmax(grouped(r.envelope_high), axis=1))


def _bucket(r: ChipReport) -> float:
    gaps = np.diff(r.floor_times)
    return float(np.median(gaps)) if len(gaps) else 60.0


def _broken(times: np.ndarray, values: np.ndarray, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """The series with a NaN inserted where time jumps by more than ``gap`` (no line
    drawn across a time without samples)."""
    cut = np.flatnonzero(np.diff(times) > gap) + 1
    return (np.insert(times.astype(float), cut, np.nan),
            np.insert(values.astype(float), cut, np.nan))


def _bottom(r: ChipReport) -> float:
    """Bottom of the y axis (GiB): a little under the lowest floor after warm-up, so the
    floor's slope fills the panel; loading at the start of a job may go off the bottom."""
    trend = np.zeros(len(r.floor_times), dtype=bool)
    for job in r.jobs:
        if job.trend_start is not None:
            trend |= (r.floor_times >= job.trend_start) & (r.floor_times < job.end)
    floors = r.floors[trend] if trend.any() else r.floors
    low = float(np.percentile(floors, 1)) / GiB
    return max(0.0, low - 0.25 * (r.total / GiB - low))


def _floor_after(r: ChipReport, t: float) -> float:
    """The floor's level just after time ``t`` (the second lowest of a few buckets)."""
    i = int(r.floor_times.searchsorted(t))
    nxt = np.sort(r.floors[i:i + 5])
    return float(nxt[1] if len(nxt) > 1 else nxt[0] if len(nxt) else r.floors[-1])


def _ribbon(ax, r: ChipReport, h) -> None:
    """The detector's verdict over time, as a strip along the bottom of the panel."""
    for start, end, verdict in r.verdicts:
        colour = RIBBON.get(verdict, ("#ffffff", verdict))[0]
        ax.axvspan(float(h(start)), float(h(end)), ymin=0, ymax=0.045, color=colour,
                   linewidth=0, zorder=2)


def _forecast(ax, r: ChipReport, f: Forecast, h, x_end: float) -> None:
    ax.axhline(f.limit / GiB, color=LIMIT, linestyle=":", linewidth=1.2, zorder=2)
    ax.text(0.002, f.limit / GiB, " OOM when the floor reaches this (HBM less the largest "
            "transient)", transform=ax.get_yaxis_transform(), va="top", ha="left",
            fontsize=8, color=LIMIT)
    rate = (f.limit - f.level) / max(f.time - f.now, 1e-9)
    end = min(f.time, x_end)
    xs = np.array([f.now, end])
    ax.plot(h(xs), (f.level + rate * (xs - f.now)) / GiB, color=TREND, linestyle="--",
            linewidth=2.0, zorder=5)
    # the slope's 95 % interval, carried forward from the last fit to the limit
    a = r.assessment
    future = np.linspace(f.now, x_end, 64)
    band = [np.minimum(f.level + s * (future - f.now), f.limit)
            for s in (a.slope_bytes_per_second_low, a.slope_bytes_per_second_high)
            if s is not None]  # a forecast has a trend, and a trend both ends of the interval
    ax.fill_between(h(future), np.minimum(*band) / GiB, np.maximum(*band) / GiB, color=TREND,
                    alpha=0.2, linewidth=0, zorder=4)
    for edge in band:  # its edges, so that a narrow band still shows
        ax.plot(h(future), edge / GiB, color=TREND, linewidth=0.7, alpha=0.7, zorder=4)
    span_h = (x_end - r.start) / 3600
    if f.time <= x_end:
        ax.plot(h(f.time), f.limit / GiB, marker="X", markersize=13, color="black",
                markeredgecolor="white", zorder=9, linestyle="none")
        at = step_text(f.step)
        text = f"OOM {utc(f.time)}" + (f"\n{at}" if at else "") + _oom_range(f)
        right_room = (x_end - f.time) / 3600 > 0.22 * span_h
        # above the limit line (away from the forecast line coming up to it) where the
        # band between it and the HBM line is tall enough for the box, else below
        lines = text.count("\n") + 1
        room = (ax.transData.transform((0, r.total / GiB))[1]
                - ax.transData.transform((0, f.limit / GiB))[1]) * 72 / DPI
        above = room > 13 * lines + 12
        ax.annotate(text, (float(h(f.time)), f.limit / GiB),
                    xytext=(10 if right_room else -14, 5 if above else -10),
                    textcoords="offset points", ha="left" if right_room else "right",
                    va="bottom" if above else "top", fontsize=9.5,
                    fontweight="bold", zorder=9,
                    bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor="black",
                              linewidth=0.8))
    else:
        y = f.level + rate * (x_end - f.now)
        at = step_text(f.step)
        ax.annotate(f"OOM {utc(f.time)}" + (f", {at}" if at else "") + " \u2192",
                    (float(h(x_end)), y / GiB), xytext=(-8, 8), textcoords="offset points",
                    ha="right", va="bottom", fontsize=9.5, fontweight="bold", zorder=9,
                    bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor="black",
                              linewidth=0.8))


def _oom_range(f) -> str:
    """The ends of the forecast's calibrated band, where they differ enough to say (a line
    of its own)."""
    if f.earliest is None:
        return ""
    if f.latest is None:
        return f"\n{BAND_LABEL}: {hhmm(f.earliest)} or never"
    if f.latest - f.earliest < 600:
        return ""
    return f"\n{BAND_LABEL}: {utc(f.earliest)[5:16]} to {utc(f.latest)[5:16]}"


def _top_labels(ax, labels: list[tuple[float, str, str]], span_h: float) -> None:
    """Labels of vertical lines along the top of the panel, stacked where they would
    overlap (about 0.6 % of the axis per character at this width); a label that would run
    past the panel's right edge (a job that ended near the end of the data) is written on
    the left of its line instead, not cut off."""
    placed: list[tuple[float, float, int]] = []  # (x from, x to, row)
    for x, text, colour in sorted(labels):
        width = (len(text) + 2) * 0.0062 * span_h
        left = x + width > span_h and x - width >= 0
        start = x - width if left else x
        row = 0
        while any(r == row and a < start + width and start < b for a, b, r in placed):
            row += 1
        placed.append((start, start + width, row))
        ax.text(x, 0.955 - 0.12 * row, text + " " if left else " " + text,
                transform=ax.get_xaxis_transform(), ha="right" if left else "left",
                va="top", fontsize=8.5, color=colour, fontweight="bold", zorder=10,
                bbox=dict(boxstyle="square,pad=0.15", facecolor="white", edgecolor="none",
                          alpha=0.85))


def _step_axis(ax, report: HostReport, t0: float) -> None:
    """Training steps along the top of the first panel, where they are known."""
    chip = next((c for c in report.chips if c.has_steps), None)
    if chip is None:
        return
    top = ax.twiny()
    top.set_xlim(ax.get_xlim())
    ticks = [x for x in ax.get_xticks() if ax.get_xlim()[0] <= x <= ax.get_xlim()[1]]
    labels = ["" if step is None else f"{int(step):,}"
              for step in chip.steps_at([t0 + x * 3600 for x in ticks], slack=600.0)]
    top.set_xticks(ticks)
    top.set_xticklabels(labels, fontsize=8.5, color="#444444")
    top.set_xlabel("training step", fontsize=9, color="#444444", labelpad=2)
    top.tick_params(length=3, pad=1)


def _legend_handles(report: HostReport) -> list:
    """Legend entries for what the picture shows (nothing for what no panel has)."""
    chips = report.chips
    handles = [
        Patch(color=RAW, label="raw samples (min to max)"),
        Line2D([], [], color=FLOOR, linewidth=1.3, label="floor (per-bucket minimum)"),
    ]
    if any(c.trend for c in chips):
        handles += [Line2D([], [], color=TREND, linewidth=2.6,
                           label="fitted trend (evidence window)"),
                    Patch(color=TREND, alpha=0.3, label="95% interval of the slope")]
    if any(c.forecast for c in chips):
        handles += [Line2D([], [], color=TREND, linestyle="--", linewidth=2, label="forecast"),
                    Line2D([], [], marker="X", color="black", linestyle="none", markersize=9,
                           label="predicted OOM")]
    if any(c.alert for c in chips):
        handles.append(Line2D([], [], color=ALERT, linewidth=2, label="leak alert (first)"))
    if any(c.gaps for c in chips):
        handles.append(Patch(facecolor="none", edgecolor=GAP, hatch="///", linewidth=0,
                             label="no samples"))
    if any(c.restarts for c in chips):
        handles.append(Line2D([], [], color=RESTART, linestyle="--", linewidth=1.5,
                              label="job restart"))
    if any(c.jumps for c in chips):
        handles.append(Line2D([], [], marker="^", color=JUMP, linestyle="none", markersize=9,
                              label="level jump"))
    if any(c.ends for c in chips):
        handles.append(Line2D([], [], color=ENDED, linestyle="-.", linewidth=2.0,
                              label="job ended (cause)"))
    if any(not e.drop for c in chips for e in c.excursions):
        handles.append(Line2D([], [], marker="^", color=EXCURSION, linestyle="none",
                              markersize=6, label="transient excursion"))
    if any(e.drop for c in chips for e in c.excursions):
        handles.append(Line2D([], [], marker="v", color=EXCURSION, linestyle="none",
                              markersize=6, label="floor drop"))
    seen = {v for c in chips for _, _, v in c.verdicts}
    for verdict, (colour, name) in RIBBON.items():
        if verdict in seen:
            handles.append(Patch(color=colour, label=f"detector: {name}"))
    return handles
