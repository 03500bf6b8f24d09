"""Cells and lines that several client commands write alike (status, watch, snapshot), and
the console they write tables to: one wording each, so that every view of one poll reads
the same."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tpumon.common.describe import chip_time_to_oom, oom_cell


#: A pipe's or a file's width: no table is wider, so none is cut ('insufficien…',
#: 'megascale.dcn_transfer…'); a table takes only the width its cells need.
PIPE_WIDTH = 1000


def output_console() -> Console:
    """The terminal as it is; without one (a pipe, a file), wide enough that no cell is cut
    short and no line wrapped, so that grep and awk see whole names."""
    console = Console()
    return console if console.is_terminal else Console(width=PIPE_WIDTH)


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
