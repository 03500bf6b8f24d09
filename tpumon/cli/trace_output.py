"""A trace as the client commands write it (``export``, ``sim --write-trace``): its format
from the output's name, and the file written whole or not at all. A leaf module: no command
module imports another."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Iterable

import click

from tpumon.trace.schema import TraceRow
from tpumon.trace.write import write_trace

WRITABLE = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}  # suffix -> format


def output_format(output: str, asked: str | None = None, *, can_ask: bool = True) -> str:
    """The trace format for an output file: ``asked`` (``--format``), else from its suffix.
    A suffix the commands cannot write needs ``--format``, and one they can must agree
    with it: CSV was once written into x.parquet, which ``analyze`` then read as Parquet.
    ``analyze`` reads a name of any other suffix as CSV, so only CSV gets such a name
    (or a device or FIFO, which nothing reads back by name). ``can_ask``: the command has a
    ``--format`` (the error says to use it)."""
    suffix = Path(output).suffix.lower()
    named = WRITABLE.get(suffix)
    if output == "-":
        return asked or "csv"
    if asked is None:
        if named is None:
            raise click.ClickException(
                f"{output}: cannot write {suffix or 'a file without a suffix'}; give a name "
                f"ending {' or '.join(WRITABLE)}, or '-'{', or say --format' if can_ask else ''}")
        return named
    if named is not None and asked != named:
        raise click.ClickException(f"{output}: --format {asked}, but the name says {named}; "
                                   "give a name that agrees (it is how analyze reads it)")
    if named is None and asked != "csv" and not _written_through(output):
        raise click.ClickException(f"{output}: analyze would read it as CSV; give a {asked} "
                                   f"trace a name ending .{asked}")
    return asked


def write_whole(rows: Iterable[TraceRow], output: str, fmt: str) -> int:
    """Write beside ``output`` and rename over it when complete: an error half-way leaves
    an existing file as it was (its mode and, as root, its owner kept). Only a regular file
    (or a new one) is renamed over, at the end of its symlinks: a rename over /dev/null or
    a FIFO put a file in its place (``export --format csv -o /dev/null`` as root left every
    program on the machine writing to a file), and one over a symlink replaced the link."""
    if output == "-" or _written_through(output):
        return _write_through(rows, output, fmt)
    target = os.path.realpath(output) if os.path.islink(output) else output
    existing = _existing(target)
    partial = f"{target}.partial"
    try:
        count = write_trace(rows, partial, fmt)
        if existing is not None:
            _keep_owner_and_mode(partial, existing)
        os.replace(partial, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    return count


def _write_through(rows: Iterable[TraceRow], output: str, fmt: str) -> int:
    """Stdout, a device, a FIFO, or the file stdout or stderr is, written as it is: text
    appended (``-o /dev/stdout >> log`` keeps the log; opened for writing, the file a
    shell appends to was truncated). Its reader may leave early (``| head``: it has what
    it wanted): then exit 1 quietly, not with an error line about a broken pipe."""
    if output == "-" and sys.stdout is None:
        raise click.ClickException("stdout is closed; give -o FILE")
    if fmt == "parquet" and output != "-" and not stat.S_ISCHR(_mode(output)):
        raise click.ClickException(f"{output}: Parquet is written to a file of its own (it "
                                   "seeks, and is whole only at its end); give a file, or "
                                   "--format csv or jsonl")
    try:
        if output == "-" or fmt == "parquet":
            return write_trace(rows, output, fmt)
        with open(output, "a", encoding="utf-8", newline="") as f:
            return write_trace(rows, f, fmt)
    except BrokenPipeError:
        if output == "-":  # the interpreter's own flush at exit would fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def _written_through(path: str) -> bool:
    """Not a file to rename over: a device, a FIFO or a socket; anything under /dev or
    /proc (/dev/stdout is the caller's stdout, perhaps a file a shell appends to); the
    file that stdout or stderr is."""
    if os.path.abspath(path).startswith(("/dev/", "/proc/")):
        return True
    try:
        st = os.stat(path)
    except OSError:
        return False  # not there: a new file; or a link loop, which the rename then names
    if not stat.S_ISREG(st.st_mode):
        return True
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.path.samestat(st, os.fstat(fd)):
                return True
    return False


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def _existing(path: str) -> os.stat_result | None:
    """The file the rename will replace; None if there is none (a link loop raises)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _keep_owner_and_mode(path: str, was: os.stat_result) -> None:
    """The new file takes the old one's mode, and, where this process may give it, its
    owner: an export over another user's 0600 trace must not leave it root's and 0644."""
    os.chmod(path, stat.S_IMODE(was.st_mode))
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.chown(path, was.st_uid, was.st_gid)
