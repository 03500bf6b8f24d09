"""The report as one self-contained HTML file: the picture inlined as a data: URI, inline
CSS, no script and no external asset, so it can be attached to a message or opened from
a ticket years later."""

from __future__ import annotations

import base64
from typing import Any

import jinja2

from tpumon.common.describe import summarize_verdicts, verdict_label
from tpumon.detect.forecast_band import BAND_LABEL
from tpumon.detect.job_replay import describe_forecast
from tpumon.diagnose.job_ends import TRACE_ENDED_AT_OOM
from tpumon.report.data import ChipReport, HostReport
from tpumon.common.units import format_byte_range, format_span
from tpumon.report.render import (VERDICT_COLOURS, hhmm, oom_text, per_hour, per_step, size,
                                  step_text, utc)

MAX_LISTED = 6  # restarts or jumps listed one by one in a table cell; more are counted

_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("tpumon.report", "templates"),
                                autoescape=True, undefined=jinja2.StrictUndefined)


def render_html(report: HostReport, png: bytes) -> str:
    """The host's report page; ``png`` is :func:`~tpumon.report.render.render_png`'s."""
    # what is known, as every view sums chips up: never "no leak" over chips still warming
    # up or collecting
    headline = summarize_verdicts(c.verdict for c in report.chips)
    return _TEMPLATES.get_template("report.html.j2").render(
        title=f"tpumon report: {report.host}", headline=headline, host=report.host,
        ends=_ends(report),
        identity=_identity(report), chips=[_cells(c) for c in report.chips],
        image=base64.b64encode(png).decode("ascii"), version=report.version,
        generated=utc(report.generated_at), max_listed=MAX_LISTED) + "\n"


def _identity(r: HostReport) -> list[tuple[str, str]]:
    totals = sorted({c.total for c in r.chips})
    return [
        ("Host", r.host),
        ("Worker", r.worker if r.worker is not None else "not known (the host name has no "
                                                         "-w-N; tpumon report --worker N)"),
        ("Chips", ", ".join(c.chip for c in r.chips)),
        ("HBM per chip", ", ".join(size(t) for t in totals)),
        ("Time range", f"{format_span(r.start, r.end, seconds=True)} "
                       f"({(r.end - r.start) / 3600:.1f} h)"),
        ("Samples", f"{r.samples:,}"),
        ("Source", r.source),
        ("tpumon version", r.version),
    ]


def _cells(c: ChipReport) -> dict[str, Any]:
    """One chip's row of the summary table, as text (the template adds the markup)."""
    a, f = c.assessment, c.forecast
    low, high = a.slope_bytes_per_second_low, a.slope_bytes_per_second_high
    growth = [p for p in (per_step(c), per_hour(c)) if p]
    return {
        "chip": c.chip, "verdict": verdict_label(c.verdict),
        "reason": f"{TRACE_ENDED_AT_OOM}; before it: {a.reason}" if c.ended_at_oom else a.reason,
        "colour": VERDICT_COLOURS.get(c.verdict, "#444"),
        "growth": growth, "z": a.z,
        "growth_interval": None if low is None or high is None else
        format_byte_range(low * 3600, high * 3600, signed=True),
        "oom": None if f is None else oom_text(c, with_end=False) or "",  # the reason says it
        "oom_range": None if f is None or f.earliest is None else (
            BAND_LABEL, utc(f.earliest), "never" if f.latest is None else utc(f.latest)),
        "alert": _alert(c), "alert_forecast": _alert_forecast(c), "window": _window(c),
        "floor": None if a.floor_bytes is None else size(a.floor_bytes),
        "transient": size(a.transient_bytes) if a.transient_bytes else None,
        "restarts": [utc(j.start) + (f", {step_text(j.start_step)}"
                                     if j.start_step is not None else "") for j in c.restarts],
        "jumps": [f"{size(j.size, signed=True)} at {hhmm(j.time)}"
                  + (f", {step_text(j.step)}" if step_text(j.step) else "") for j in c.jumps],
        "jumps_total": size(sum(j.size for j in c.jumps), signed=True),
    }


def _ends(report: HostReport) -> list[str]:
    """Each job end the agent saw in the report's span, as it said it, in time order."""
    seen = {e.id: e for c in report.chips for e in c.ends}
    return [f"{utc(e.time)}: {e.summary}" for e in sorted(seen.values(), key=lambda e: e.time)]


def _alert_forecast(c: ChipReport) -> str | None:
    """The forecast made when the alert was raised, for the post-mortem."""
    return None if c.alert is None else describe_forecast(c.alert)


def _alert(c: ChipReport) -> str | None:
    if c.alert is None:
        return None
    at = step_text(c.alert.get("step"))
    return utc(c.alert["time"]) + (f", {at}" if at else "")


def _window(c: ChipReport) -> str | None:
    a = c.assessment
    if a.window_start is None:
        return None
    end = a.window_start + (a.window_seconds or 0.0)
    return (f"{utc(a.window_start)} to {hhmm(end)} ({(a.window_seconds or 0) / 3600:.1f} h, "
            f"{a.points} floors)")
