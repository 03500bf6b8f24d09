"""Times as the client commands take them (--since, --until): Unix seconds, ISO 8601, or
an age such as 6h."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

import click

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, option: str, now: float | None = None) -> float:
    """Unix seconds, an ISO 8601 time (UTC unless it says otherwise), or an age such as
    '90m', '6h', '2d' (that long before now)."""
    now = time.time() if now is None else now
    value = text.strip()
    age = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", value)
    if age:
        return now - float(age.group(1)) * _UNITS[age.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a time: use Unix seconds, "
                                 "2026-11-21T08:00 (UTC) or an age like 6h",
                                 param_hint=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
