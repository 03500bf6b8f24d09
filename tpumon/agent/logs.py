"""Logging to stderr in the form journald shows best.

Under systemd (JOURNAL_STREAM names our stderr) each line starts with a ``<N>`` syslog
priority, which journald turns into the entry's priority (so ``journalctl -p warning``
works) and it adds its own timestamps. On a terminal, lines carry a timestamp instead.

A message often quotes what a training process sent (its framework in a job's end, an
alert's summary): both formatters write its control characters as escapes
(:func:`~tpumon.common.untrusted_text.for_log`), so one event is one line and a name holding a
newline cannot forge another. A traceback, written after the message, keeps its lines.
"""

from __future__ import annotations

import logging
import os
import sys

from tpumon.common.untrusted_text import for_log

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


class OneLineFormatter(logging.Formatter):
    """A formatter whose message is one line whatever its arguments hold."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's
        record.message = for_log(record.message)
        return super().formatMessage(record)


class JournalFormatter(OneLineFormatter):
    """``<6>tpumon.agent.loop: message``: priority prefix, no timestamp (journald adds one)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prio = _PRIORITY.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines())


def stderr_is_journal() -> bool:
    """True when systemd connected our stderr to the journal (see systemd.exec(5))."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(level: str) -> None:
    """Configure the root logger once for the process (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(OneLineFormatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
