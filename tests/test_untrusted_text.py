"""Text that training processes and network clients wrote, at each sink (issue 42,
"Escaping at every sink"): each sink's function of tpumon.common.untrusted_text alone, then the
sinks that use it (Slack and PagerDuty bodies, `tpumon status` and `watch` screens,
Prometheus labels, log lines, HTML pages). tests/test_untrusted_text_agent.py takes the
same attacks through the real agent and commands."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from tpumon.cli import status as status_cli
from tpumon.cli import watch
from tpumon.agent.logs import setup_logging
from tpumon.notify.alerts import Alert
from tpumon.notify.outbox import Event
from tpumon.notify.pagerduty import PagerDutyChannel
from tpumon.notify.slack import SlackChannel
from tpumon.common.untrusted_text import (PAGERDUTY_SUMMARY_MAX, for_label, for_log, for_pagerduty,
                                          for_slack, for_terminal)

MENTIONS = "<!channel> <http://evil|click>"  # 30 characters: a report's framework may be 32
TITLE_AND_RED = "\x1b]0;pwn\x07\x1b[31m"  # retitle the terminal, then paint it red
C1 = "\x9b2J\x85\x9d"  # CSI, NEL and OSC as single 8-bit characters


# -- each sink's function --------------------------------------------------------------

def test_slack_text_holds_no_mention_link_or_command():
    assert for_slack("<!channel> <!here> <@U123> <http://evil|click> & co") == (
        "&lt;!channel&gt; &lt;!here&gt; &lt;@U123&gt; &lt;http://evil|click&gt; &amp; co")
    assert for_slack("a\nb\x1b[2Jc\x85") == "abc"  # no line of its own, no control
    assert for_slack("&amp;") == "&amp;amp;"  # what was sent is what is shown


def test_pagerduty_summary_is_capped_and_without_control_characters():
    assert for_pagerduty("ok\x00\x1b[2J\r\ntext") == "oktext"
    short = "x" * PAGERDUTY_SUMMARY_MAX
    assert for_pagerduty(short) == short
    cut = for_pagerduty("y" * 5000)
    assert len(cut) == PAGERDUTY_SUMMARY_MAX == 1024 and cut.endswith("\u2026")
    assert len(for_pagerduty("z" * 100, limit=10)) == 10


@pytest.mark.parametrize("raw, plain", [
    (TITLE_AND_RED + "python3", "python3"),            # OSC to BEL, then CSI: gone whole
    ("\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\", "click"),  # a hyperlink, ST-terminated
    ("a\x1bcb", "ab"),                                 # ESC c: reset the terminal
    ("a\x1b[?1049hb", "ab"),                           # alternate screen
    ("a" + C1 + "b", "a2Jb"),                          # C1 controls: the characters go
    ("tab\there\x7f", "tabhere"),                      # C0 and DEL
    ("ab\u202ec\u2066d", "abcd"),                      # bidi override and isolate
    ("a\x1b]0;never terminated", "a"),                 # swallowed, as a terminal would
])
def test_terminal_text_loses_every_escape_sequence_and_control(raw, plain):
    assert for_terminal(raw) == plain


def test_terminal_text_shows_rich_markup_as_written():
    text = "[bold]x[/bold] [link=http://evil]y[/link]"
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(for_terminal(text), highlight=False)
    out = console.file.getvalue()
    assert text in out and "\x1b]8;" not in out and "\x1b[1m" not in out


def test_a_log_message_is_one_line_showing_what_was_sent():
    assert for_log("a\nb") == "a\\nb"
    assert for_log("x" + TITLE_AND_RED) == "x\\x1b]0;pwn\\x07\\x1b[31m"
    assert for_log("c1\x85\x9b") == "c1\\x85\\x9b"
    assert for_log("plain text, 100 % [ok] <tag> & \\n") == "plain text, 100 % [ok] <tag> & \\n"


def test_a_prometheus_label_has_no_control_characters():
    assert for_label("py\nthon\x1b[2J\x00\x9b") == "python"
    assert for_label("f32[4,8]@TPU_0") == "f32[4,8]@TPU_0"


# -- the sinks that use them -----------------------------------------------------------

def alert(summary: str, **details: object) -> Alert:
    return Alert(name="TPUMonTrainingStalled", severity="warning", key="tpumon/h/x/pid1",
                 host="h", worker="0", slice="", accelerator_type="v4-8", subject="pid 1",
                 summary=summary, details=details,
                 dashboard="https://grafana.example/d/x?var-host=h", raised=1000.0)


def event(a: Alert, action: str = "trigger") -> Event:
    return Event(1, "slack", action, a, 1000.0, 1000.0, 0)


def test_slack_messages_carry_no_mention_or_link_from_a_process():
    a = alert(f"training process 1 ({MENTIONS}) stuck at step 3",
              tensors="+1 f32[] per step, created at <!here>", cause_text="<http://x|y>")
    [(_, body)] = SlackChannel("http://slack", ("warning",)).requests([event(a)])
    texts = [body["text"], *(b["text"]["text"] for b in body["blocks"])]
    for text in texts:
        assert "<!" not in text and "<http://evil" not in text and "<http://x" not in text
        assert "&lt;!channel&gt; &lt;http://evil|click&gt;" in text
        assert "&lt;!here&gt;" in text
        assert "<https://grafana.example/d/x?var-host=h|Dashboard>" in text  # ours: a link
    assert all(b["text"]["type"] == "mrkdwn" for b in body["blocks"])


def test_a_pagerduty_summary_is_capped_whatever_the_tensors_say():
    a = alert(f"training process 1 ({MENTIONS}) stuck", tensors="t\x1b[2J" * 1000)
    body = PagerDutyChannel("http://pd", "KEY", ("warning",)).body(event(a))
    summary = body["payload"]["summary"]
    assert len(summary) == 1024 and "\x1b" not in summary and summary.endswith("\u2026")
    assert MENTIONS in summary  # PagerDuty shows text as text: nothing to escape


def status_doc(owner: str, framework: str, summary: str) -> dict:
    """A status document as an agent serves it, its process-written fields hostile."""
    chip = {"chip": "0", "up": True, "hbm_used_bytes": 2**30, "hbm_total_bytes": 2**35,
            "hbm_used_ratio": 2**30 / 2**35, "duty_cycle": 0.5, "owner_pid": 4242,
            "owner_process": owner, "owner_rss_bytes": 2**28, "step": 3,
            "reporting_pid": 4242, "cause": "retained_tensors", "diagnosis": summary,
            "verdict": "ok", "reason": summary, "floor_bytes": 2**30,
            "growth_bytes_per_hour": None, "growth_bytes_per_step": None,
            "predicted_oom_time": None, "predicted_oom_step": None,
            "evidence_window_seconds": 60}
    process = {"pid": 4242, "uid": 1000, "framework": framework, "rank": 0, "step": 3,
               "steps_per_second": 1.0, "live_tensors": 5, "live_tensors_per_step": None,
               "verdict": "ok", "compiles_cached": 1, "compiles_uncached": 1,
               "recompiling": False, "rss_bytes": 2**28, "rss_growth_bytes_per_step": None,
               "host_verdict": "ok", "host_oom_seconds": None, "exited": False,
               "framework_version": framework, "devices": {}, "cause": None,
               "diagnosis": summary,
               "tensor_snapshot": {"request_id": 1, "reason": summary, "steps": 10,
                                   "requested": 1.0, "completed": None, "pending": False,
                                   "error": summary, "from_step": None, "to_step": None,
                                   "summary": None, "explained_fraction": None, "grown": []}}
    return {"version": "0", "source": "agent", "time": 1000.0, "wall_time": 1000.0,
            "polls_total": 1, "identity": {"host": "h"}, "chip_type": "v4",
            "sources": {"tpu_runtime": {"up": False, "error": summary}},
            "runtime_ports": {}, "chips": [chip], "host": None, "processes": [process],
            "notifications": {"active_alerts": [{"name": "TPUMonTrainingStalled",
                                                 "severity": "warning", "summary": summary,
                                                 "raised": 1000.0}],
                              "channels": [{"name": "slack", "up": False, "pending": 0,
                                            "delivered_total": 0, "last_error": summary,
                                            "last_delivery": None, "given_up_total": 0}]},
            "job_ends": [{"time": 1000.0, "summary": summary}], "store": None}


HOSTILE = status_doc(owner=TITLE_AND_RED + "pyth\x9b2Jon", framework="[link=http://e]x[/link]",
                     summary=f"pid 4242 ([bold]jax[/bold]) {TITLE_AND_RED}ended")


def rendered(draw) -> str:
    """What a colour terminal gets: Rich's own styling is there, so look for the attack's."""
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      width=200)
    draw(console)
    return console.file.getvalue()


def assert_nothing_obeyed(out: str) -> None:
    assert "\x07" not in out and "\x1b]" not in out and "\x9b" not in out, repr(out)
    assert "pwn" not in out and "\x1b[31m" not in out and "\x1b[2J" not in out
    assert not re.search("\x1b\\[[0-9;]*m(jax|x)\x1b", out)  # no markup made a style


def test_status_prints_no_escape_sequence_and_no_markup_from_a_process():
    out = rendered(lambda c: status_cli.render_table(HOSTILE, c))
    assert_nothing_obeyed(out)
    plain = re.sub("\x1b\\[[0-9;]*m", "", out)  # Rich's own styles out
    assert "4242 pyth2Jon 256" in plain and "[link=http://e]x[/link]" in plain
    assert "pid 4242 ([bold]jax[/bold]) ended" in plain


def test_watch_prints_no_escape_sequence_and_no_markup_from_a_process():
    out = rendered(lambda c: c.print(watch.screen(HOSTILE, "http://agent", width=200)))
    assert_nothing_obeyed(out)
    plain = re.sub("\x1b\\[[0-9;]*m", "", out)
    assert "[link=http://e]x[/link]" in plain and "pid 4242 ([bold]jax[/bold]) ended" in plain


def test_prometheus_labels_hold_no_control_character():
    from prometheus_client import CollectorRegistry, generate_latest

    from tpumon.metrics.collectors import ChipCollector

    snap = SimpleNamespace(
        runtime=None, owners={"0": 4242}, chips=lambda: ["0"], chip_steps={},
        host=SimpleNamespace(processes=[SimpleNamespace(pid=4242, name=TITLE_AND_RED + "py\n")]),
        inventory=SimpleNamespace(devices=["0"]), identity=SimpleNamespace(
            labels=lambda: {"host": "h", "worker": "", "accelerator_type": "", "slice": ""}))
    registry = CollectorRegistry()
    registry.register(ChipCollector(lambda: snap))
    text = generate_latest(registry).decode()
    assert 'process="py"' in text and "\x1b" not in text and "\x07" not in text


def test_every_log_line_is_one_line(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("info")
    try:
        logging.getLogger("tpumon.x").warning("training job pid %d (%s) ended", 7,
                                              "jax\n<4>forged line" + TITLE_AND_RED)
    finally:
        logging.getLogger().handlers[:] = []
    [line] = stream.getvalue().splitlines()
    assert line.endswith("training job pid 7 (jax\\n<4>forged line\\x1b]0;pwn\\x07\\x1b[31m) "
                         "ended")


def test_html_pages_escape_what_processes_wrote():
    """No function of its own: both page environments autoescape, and no template opts
    out."""
    from tpumon.web.http import _templates
    from tpumon.report.html import _TEMPLATES

    for env in (_templates(), _TEMPLATES):
        assert env.autoescape is True
        assert env.from_string("{{ x }}").render(x="<script>&") == "&lt;script&gt;&amp;"
    root = Path(__file__).resolve().parent.parent / "tpumon"
    for template in [*root.glob("web/templates/*"), *root.glob("report/templates/*")]:
        text = template.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text
