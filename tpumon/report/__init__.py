"""``tpumon report``: a per-host picture and HTML page of what the leak detector saw.

``data.py`` replays the detector over the samples and gathers what to draw, ``render.py``
draws the PNG (matplotlib, Agg), ``html.py`` writes the self-contained page. Imported only
by the ``report`` command: the agent never loads matplotlib. May import ``store``,
``trace``, ``detect`` and ``common``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpumon.report.data import HostReport, build_reports

__all__ = ["HostReport", "build_reports", "file_stem", "write_report"]


def file_stem(host: str) -> str:
    """``tpumon-report-<host>``, the host name made safe as a file name."""
    return "tpumon-report-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", host).strip("._") or "host")


def write_report(report: HostReport, outdir: str | Path) -> tuple[Path, Path]:
    """Write the host's PNG and HTML into ``outdir``; returns their paths."""
    from tpumon.report.html import render_html
    from tpumon.report.render import render_png

    png = render_png(report)
    out = Path(outdir)
    stem = file_stem(report.host)
    png_path, html_path = out / f"{stem}.png", out / f"{stem}.html"
    png_path.write_bytes(png)
    html_path.write_text(render_html(report, png), encoding="utf-8")
    return png_path, html_path
