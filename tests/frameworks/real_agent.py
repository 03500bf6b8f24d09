"""`tpumon agent` on this CPU machine for the framework tests: reporter socket on, history
store off (no TPU here: its runtime source reports "down", which is a normal state)."""

import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tools import clean_env, free_port, wait_for


@contextmanager
def real_agent(tmp_path: Path, poll_interval: float = 0.2,
               **env: str) -> Iterator[tuple[str, Path, Path]]:
    """(its URL, the reporter socket, its log); ``env``: more of its settings. Stopped with
    SIGTERM at the end, which it must survive cleanly, without a traceback in its log."""
    socket_path = tmp_path / "reporter.sock"
    full_env = clean_env()
    full_env.update(TPUMON_REPORTER_SOCKET=str(socket_path), TPUMON_STORE_STATE_DIR="", **env)
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tpumon", "agent", "--listen-address",
                                 "127.0.0.1:0", "--poll-interval", str(poll_interval),
                                 "--runtime-ports", str(free_port())], stderr=log,
                                env=full_env)
    try:
        url = wait_for(lambda: re.search(r"serving metrics on (http://\S+)/metrics",
                                         log_path.read_text()), 60).group(1)
        yield url, socket_path, log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert "Traceback" not in log_path.read_text()
