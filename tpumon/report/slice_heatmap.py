"""The whole slice in one picture (`tpumon report --prometheus`): a chip x time heatmap of
HBM used over capacity, every chip of every worker one row, and below it the leaking
chips' floors with their OOM forecasts, so the sick chips of a 32-chip slice stand out
at a glance before the per-host pages."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib import cm
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tpumon.detect import DetectorSettings
from tpumon.report.data import HostReport, gap_seconds
from tpumon.trace.schema import SeriesColumns

BINS = 240  # time columns of the heatmap
ROW_IN = 0.18  # inches per chip of the heatmap
FLOORS_IN = 3.5  # inches of the floors panel under it (drawn when a chip leaks)
DPI = 90
LEGEND_ROWS = 20  # entries in a column of the floors' legend
GiB = 2**30


def _order(key: tuple[str, str]) -> tuple:
    host, chip = key
    worker = re.search(r"(\d+)$", host)
    return (int(worker.group(1)) if worker else math.inf, host,
            int(chip) if chip.isdigit() else math.inf, chip)


def heatmap(series: Mapping[tuple[str, str], SeriesColumns]) -> tuple[list, np.ndarray,
                                                                       np.ndarray]:
    """(row keys, bin edges, ratios): each chip's highest used/capacity per time bin.

    A bin without a sample of its own, inside the chip's series, holds the level of the
    sample before it (the memory stays where it was until the next poll): samples sparser
    than the bins, as Prometheus' scrapes of an accelerated demo, are not white space
    between stripes. It is NaN (a hole) only where the chip has no sample at all, or in a
    gap as long as the report's (tpumon.report.data.gaps): a host down, a job between
    runs."""
    keys = sorted(series, key=_order)
    start = min(float(series[k].times.min()) for k in keys)
    end = max(float(series[k].times.max()) for k in keys)
    edges = np.linspace(start, end if end > start else start + 1.0, BINS + 1)
    ratios = np.full((len(keys), BINS), np.nan)
    settings = DetectorSettings()
    for row, key in enumerate(keys):
        c = series[key]
        index = np.clip(np.searchsorted(edges, c.times, side="right") - 1, 0, BINS - 1)
        values = c.used / np.where(c.total > 0, c.total, np.nan)
        best = np.full(BINS, -np.inf)
        np.maximum.at(best, index, values)
        ratios[row] = np.where(np.isfinite(best), best, np.nan)
        empty = np.flatnonzero(np.isnan(ratios[row]))
        before = c.times.searchsorted(edges[empty], side="right") - 1  # the last sample
        inside = (before >= 0) & (before < len(c.times) - 1)
        empty, before = empty[inside], before[inside]
        held = c.times[before + 1] - c.times[before] < gap_seconds(c.times, settings)
        ratios[row, empty[held]] = values[before[held]]
    return keys, edges, ratios


def render_slice_png(series: Mapping[tuple[str, str], SeriesColumns],
                     reports: list[HostReport], title: str) -> bytes:
    keys, edges, ratios = heatmap(series)
    leaking = [c for r in reports for c in r.chips if c.assessment.verdict.value == "leak"]
    figure = Figure(figsize=(14.0, 3.0 + ROW_IN * len(keys) + (FLOORS_IN if leaking else 0.0)),
                    layout="constrained")  # room for the colour bar and the floors' legend
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2 if leaking else 1, 1,
                               height_ratios=[max(2.0, ROW_IN * len(keys)),
                                              FLOORS_IN][:1 + bool(leaking)])
    ax = figure.add_subplot(grid[0])
    hours = (edges - edges[0]) / 3600
    image = ax.imshow(ratios, aspect="auto", interpolation="nearest", vmin=0.0, vmax=1.0,
                      cmap="viridis", extent=(hours[0], hours[-1], len(keys) - 0.5, -0.5))
    ax.set_yticks(range(len(keys)), [f"{h} chip {c}" for h, c in keys], fontsize=7)
    ax.set_xlabel("hours since the first sample")
    ax.set_title(title, loc="left")
    figure.colorbar(image, ax=ax, label="HBM used / capacity", fraction=0.03)
    if leaking:
        floors = figure.add_subplot(grid[1])
        # 20 colours, not the default 10: sixteen chips drew in ten, and the legend named
        # two chips of one colour
        floors.set_prop_cycle(color=[cm.tab20(i) for i in range(20)])
        for chip in leaking:
            line, = floors.plot((chip.floor_times - edges[0]) / 3600, chip.floors / GiB,
                                lw=1.2, label=f"{chip.host} chip {chip.chip}")
            if chip.forecast is not None:
                floors.plot([(chip.forecast.now - edges[0]) / 3600,
                             (chip.forecast.time - edges[0]) / 3600],
                            [chip.forecast.level / GiB, chip.forecast.limit / GiB],
                            ls="--", lw=1, color=line.get_color())
        floors.set_ylabel("floor (GiB); dashed: to OOM")
        floors.set_xlabel("hours since the first sample")
        # beside the panel, not on it: inside, it covered the floors of the first hours
        floors.legend(fontsize=7, ncol=math.ceil(len(leaking) / LEGEND_ROWS),
                      loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def write_slice_png(series: Mapping[tuple[str, str], SeriesColumns], reports: list[HostReport],
                    slice_name: str, outdir: str | Path) -> Path:
    """tpumon-report-slice-NAME.png beside the per-host pages."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", slice_name).strip("._") or "slice"
    path = Path(outdir) / f"tpumon-report-slice-{safe}.png"
    path.write_bytes(render_slice_png(series, reports, f"slice {slice_name}: HBM used, "
                                      f"{len(series)} chips"))
    return path
