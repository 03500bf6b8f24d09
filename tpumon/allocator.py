"""The agent's memory allocator: Python's objects on glibc's malloc, its heap on
transparent huge pages.

Why: the agent sleeps for most of each second and then runs a poll that touches ~2,300
distinct 4 KiB pages (~1,700 of them Python objects: code, dicts, the poll's own data).
On a virtual machine the first touch of a page after an idle second is a TLB miss walked
through two levels of page tables with cold caches; on the development VM that cost
0.3-7 us a page, hour by hour, often more than the poll's own instructions
(``bench/page_touch.py``; docs/benchmarks.md, issue 25). Objects allocated by glibc's
malloc (``PYTHONMALLOC=malloc``) instead of in pymalloc's 1 MiB arenas, which can never
be huge pages, live in one heap, and ``glibc.malloc.hugetlb=1`` (glibc 2.35 and later)
advises that heap for transparent huge pages: the same objects in a handful of 2 MiB
pages. The agent's CPU falls 1.8-2.5x (side by side) for ~3 MiB more RSS.

Both settings are read once, when the interpreter starts, so ``tpumon agent`` executes
itself again with them (the same process: same PID, arguments and file descriptors; no
systemd unit or manifest has to know). A ``PYTHONMALLOC`` already in the environment is
the operator's choice and is kept, and with it nothing is re-executed (so
``PYTHONMALLOC=pymalloc`` turns this off); a ``glibc.malloc.hugetlb`` already in
``GLIBC_TUNABLES`` is kept too. Other C libraries (musl) are left alone. Where the kernel's
transparent huge pages are off, the tunable does nothing and glibc's malloc alone remains.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def glibc() -> bool:
    """Whether this interpreter runs on glibc (the tunable is glibc's)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):  # not a name this C library knows
        return False


def agent_environment(environ: Mapping[str, str], on_glibc: bool) -> dict[str, str] | None:
    """The environment to run the agent in, or None when the one it has will do: not
    glibc, or an allocator the operator chose (which includes a process already
    re-executed)."""
    if not on_glibc or "PYTHONMALLOC" in environ:
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" not in tunables:
        tunables = f"{tunables}:{HUGE_PAGE_TUNABLE}" if tunables else HUGE_PAGE_TUNABLE
    return {**environ, "PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": tunables}


def reexec_agent(argv: Sequence[str] | None = None) -> None:
    """Execute the interpreter again with the agent's allocator settings and the same
    command line (``sys.orig_argv``); returns only where nothing was to be done or the
    exec failed (the agent then runs as it is, just dearer)."""
    env = agent_environment(os.environ, glibc())
    argv = list(sys.orig_argv if argv is None else argv)
    if env is None or not argv or not sys.executable:
        return
    try:
        os.execve(sys.executable, argv, env)
    except OSError:
        return
