"""A training process's last words: what it said as it ended, sent to the agent.

The exception that killed a job is the most precise thing it ever says about its memory
(XLA's out-of-memory report names the largest allocations and their source lines), and
it is lost to anyone who did not keep the job's stderr. A reporter therefore chains onto
the process's ends (never replacing what is there: the hooks it found still run, after
it):

- ``sys.excepthook``: an uncaught exception in the main thread;
- ``threading.excepthook``: an uncaught exception in another thread (SystemExit is not one);
- ``atexit``: the interpreter's normal end; the exit status is known only after an
  uncaught exception (1): Python gives exit handlers no status;
- ``faulthandler``: a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) from native
  code. Nothing in Python runs after one, so the traceback is written into a pipe whose
  read end the agent holds (passed over the reporter's connection, ``SCM_RIGHTS``); the
  agent reads it when the connection closes, that is when the process is gone. Left
  alone when the process enabled faulthandler itself (it writes where that asked).

Each capture is one message on the reporter's own connection (or datagram), at most
``MAX_LAST_WORDS`` bytes, sent without blocking; at the end (an uncaught exception, the
exit) a queue that is full is retried for at most ``EXIT_WAIT`` seconds in all, a
worker thread's exception is not waited for. Nothing here raises into the process.

A process killed by SIGKILL (the kernel's OOM killer, a preemption) or ended by
``os._exit`` runs none of this: it has no last words, and the agent says so.
"""

from __future__ import annotations

import array
import atexit
import faulthandler
import json
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from types import TracebackType
from typing import Any

from tpumon.instrument.protocol import FATAL_HEADER, LAST_WORDS_HEADER, MAX_LAST_WORDS

#: Seconds the process's end may wait in all (the exception's message and the exit's
#: together) for room in a full queue: with the last send and the interpreter's own
#: teardown, the exit stays within ~100 ms of what it takes without (bench/reporters.py).
EXIT_WAIT = 0.09
MESSAGE_CHARS = 32768  # an exception's message (XLA's OOM report with its table: ~10 KiB)
TRACEBACK_CHARS = 16384  # the formatted traceback, its innermost end kept
_LIBRARIES = tuple(os.path.join(p, "") for p in {
    sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p)
_HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


class LastWords:
    """Chains onto the process's ends for one reporter. ``sender`` is its
    :class:`~tpumon.instrument.transport.ReportSender`: each capture is one message on it,
    and its connection (``on_connect``) is where the fatal-signal pipe is handed over."""

    def __init__(self, sender: Any) -> None:
        self._sender = sender
        self._pid = os.getpid()
        self._failed = False  # an uncaught exception in the main thread: exit status 1
        self._installed = False
        self._previous_hook: Any = None
        self._previous_thread_hook: Any = None
        self._pipe: tuple[int, int] | None = None  # (read end, write end) of faulthandler's
        self._wait_left = EXIT_WAIT  # what the end may still wait for a full queue

    def install(self) -> None:
        """Chain onto sys.excepthook, threading.excepthook and atexit, and give
        faulthandler a pipe to the agent (unless the process set faulthandler up itself)."""
        if self._installed:
            return
        self._installed = True
        self._previous_hook, sys.excepthook = sys.excepthook, self._excepthook
        self._previous_thread_hook, threading.excepthook = threading.excepthook, \
            self._thread_hook
        atexit.register(self._at_exit)
        self._arm_faulthandler()
        if self._pipe is not None:
            os.register_at_fork(after_in_child=self._in_forked_child)
        self._send(_encode({"kind": "armed", "fatal": self._pipe is not None}), wait=False)

    def uninstall(self) -> None:
        """Undo :meth:`install`, where nothing chained on after us (a hook installed after
        ours, calling ours, stays; ours then passes straight through)."""
        if not self._installed:
            return
        self._installed = False
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._previous_thread_hook
        atexit.unregister(self._at_exit)
        if self._pipe is not None:
            faulthandler.disable()
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def _in_forked_child(self) -> None:
        """A forked child (a data loader's worker) is not the job: its fatal signal must
        not reach the job's pipe, so faulthandler is off in it, as before the reporter."""
        if self._pipe is not None and os.getpid() != self._pid:
            try:
                faulthandler.disable()
                for fd in self._pipe:
                    os.close(fd)
            except OSError:
                pass
            self._pipe = None

    def on_connect(self, sock: socket.socket) -> None:
        """A new connection to the agent: hand it the read end of faulthandler's pipe."""
        if self._pipe is None:
            return
        try:
            sock.sendmsg([FATAL_HEADER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                           array.array("i", [self._pipe[0]]))],
                           socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except OSError:
            pass

    def _arm_faulthandler(self) -> None:
        if faulthandler.is_enabled():
            return  # the process's own choice (PYTHONFAULTHANDLER, -X faulthandler)
        try:
            read, write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # never blocks the handler
        except OSError:
            return
        try:
            faulthandler.enable(file=write, all_threads=True)
        except (OSError, RuntimeError, ValueError):
            os.close(read)
            os.close(write)
            return
        self._pipe = (read, write)
        connection = getattr(self._sender, "connection", None)
        if connection is not None:
            self.on_connect(connection)

    def _excepthook(self, kind: type[BaseException], value: BaseException,
                    tb: TracebackType | None) -> None:
        if self._installed and os.getpid() == self._pid:
            try:
                self._failed = True
                self._send(_encode(describe(kind, value, tb, "exception")))
            except Exception:  # noqa: BLE001 - the user's hook must run whatever happens
                pass
        self._previous_hook(kind, value, tb)

    def _thread_hook(self, args: Any) -> None:
        if self._installed and os.getpid() == self._pid and args.exc_type is not SystemExit:
            try:
                name = getattr(args.thread, "name", None)
                self._send(_encode(describe(args.exc_type, args.exc_value, args.exc_traceback,
                                            "thread_exception", thread=name)), wait=False)
            except Exception:  # noqa: BLE001
                pass
        self._previous_thread_hook(args)

    def _at_exit(self) -> None:
        if not self._installed or os.getpid() != self._pid:
            return  # a forked child's exit is not the job's
        try:
            self._send(_encode({"kind": "exit", "status": 1 if self._failed else None}))
        except Exception:  # noqa: BLE001
            pass

    def _send(self, payload: bytes, wait: bool = True) -> None:
        """Send now; while a connection's queue is full and ``wait``, retry within what is
        left of EXIT_WAIT (shared by every message of the end)."""
        started = time.monotonic()
        deadline = started + (self._wait_left if wait else 0.0)
        try:
            while not self._sender.send(payload, count=False):
                left = deadline - time.monotonic()
                if not self._sender.connected or left <= 0:
                    return
                time.sleep(min(0.005, left))
        finally:
            if wait:
                self._wait_left = max(0.0, self._wait_left - (time.monotonic() - started))


def describe(kind: type[BaseException], value: BaseException | None,
             tb: TracebackType | None, what: str, thread: str | None = None) -> dict[str, Any]:
    """An exception as the agent takes it: type, message, the innermost frame of the
    user's code (not the standard library's, a framework's or tpumon's), the traceback."""
    name = getattr(kind, "__qualname__", str(kind))
    module = getattr(kind, "__module__", "builtins")
    frames = traceback.extract_tb(tb) if tb is not None else []
    user = next((f for f in reversed(frames) if _users(f.filename)),
                frames[-1] if frames else None)
    try:
        text = "".join(traceback.format_exception(kind, value, tb))
    except Exception:  # noqa: BLE001 - an exception that cannot be formatted still counts
        text = ""
    return {
        "kind": what, "thread": thread,
        "type": name if module in ("builtins", "__main__") else f"{module}.{name}",
        "message": _text(value)[:MESSAGE_CHARS],
        "frame": None if user is None else {
            "file": user.filename, "line": user.lineno, "function": user.name,
            "code": (user.line or "")[:200]},
        "traceback": text[-TRACEBACK_CHARS:],
    }


def _text(value: object) -> str:
    """An exception's message; a ``__str__`` that raises gives a placeholder."""
    if value is None:
        return ""
    try:
        return str(value)
    except Exception:  # noqa: BLE001
        return "<the exception's message could not be read>"


def _users(filename: str) -> bool:
    """Whether a frame is the user's code: not the interpreter's, a library's or ours."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return not path.startswith("<") and not path.startswith(_LIBRARIES) and \
        not path.startswith(_HERE) and "/site-packages/" not in path and \
        "/dist-packages/" not in path


def _encode(words: dict[str, Any]) -> bytes:
    """One message of at most MAX_LAST_WORDS bytes: the long texts cut until it fits."""
    words["time"] = time.time()
    room = MAX_LAST_WORDS - len(LAST_WORDS_HEADER)
    while True:
        body = json.dumps(words, separators=(",", ":")).encode()
        if len(body) <= room:
            return LAST_WORDS_HEADER + body
        if words.get("traceback"):  # its innermost end is the part that matters
            words["traceback"] = words["traceback"][len(words["traceback"]) // 2 + 1:]
        elif words.get("message"):
            words["message"] = words["message"][:len(words["message"]) // 2]
        else:
            return LAST_WORDS_HEADER + json.dumps({"kind": words["kind"]}).encode()
