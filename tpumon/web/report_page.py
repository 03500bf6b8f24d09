"""/report on the agent's endpoint: the `tpumon report` HTML of this host's stored history,
so a Slack message or a PagerDuty incident can link the picture of the leak.

The report is drawn by a `tpumon report` child process reading the history store (SQLite
lets it read while the agent writes): matplotlib never enters the agent's memory, and a slow
drawing never holds a scrape thread's lock. A page drawn is kept a minute, so a link clicked
by a whole on-call channel draws once.

No request ever waits for another's drawing: one draws (a lock taken without blocking), and
the others are answered at once with the last page drawn, or 503 with Retry-After when
there is none yet. A failed drawing's answer is kept too, so that a broken store is not
drawn again for every click. Requests waiting on the lock would each hold one of the HTTP
server's 64 connection slots, and a hundred at the cache's expiry would leave Prometheus'
scrapes unanswered (docs/security.md).
Nothing of tpumon.report is imported here: the agent never loads it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

CACHE_SECONDS = 60.0  # a page this young is served as it is, not drawn again
# While the next page is drawn, the last one is served up to this age: a slightly old
# picture at once beats a wait that holds a connection slot.
STALE_SECONDS = 3600.0
FAILURE_SECONDS = 10.0  # a failed drawing's answer is served this long, not drawn again
RETRY_SECONDS = 5  # Retry-After while the first page is drawn (a drawing takes seconds)
TIMEOUT_SECONDS = 120.0


class Answer(NamedTuple):
    """What /report answers: an HTTP status, the body, and for a 503 the seconds after
    which asking again may get a page (the Retry-After header)."""

    status: str
    body: bytes
    retry_after: int = 0


class ReportPage:
    """Draws and keeps the host's report; ``__call__`` answers at once unless this request
    is the one drawing."""

    def __init__(self, state_dir: Path, host: str, since: str = "7d", worker: str = "") -> None:
        self.state_dir = state_dir
        self.host = host
        self.worker = worker  # the agent's, shown as every other view shows it
        self.since = since
        self._drawing = threading.Lock()
        # Each replaced whole (never changed in place), so reading one needs no lock.
        self._page: tuple[float, bytes] | None = None  # when drawn, the HTML
        self._failure: tuple[float, str] | None = None  # when it failed, why

    def __call__(self) -> Answer:
        kept = self._kept()
        if kept is not None:
            return kept
        if not self._drawing.acquire(blocking=False):
            return self._while_drawing()
        try:
            return self._kept() or self._draw_and_keep()  # one drawn while we looked
        finally:
            self._drawing.release()

    def _kept(self) -> Answer | None:
        """A recent failure's answer, or a page drawn within CACHE_SECONDS."""
        now, page, failure = time.monotonic(), self._page, self._failure
        if failure is not None and now - failure[0] < FAILURE_SECONDS:
            left = math.ceil(FAILURE_SECONDS - (now - failure[0]))
            return Answer("503 Service Unavailable", f"{failure[1]}\n".encode(), left)
        if page is not None and now - page[0] < CACHE_SECONDS:
            return Answer("200 OK", page[1])
        return None

    def _while_drawing(self) -> Answer:
        """The last page if it is not too old, else 503: never a wait for the drawing."""
        page = self._page
        if page is not None and time.monotonic() - page[0] < STALE_SECONDS:
            return Answer("200 OK", page[1])
        return Answer("503 Service Unavailable",
                      b"The report is being drawn; try again in a few seconds.\n",
                      RETRY_SECONDS)

    def _draw_and_keep(self) -> Answer:
        try:
            body = self._draw()
        except RuntimeError as exc:
            self._failure = (time.monotonic(), str(exc))
            return Answer("503 Service Unavailable", f"{exc}\n".encode(),
                          math.ceil(FAILURE_SECONDS))
        self._page, self._failure = (time.monotonic(), body), None
        return Answer("200 OK", body)

    def _draw(self) -> bytes:
        with tempfile.TemporaryDirectory(prefix="tpumon-report-") as out:
            env = {**os.environ, "MPLCONFIGDIR": out}  # no home directory under systemd
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "tpumon", "report", "--state-dir",
                     str(self.state_dir), "--host", self.host, "--since", self.since,
                     *(["--worker", self.worker] if self.worker else []),
                     "-o", out], capture_output=True, text=True, env=env,
                    timeout=TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the report took over {TIMEOUT_SECONDS:.0f} s") from None
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines() or ["tpumon report failed"]
                raise RuntimeError(lines[-1])
            pages = list(Path(out).glob("*.html"))  # one host asked, one page
            if len(pages) != 1:
                raise RuntimeError(f"tpumon report wrote {len(pages)} pages for one host")
            return pages[0].read_bytes()
