"""/report on the agent's endpoint: the `tpumon report` HTML of this host's stored history,
so a Slack message or a PagerDuty incident can link the picture of the leak.

The report is drawn by a `tpumon report` child process reading the history store (SQLite
lets it read while the agent writes): matplotlib never enters the agent's memory, a slow
drawing never holds a scrape thread's lock for long, and one request at a time is served,
the result kept for a minute, so a link clicked by a whole on-call channel draws once.
Nothing of tpumon.report is imported here: the agent never loads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CACHE_SECONDS = 60.0
TIMEOUT_SECONDS = 120.0


class ReportPage:
    """Draws and caches the host's report; ``__call__`` gives (HTTP status, body)."""

    def __init__(self, state_dir: Path, host: str, since: str = "7d") -> None:
        self.state_dir = state_dir
        self.host = host
        self.since = since
        self._lock = threading.Lock()
        self._cached: tuple[float, bytes] | None = None

    def __call__(self) -> tuple[str, bytes]:
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < CACHE_SECONDS:
                return "200 OK", self._cached[1]
            try:
                body = self._draw()
            except RuntimeError as exc:
                return "503 Service Unavailable", f"{exc}\n".encode()
            self._cached = (time.monotonic(), body)
            return "200 OK", body

    def _draw(self) -> bytes:
        with tempfile.TemporaryDirectory(prefix="tpumon-report-") as out:
            env = {**os.environ, "MPLCONFIGDIR": out}  # no home directory under systemd
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "tpumon", "report", "--state-dir",
                     str(self.state_dir), "--host", self.host, "--since", self.since,
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
