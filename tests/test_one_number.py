"""One moment, one number (issue 43 item 4): every view of one poll writes the same
growth and the same time to OOM, byte for byte. One `tpumon status` once printed
"495.4 KiB/step | 3.9 h" in its table and "grow 499.9 KiB/step; OOM in 4.1 h" in the
reason under it; the log said "OOM in 4.4 h" and "in 4 h 23 min" in one second; /report
wrote "+118.5 KiB/step" and the index page had no growth at all.

The assessments are the real detector's, pooled as the agent pools them, over a generated
four-chip leak whose chips grow at different rates (so a view that shows one chip's figure
beside another's, or the job's, is caught); each view is the real code that renders it."""

from __future__ import annotations

import logging
import re

from rich.console import Console
from test_pooling import HOST, columns

from tpumon.agent.loop import log_verdict_changes
from tpumon.cli.slice_view import slice_table
from tpumon.cli.status import render_table
from tpumon.cli.watch import chip_table
from tpumon.web.http import landing_page
from tpumon.common.identity import Identity
from tpumon.notify.alerts import AlertTracker
from tpumon.notify.settings import AlertSettings
from tpumon.report.data import build_reports
from tpumon.report.html import render_html
from tpumon.common.samples import ChipSample, RuntimeReading
from tpumon.client.slice import WorkerAnswer, build_view
from tpumon.sources.chips import inventory_for
from tpumon.state import PollState
from tpumon.common.units import format_growth, format_hours
from tpumon.web.status import status_document

GROWTH = re.compile(r"[+-]?[\d.,]+ [KMGT]?i?B/step")
LEFT = re.compile(r"OOM in ([\d.]+ (?:s|min|h|d))\b")


def text(renderable) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(renderable, soft_wrap=True)
    return console.export_text()


def test_every_view_of_one_poll_writes_the_same_growth_and_time_to_oom(caplog):
    report = build_reports(columns("linear-leak", 10, 11, leak_chip_spread=0.3), "trace",
                           "test", 0.0)[0]
    assessments = {c.chip: c.assessment for c in report.chips}
    assert all(a.verdict.value == "leak" for a in assessments.values())
    # the assessment's figures, the time to OOM counted from its own moment
    growth = {format_growth(a.slope_bytes_per_step, a.slope_bytes_per_hour)
              for a in assessments.values()}
    left = {format_hours(a.predicted_oom_time - a.window_start - a.window_seconds)
            for a in assessments.values()}
    assert len(growth) == 4, growth  # four chips, four figures: a mix-up cannot hide
    # the views render a while after the poll's fits: a view that counts from its own
    # clock says less time left
    moment = max(a.window_start + a.window_seconds for a in assessments.values())
    now = moment + 900
    chips = {c: ChipSample(c, 20 * 2**30, 32 * 2**30, 0.9, int(c), 8431) for c in assessments}
    snap = PollState(time=now, identity=Identity(HOST, "0", "v4-8", "s"),
                     inventory=inventory_for("v4", 4), runtime=RuntimeReading(now, chips),
                     assessments=assessments, polls_total=1)
    doc = status_document(snap)
    with caplog.at_level(logging.INFO):
        log_verdict_changes({}, assessments)
    log = "\n".join(r.getMessage() for r in caplog.records)
    raised = AlertTracker(AlertSettings()).update(snap)
    assert raised
    views = {
        "status": text(_status(doc)),
        "watch": text(chip_table(doc, width=400)),
        "index page": landing_page(snap),
        "report": render_html(report, b""),
        "log": log,
        "notifications": "\n".join(t.alert.summary for t in raised),
        "slice": text(slice_table(build_view([WorkerAnswer("h", "http://h", doc)]))),
    }
    for name, shown in views.items():
        assert set(GROWTH.findall(shown)) == growth, (name, shown)
        said = set(LEFT.findall(shown))
        assert said <= left, (name, said, left)
        if name in ("status", "watch", "index page", "slice"):  # 'OOM in' columns
            cells = {t for t in left if re.search(rf"(?<![\d.]){re.escape(t)}\b", shown)}
            assert cells == left, (name, shown)
        if name not in ("watch", "slice"):  # no room for reasons there
            assert said == left, (name, shown)


def _status(doc: dict) -> str:
    console = Console(width=400, record=True, color_system=None)
    render_table(doc, console)
    return console.export_text()


def test_a_report_on_chips_without_verdicts_does_not_say_no_leak():
    """/report's title read "vm: no leak on 4 chips" while the chips warmed up or
    collected their first floors."""
    report = build_reports(columns("linear-leak", 0.5, 11), "trace", "test", 0.0)[0]
    verdicts = sorted(c.verdict for c in report.chips)
    assert set(verdicts) <= {"warming_up", "insufficient_data"}, verdicts
    title = re.search(r"<h1>(.*?)</h1>", render_html(report, b"")).group(1)
    assert "no leak" not in title, title
    assert title.startswith(f"tpumon report: {HOST}: 4 chips: "), title
    assert re.search(r"\d (warming up|collecting)", title), title
