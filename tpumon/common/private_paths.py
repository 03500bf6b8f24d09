"""Directories and files no other user can redirect.

The agent usually runs as root or as its own user, and writes its databases and binds its
sockets where the configuration says. A directory another user owns, or may write to, lets
that user put a symbolic link where the agent is about to write: root would then create
``history.db`` and ``outbox.db`` in a directory of the user's choosing, and the socket's
``chmod`` would make a root-only file world-writable. So a state or socket directory must
be the agent's user's or root's, writable by no one else, and not itself a link; the
databases are created without following a link, and the socket's mode is set on its
descriptor, never through its path.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from tpumon.common.config import ConfigError


def private_dir(path: str | os.PathLike[str], key: str, mode: int) -> None:
    """Create ``path`` (``mode``, whatever the umask) if it is missing, then refuse it,
    naming ``key``, when another user could redirect what the agent writes there. A
    directory that cannot be created is left to its user to report (the store retries)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, mode)
        _set_mode(path, mode)
    except FileExistsError:
        pass
    except OSError:
        return
    problem = _unsafe(path)
    if problem:
        raise ConfigError(f"{key}: {path} {problem}; refusing it, as another user could "
                          "redirect the agent's files there")


def _set_mode(path: Path, mode: int) -> None:
    """The mode of a directory just made, through a descriptor (never a link's target)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _unsafe(path: Path) -> str:
    """Why ``path`` is no private directory of the agent's; '' when it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}, neither the agent's user ({os.geteuid()}) nor root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"may be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def create_no_follow(path: str | os.PathLike[str], mode: int = 0o644) -> None:
    """Create ``path`` if it is missing, refusing (OSError, ELOOP) a symbolic link in its
    place: what SQLite then opens by name is this file, not a link's target. 0644 is the
    mode SQLite would give it (the directory keeps others out; readers in it may export)."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode))


def bind_with_mode(sock: socket.socket, path: str, mode: int) -> None:
    """Bind a Unix socket whose file gets ``mode``: set on the socket's descriptor before
    the bind (the kernel gives the file the socket's mode less the umask), the umask
    cleared for the bind alone. No chmod through the path, which a link could redirect."""
    os.fchmod(sock.fileno(), mode)
    umask = os.umask(0)
    try:
        sock.bind(path)
    finally:
        os.umask(umask)
