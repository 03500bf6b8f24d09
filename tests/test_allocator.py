"""The agent's allocator settings (tpumon/allocator.py): glibc's malloc with its heap on
transparent huge pages, by executing the agent again once; an operator's choice kept."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import AgentProcess
from tpumon.allocator import HUGE_PAGE_TUNABLE, agent_environment, glibc


def test_the_agent_gets_glibc_malloc_on_huge_pages_where_nothing_was_chosen():
    env = agent_environment({"PATH": "/bin"}, on_glibc=True)
    assert env == {"PATH": "/bin", "PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": HUGE_PAGE_TUNABLE}


def test_other_tunables_are_kept_and_an_operators_huge_page_choice_wins():
    env = agent_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, on_glibc=True)
    assert env is not None
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{HUGE_PAGE_TUNABLE}"
    env = agent_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, on_glibc=True)
    assert env is not None and env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_an_operators_allocator_and_other_c_libraries_are_left_alone():
    """PYTHONMALLOC set (by the operator, or by the re-execution itself) means no change:
    it is also what stops a second re-execution."""
    assert agent_environment({"PYTHONMALLOC": "pymalloc"}, on_glibc=True) is None
    assert agent_environment({"PYTHONMALLOC": "malloc"}, on_glibc=True) is None
    assert agent_environment({}, on_glibc=False) is None


SHOW = ("import os, sys; print(os.getpid(), os.environ.get('PYTHONMALLOC'), "
        "os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")
REEXEC = ("import os, sys; print(os.getpid(), flush=True); "
          "from tpumon.allocator import reexec_agent; "
          f"reexec_agent([sys.executable, '-c', {SHOW!r}, 'agent', '--x']); print('returned')")


def run_python(code: str, **env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, check=True,
                          capture_output=True, text=True, timeout=60).stdout.splitlines()


@pytest.mark.skipif(not glibc(), reason="the settings are glibc's")
def test_the_process_is_executed_again_in_place_with_the_settings():
    before, after = run_python(REEXEC)
    assert after == f"{before} malloc {HUGE_PAGE_TUNABLE} ['agent', '--x']"  # same PID


def test_with_the_operators_allocator_nothing_is_executed_again():
    pid, returned = run_python(REEXEC, PYTHONMALLOC="pymalloc")
    assert returned == "returned" and pid.isdigit()


def transparent_huge_pages() -> bool:
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return mode.exists() and re.search(r"\[(always|madvise)\]", mode.read_text()) is not None


@pytest.mark.e2e
@pytest.mark.skipif(not glibc(), reason="the settings are glibc's")
def test_the_running_agent_has_its_heap_on_huge_pages(tmp_path):
    """`tpumon agent` as a user starts it (python -m tpumon): the process that serves the
    metrics is the one started (same PID), with glibc's malloc, and where the kernel
    gives transparent huge pages its heap is on them."""
    agent = AgentProcess(tmp_path, None)
    try:
        environ = Path(f"/proc/{agent.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"PYTHONMALLOC=malloc" in environ
        assert any(v.startswith(b"GLIBC_TUNABLES=") and HUGE_PAGE_TUNABLE.encode() in v
                   for v in environ)
        assert agent.metrics()  # and it serves
        if transparent_huge_pages():
            rollup = Path(f"/proc/{agent.proc.pid}/smaps_rollup").read_text()
            assert int(re.search(r"AnonHugePages:\s+(\d+)", rollup).group(1)) > 0
    finally:
        assert agent.stop() == 0
