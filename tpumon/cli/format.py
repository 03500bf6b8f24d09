"""Cells and lines that several client commands write alike (status, watch, snapshot):
one wording each, so that every view of one poll reads the same."""

from __future__ import annotations

from typing import Any

from tpumon.common.describe import chip_time_to_oom, oom_cell


def format_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def format_eta(chip: Any, doc_time: float | None) -> str:
    """The chip's 'OOM in' cell, as every view writes it (:func:`tpumon.common.describe.oom_cell`);
    ``doc_time`` is the document's, for an older agent's chips that lack the figure."""
    return oom_cell(chip_time_to_oom(chip, doc_time), chip.get("growth_bytes_per_hour"))


def snapshot_line(result: dict[str, Any] | None) -> str | None:
    """One line on a process's live-tensor snapshot: what grew, or where the request is."""
    if not result:
        return None
    why = f" ({result['reason']})" if result.get("reason") else ""
    if result["pending"]:
        return f"tensor snapshots of {result['steps']} steps requested{why}, waiting"
    if result["error"]:
        return f"tensor snapshot{why} failed: {result['error']}"
    return (f"tensor snapshots, steps {result['from_step']:,} to {result['to_step']:,}{why}: "
            f"{result['summary']}")
