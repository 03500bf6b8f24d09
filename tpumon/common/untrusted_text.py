"""Text from training processes and network clients, made harmless for each place it goes.

A reporter's ``framework`` and ``fv`` (32 printable characters each), a process's name
from ``/proc`` (any bytes but NUL), tensor sites and devices from a snapshot, and the
summaries and reasons built from them are written by whoever runs a process on the VM.
Each sink reads some characters as commands: Slack's mrkdwn turns ``<!channel>`` into a
mention of everyone and ``<http://evil|click>`` into a disguised link; a terminal obeys
``ESC ] 0 ; ... BEL`` (retitle) and ``ESC [ 2 J`` (clear); Rich reads ``[link=...]`` as
markup; a newline in a log message forges a second log line. So text is escaped where it
is written, once, by the function of that sink, and kept as it came everywhere else (the
status document and the alert carry the raw text; JSON escapes what JSON needs itself):

- :func:`for_slack`: Slack's own escaping of ``&``, ``<`` and ``>`` (Slack's "Formatting
  text for app surfaces": escaped, they are never read as a mention, link or command).
- :func:`for_pagerduty`: the Events API v2 ``summary`` without control characters and
  at most 1024 characters (longer is refused with 400, and the whole page lost).
- :func:`for_terminal`: escape sequences and other control characters removed, then
  Rich markup escaped, for any string that Rich prints as markup (table cells,
  ``console.print``, ``Text.from_markup``).
- :func:`for_log`: control characters written as Python escapes (``\\n``, ``\\x1b``),
  so that one event is one line and an attack shows in the log instead of acting on it;
  applied by the log formatters of :mod:`tpumon.agent.logs` to every message.
- :func:`for_label`: a Prometheus label value without control characters (the text
  format escapes only ``\\``, ``"`` and newline; a raw ESC would reach whoever runs curl).

Sources may still refuse or trim what they take in (a report's framework must be
printable, a runtime's label keeps its printable characters): that is validation, which
bounds what is stored; no sink relies on it.

HTML needs no function here: the agent's landing page and the report page are rendered
by Jinja2 environments built with ``autoescape=True`` (tpumon/web/http.py,
tpumon/report/html.py), and no template marks a value ``|safe``.
"""

from __future__ import annotations

import re

#: Escape sequences as terminals read them (ECMA-48): CSI, the string commands (OSC, DCS,
#: SOS, PM, APC) up to their terminator (BEL or ST; an unterminated one runs to the end,
#: as a terminal would swallow it), and two-character escapes. Removed whole, so that no
#: "[31m" or "]0;title" is left behind.
_SEQUENCE = re.compile(r"""
      \x1b\[[0-?]*[\x20-/]*[@-~]             # CSI: ESC [ parameters intermediates final
    | \x1b[]PX^_].*?(?:\x07|\x1b\\|\Z)       # OSC DCS SOS PM APC, to BEL or ST
    | \x1b[\x20-/]*[0-~]                      # ESC, intermediates, final
""", re.VERBOSE | re.DOTALL)
#: C0, DEL and C1 control characters, and the bidirectional overrides and isolates
#: (U+202A-U+202E, U+2066-U+2069) that make a terminal show text in another order than
#: it is ("Trojan Source", CVE-2021-42574).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
PAGERDUTY_SUMMARY_MAX = 1024  # characters: the Events API v2 refuses a longer summary


def _strip(text: str) -> str:
    """The text without escape sequences or control characters."""
    return _CONTROL.sub("", _SEQUENCE.sub("", text))


def for_slack(text: str) -> str:
    """Text for a Slack message's ``text`` or a mrkdwn block: no mention, link or
    command can form in it (``<!channel>`` reads ``&lt;!channel&gt;``, shown literally)."""
    return _strip(text).translate(_SLACK)


def for_pagerduty(text: str, limit: int = PAGERDUTY_SUMMARY_MAX) -> str:
    """A PagerDuty summary: no control characters, at most ``limit`` characters (cut
    with an ellipsis, so a reader sees that it was cut)."""
    text = _strip(text)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def for_terminal(text: str) -> str:
    """Text for Rich markup: no escape sequence or control character reaches the terminal,
    and ``[bold]`` or ``[link=...]`` is printed as written, not obeyed. (Rich is imported
    here: only the commands print to a terminal, and the agent never loads it.)"""
    from rich.markup import escape

    return escape(_strip(text))


def _visible(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def for_log(text: str) -> str:
    """A log message on one line: each control character written as its Python escape
    (newline as ``\\n``, ESC as ``\\x1b``), so the log shows what was sent and obeys none of
    it. (A backslash is left as it is: the text stays readable, and a forged ``\\n`` is
    still on the one line.)"""
    return _CONTROL.sub(_visible, text)


def for_label(text: str) -> str:
    """A Prometheus label value: no control character (escape sequences removed whole)."""
    return _strip(text)
