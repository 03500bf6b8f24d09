"""The ``tpumon`` program: the console script's and ``python -m tpumon``'s entry.

Kept apart from the click group (:mod:`tpumon.cli`), which tests invoke in-process: only a
real ``tpumon agent`` process re-executes itself with its allocator settings
(:mod:`tpumon.allocator`), and it does so before importing anything it would import twice.
"""

from __future__ import annotations

import sys


def run() -> None:
    if sys.argv[1:2] == ["agent"]:
        from tpumon.allocator import reexec_agent

        reexec_agent()
    from tpumon.cli import main

    main()
