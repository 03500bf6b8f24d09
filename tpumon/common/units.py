"""How every tpumon output writes bytes and time spans: one place, one convention.

Binary units (KiB, MiB, GiB, TiB), as tpu-info and Grafana's bytes(IEC) show HBM, so the
same chip reads the same in `status`, `watch`, `snapshot`, the agent's pages, reports and
alerts. A value that rounds to zero is written without a sign (never "-0.0 KiB").
"""

from __future__ import annotations

import math
import time

UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(value: float | None, signed: bool = False,
                 like: float | None = None) -> str:
    """'31.75 GiB', '812.3 MiB', '118.7 KiB', '512 B'; '+1.2 MiB' with ``signed``; '-' for
    None; in the unit ``like`` would be written in, when given (both ends of a range). The
    one way: ``watch``'s narrow columns write it so too."""
    if value is None or math.isnan(value):
        return "-"
    magnitude = abs(value)
    sized = magnitude if like is None else abs(like)
    unit, scale = next(((u, s) for u, s in UNITS if sized >= s), ("B", 1))
    decimals = 0 if unit == "B" else 1 if unit in ("KiB", "MiB") else 2
    text = f"{magnitude / scale:,.{decimals}f}"
    if float(text.replace(",", "")) == 0:
        sign = ""
    else:
        sign = "-" if value < 0 else "+" if signed else ""
    return f"{sign}{text} {unit}"


def format_byte_range(low: float, high: float, signed: bool = False) -> tuple[str, str]:
    """Both ends of a range in one unit, the larger end's: '+1,021.4 MiB' beside
    '+1.01 GiB' read as two different scales."""
    larger = max(abs(low), abs(high))
    return format_bytes(low, signed, like=larger), format_bytes(high, signed, like=larger)


def format_growth(bytes_per_step: float | None, bytes_per_hour: float | None,
                  signed: bool = False) -> str:
    """Growth as people read it: per step when steps are known, else per hour."""
    if bytes_per_step is not None:
        return f"{format_bytes(bytes_per_step, signed=signed)}/step"
    if bytes_per_hour is not None:
        return f"{format_bytes(bytes_per_hour, signed=signed)}/h"
    return "-"


def format_hours(seconds: float) -> str:
    """A span of time, to come or gone: '40 s', '45 min', '5.3 h', '12 d'. The one way
    every view writes a time to OOM (never 'OOM in 4.4 h' in one line and 'in 4 h 23 min'
    in the next)."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"


def utc(t: float, seconds: bool = False) -> str:
    """'2026-11-25 13:21 UTC'."""
    return time.strftime("%Y-%m-%d %H:%M" + (":%S" if seconds else ""), time.gmtime(t)) + " UTC"


def clock(t: float, reference: float) -> str:
    """A moment near ``reference`` as a page says it: '22:49 UTC' on the same day, with
    its date where it is not ('11-30 00:57 UTC'): a forecast made at 22:49 for 00:57 read
    as earlier than the forecast."""
    day = time.strftime("%Y-%m-%d", time.gmtime(reference))
    fmt = "%H:%M UTC" if time.strftime("%Y-%m-%d", time.gmtime(t)) == day else "%m-%d %H:%M UTC"
    return time.strftime(fmt, time.gmtime(t))


def format_span(start: float, end: float, seconds: bool = False) -> str:
    """'<start> to <end>', or just '<start>' when both read the same: an interval is shown
    only when it has width."""
    first, last = utc(start, seconds), utc(end, seconds)
    if first == last:
        return first
    if first[:10] == last[:10]:
        last = last[11:]  # same day: '2026-11-25 13:21 to 14:05 UTC'
        first = first[:-4]
    return f"{first} to {last}"
