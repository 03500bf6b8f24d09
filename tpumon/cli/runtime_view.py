"""``tpumon status --metric NAME`` and ``--list-metrics``: one runtime metric, or what the
runtime serves, read straight from the runtime like tpu-info does (no agent, no
Prometheus). Distributions are shown as tpu-info shows them: count, mean and percentiles
(p50, p90, p95, p99.9), here interpolated within the runtime's buckets. What the
runtime's port answered (metric names, labels, an error) is printed through
:func:`~tpumon.common.untrusted_text.for_terminal`: between jobs anyone may serve that port."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tpumon.cli.format import output_console
from tpumon.agent.bootstrap import build
from tpumon.common.config import Config
from tpumon.common.units import format_bytes
from tpumon.common.samples import Distribution
from tpumon.sources.runtime_catalog import BY_RUNTIME_NAME, CATALOG, MetricSpec, find_spec
from tpumon.sources.tpu_runtime import DUTY_CYCLE, TOTAL, USAGE
from tpumon.state import PollState
from tpumon.common.untrusted_text import for_terminal as shown

CORE = {USAGE: ("hbm_usage", "tpumon_hbm_used_bytes"),
        TOTAL: ("hbm_usage", "tpumon_hbm_total_bytes"),
        DUTY_CYCLE: ("duty_cycle_percent", "tpumon_tensorcore_duty_cycle_ratio")}
#: every name of the core metrics: the runtime's, tpu-info's and tpumon's
_CORE_NAMES = frozenset(CORE) | {name for names in CORE.values() for name in names}
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99.9", 0.999))


def read_runtime(config: Config) -> PollState:
    """One poll of the runtime (which lists its metrics and reads them at once)."""
    assembly = build(config, history=False)
    try:
        return assembly.agent.poll_once()
    finally:
        assembly.close()


def runtime_error(snap: PollState) -> str | None:
    return next((h.error for h in snap.health if h.name == "tpu_runtime" and not h.up), None)


def list_document(snap: PollState) -> list[dict[str, Any]]:
    """Each metric the runtime lists, with tpu-info's name and tpumon's, where known."""
    rows = []
    for name in snap.runtime.supported if snap.runtime else ():
        spec = BY_RUNTIME_NAME.get(name)
        short, family = (spec.short, spec.family) if spec else CORE.get(name, (None, None))
        rows.append({"runtime_metric": name, "tpu_info_name": short, "tpumon_metric": family})
    return rows


def metric_document(snap: PollState, spec: MetricSpec) -> dict[str, Any]:
    """The metric's series: label values and the value, or count, mean and percentiles."""
    series = []
    for s in snap.runtime.series if snap.runtime else ():
        if s.family != spec.family:
            continue
        entry: dict[str, Any] = dict(zip(spec.labels, s.labels, strict=True))
        if s.histogram is not None:
            entry.update(_distribution(s.histogram))
        else:
            entry["value"] = s.value
        series.append(entry)
    return {"metric": spec.short, "runtime_metric": spec.runtime_name,
            "tpumon_metric": spec.family, "kind": spec.kind, "series": series}


def _distribution(h: Distribution) -> dict[str, Any]:
    out: dict[str, Any] = {"count": h.count, "mean": h.sum / h.count if h.count else None}
    out.update({name: h.quantile(q) for name, q in PERCENTILES})
    return out


def show(config: Config, metric: str | None, fmt: str) -> None:
    """Print the list or the metric; a name nobody knows is one error line, exit 2."""
    spec = None
    if metric is not None:
        spec = find_spec(metric)
        if spec is None and metric in _CORE_NAMES:
            click.echo(f"Error: --metric {metric}: HBM and the duty cycle are what tpumon "
                       "status shows without --metric (--metric is for the runtime's other "
                       "metrics)", err=True)
            sys.exit(2)
        if spec is None:
            names = ", ".join(s.short for s in CATALOG)
            click.echo(f"Error: --metric {metric}: unknown metric; known: {names}", err=True)
            sys.exit(2)
    snap = read_runtime(config)
    error = runtime_error(snap)
    if spec is None:
        rows = list_document(snap)
        _emit(fmt, {"metrics": rows, "error": error}, lambda c: _list_table(rows, c), error)
        return
    doc = metric_document(snap, spec)
    listed = snap.runtime is not None and spec.runtime_name in snap.runtime.supported
    if error is None and not listed:
        click.echo(f"Error: the runtime does not list {spec.runtime_name} "
                   "(tpumon status --list-metrics shows what it serves)", err=True)
        sys.exit(1)
    _emit(fmt, {**doc, "error": error}, lambda c: _metric_table(doc, spec, c), error)


def _emit(fmt: str, doc: dict[str, Any], table: Any, error: str | None) -> None:
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    console = output_console()
    if error is not None:
        console.print(f"[yellow]tpu_runtime: down: {shown(error)}[/]", highlight=False)
        return
    table(console)


def _list_table(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="metrics the runtime serves", title_justify="left")
    for column in ("Runtime metric", "tpu-info name", "tpumon metric"):
        table.add_column(column)
    for r in rows:
        table.add_row(shown(r["runtime_metric"]), r["tpu_info_name"] or "-",
                      r["tpumon_metric"] or "[yellow]not exported[/]")
    console.print(table)


def _metric_table(doc: dict[str, Any], spec: MetricSpec, console: Console) -> None:
    table = Table(title=doc["metric"], caption=doc["runtime_metric"], title_justify="left",
                  caption_justify="left")
    value_columns = (["Count", "Mean"] + [n for n, _ in PERCENTILES]
                     if spec.kind == "histogram" else ["Value"])
    for column in [label.replace("_", " ").capitalize() for label in spec.labels] + \
            value_columns:
        table.add_column(column, justify="right" if column in value_columns else "left")
    for s in doc["series"]:
        keys = [shown(s[label]) for label in spec.labels]  # whatever serves the port wrote them
        if spec.kind == "histogram":
            cells = [f"{s['count']:,}"] + [_unit(spec, s[k]) for k in
                                          ["mean"] + [n for n, _ in PERCENTILES]]
        else:
            cells = [_unit(spec, s["value"])]
        table.add_row(*keys, *cells)
    console.print(table)
    if not doc["series"]:
        console.print("no values yet", highlight=False)


def _unit(spec: MetricSpec, value: float | None) -> str:
    """A value in the family's unit for people: 1.2 ms, 2.0 GiB/s, 41.0 %."""
    if value is None:
        return "-"
    if spec.family.endswith("_ratio"):
        return f"{100 * value:.1f} %"
    if spec.family.endswith("_bytes_per_second"):
        return f"{format_bytes(value)}/s"
    if spec.family.endswith("_seconds"):
        for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
            if abs(value) >= scale or unit == "us":
                return f"{value / scale:.3g} {unit}"
    return f"{value:g}"
