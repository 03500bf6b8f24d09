"""Commands that take seconds on a large input show their progress on a terminal (rich's
bars, on stderr, gone when done) and nothing when their output goes to a pipe: `analyze`,
`report` and `export`, each run on a pseudo-terminal as a user at a shell runs it."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from test_analyze import SLICE, write_slice
from test_store import record_all
from tools import clean_env
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.read import read_trace_columns

TPUMON = [sys.executable, "-m", "tpumon"]


def on_a_terminal(*args: str, stdout=None) -> tuple[int, str]:
    """`tpumon ARGS` with stdout (unless given) and stderr on one pseudo-terminal: its exit
    status and all it drew (bars included: a transient bar is drawn, then erased)."""
    main_fd, term = pty.openpty()
    child = subprocess.Popen([*TPUMON, *args], stdin=subprocess.DEVNULL,
                             stdout=term if stdout is None else stdout, stderr=term,
                             env={**clean_env(), "COLUMNS": "100", "TERM": "xterm"})
    os.close(term)
    drawn = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed the terminal: EIO
            break
        if not chunk:
            break
        drawn += chunk
    os.close(main_fd)
    return child.wait(timeout=120), drawn.decode(errors="replace")


def piped(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, *args], capture_output=True, text=True, timeout=120,
                          env=clean_env())


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory):
    """test_analyze's two-host slice: host 0 leaks, host 1 is healthy."""
    return write_slice(tmp_path_factory.mktemp("slice"))


def samples(*traces) -> int:
    return sum(len(c.times) for t in traces for c in read_trace_columns(str(t)).values())


@pytest.mark.slow
def test_analyze_shows_reading_and_replaying(slice_dir):
    status, drawn = on_a_terminal("analyze", str(slice_dir))
    assert status == 0, drawn
    replaying = f"replaying {samples(*sorted(slice_dir.glob('*.csv'))):,} samples"
    assert "reading 2 trace files" in drawn and replaying in drawn, drawn
    assert "tpumon analyze (times UTC)" in drawn  # the table, after the bars
    quiet = piped("analyze", str(slice_dir))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert "replaying" not in quiet.stdout and "tpumon analyze (times UTC)" in quiet.stdout


@pytest.mark.slow
def test_report_shows_reading_replaying_and_drawing(slice_dir, tmp_path):
    trace = next(slice_dir.glob("w0.csv"))
    status, drawn = on_a_terminal("report", str(trace), "-o", str(tmp_path / "t"))
    assert status == 0, drawn
    assert "reading 1 trace file" in drawn, drawn  # spilled as analyze spills it
    assert f"replaying {samples(trace):,} samples" in drawn, drawn
    assert "drawing 1 host report" in drawn, drawn
    assert str(tmp_path / "t" / f"tpumon-report-{SLICE}-w-0.html") in drawn
    quiet = piped("report", str(trace), "-o", str(tmp_path / "p"))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert sorted(os.path.basename(p) for p in quiet.stdout.split()) == [
        f"tpumon-report-{SLICE}-w-0.html", f"tpumon-report-{SLICE}-w-0.png"]


def test_export_counts_its_rows_and_leaves_stdout_to_the_trace(tmp_path):
    """The bar is on stderr and stdout is not redirected into it: `export -o -` on a
    terminal still writes its trace to stdout, whole."""
    state = tmp_path / "state"
    rows = list(generate_trace("healthy", duration_s=1200, poll_interval_s=5, chips=2))
    record_all(state, rows)
    with open(tmp_path / "stdout.csv", "w") as out:  # `tpumon export -o - > stdout.csv`
        status, drawn = on_a_terminal("export", "--state-dir", str(state), "-o", "-",
                                      stdout=out)
    assert status == 0, drawn
    assert f"exporting rows: {len(rows):,}" in drawn, drawn
    assert "time," not in drawn  # no row of the trace on the terminal
    quiet = piped("export", "--state-dir", str(state), "-o", "-")
    # no progress piped; the one line the README promises, whatever -o says
    assert quiet.returncode == 0 and quiet.stderr == f"{len(rows)} rows written to stdout\n", \
        quiet.stderr
    assert len(quiet.stdout.splitlines()) == len(rows) + 1  # the header, every row
    assert (tmp_path / "stdout.csv").read_text() == quiet.stdout
