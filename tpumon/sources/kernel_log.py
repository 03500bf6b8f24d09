"""Processes the kernel killed for memory, read from its log (/dev/kmsg).

A training job that runs the host out of memory dies of the kernel's OOM killer with no
message of its own: SIGKILL, nothing in its log, often nothing in the scheduler's. The
kernel says it, once, in its ring buffer: ``oom-kill:...,task=python3,pid=23613,uid=0`` and
``Out of memory: Killed process 23613 (python3)`` (or ``Memory cgroup out of memory: ...``
under a cgroup limit, the usual case in containers). The agent reads new records each
poll, without blocking, from where the log stood when it started, and keeps the pids
killed in the last hour, so that a job's end can be named ``host_oom`` on the kernel's
word rather than guessed.

Reading /dev/kmsg needs root or CAP_SYSLOG where ``kernel.dmesg_restrict`` is 1 (the
default on Debian and Ubuntu); without it the source reports itself down once and the
cause of an end falls back to what memory showed.
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass
from typing import Callable

KMSG = "/dev/kmsg"
KEEP_SECONDS = 3600.0
MAX_RECORD = 8192  # /dev/kmsg gives one record a read; a smaller buffer is EINVAL
_KILLED = re.compile(r"(?:oom-kill:.*[,:]pid=(\d+)|Killed process (\d+) )")


@dataclass(frozen=True)
class OomKill:
    """A process the kernel killed for memory, when the agent read it."""

    pid: int
    time: float
    line: str


class KernelLog:
    """New OOM kills from the kernel's log since the last call."""

    def __init__(self, path: str = KMSG, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._fd: int | None = None
        self.kills: dict[int, OomKill] = {}

    def poll(self) -> dict[int, OomKill]:
        """Pids killed for memory in the last hour (raises OSError when the log cannot
        be read: the health tracker turns that into a reported state)."""
        if self._fd is None:
            self._fd = self._open()
        now = self._clock()
        for line in self._records():
            found = _KILLED.search(line)
            if found:
                pid = int(found.group(1) or found.group(2))
                if pid not in self.kills or found.group(2):  # "Killed process" reads best
                    self.kills[pid] = OomKill(pid, now, _short(line))
        self.kills = {p: k for p, k in self.kills.items() if now - k.time <= KEEP_SECONDS}
        return dict(self.kills)

    def _open(self) -> int:
        fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what happens from now on
        except OSError:
            pass  # a plain file or a FIFO (tests): read it from where it is
        return fd

    def _records(self) -> list[str]:
        out: list[str] = []
        fd = self._fd
        assert fd is not None
        while True:
            try:
                data = os.read(fd, MAX_RECORD)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                raise
            if not data:
                return out
            out.extend(_messages(data.decode("utf-8", "replace")))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _short(line: str) -> str:
    """"Memory cgroup out of memory: Killed process 23613 (python3)": the rest of the
    line (sizes) is in the kernel's log for whoever needs it."""
    line = line.strip()
    found = re.search(r"^(.*Killed process \d+ \([^)]*\))", line)
    return found.group(1) if found else line[:200]


def _messages(text: str) -> list[str]:
    """The message of each record: /dev/kmsg's are "prio,seq,usec,flags;message"."""
    return [line.split(";", 1)[1] if ";" in line.split(" ", 1)[0] else line
            for line in text.splitlines() if line and not line.startswith(" ")]
