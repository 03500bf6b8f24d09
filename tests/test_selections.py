"""Every command treats an empty selection and an unwritable output the same way: one
error line, a non-zero exit, and an existing output file left as it was."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from test_store import record_all
from tools import clean_env
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.write import write_trace

TPUMON = [sys.executable, "-m", "tpumon"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, *args], capture_output=True, text=True, timeout=60,
                          env=clean_env())


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    record_all(d, list(generate_trace("healthy", duration_s=1200, poll_interval_s=5, chips=2)))
    return d


@pytest.mark.slow
def test_analyze_of_a_header_only_trace_is_an_error(tmp_path):
    """It printed an empty table and exited 0, where `report` said there was nothing."""
    trace = tmp_path / "empty.csv"
    write_trace([], str(trace))
    one_line_error(run("analyze", str(trace)), "no samples")
    one_line_error(run("analyze", str(trace), "--format", "json"), "no samples")
    one_line_error(run("report", str(trace), "-o", str(tmp_path / "r")))


@pytest.mark.parametrize("args, fragments", [
    (["--chip", "99"], ["no samples match", "chip(s) 0, 1"]),
    (["--host", "elsewhere"], ["no samples match", "host(s) "]),
    (["--since", "1d"], ["no samples match", "--since 1d"]),
])
@pytest.mark.slow
def test_export_of_an_empty_selection_is_an_error_and_keeps_the_file(state, tmp_path, args,
                                                                     fragments):
    """`export --chip 99` wrote a header over the output and exited 0."""
    out = tmp_path / "kept.csv"
    out.write_text("an earlier export\n")
    one_line_error(run("export", "--state-dir", str(state), "-o", str(out), *args), *fragments)
    assert out.read_text() == "an earlier export\n"
    one_line_error(run("export", "--state-dir", str(state), *args), *fragments)  # stdout


@pytest.mark.parametrize("name", ["x.xlsx", "x.json", "x"])
def test_export_refuses_a_file_it_cannot_write(state, tmp_path, name):
    """`export -o x.parquet` wrote CSV into it (Parquet is written now; other suffixes are
    still refused)."""
    one_line_error(run("export", "--state-dir", str(state), "-o", str(tmp_path / name)),
                   name, ".csv or .jsonl or .parquet")
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("fmt, name", [("csv", "x.parquet"), ("parquet", "x.csv"),
                                       ("jsonl", "x.CSV")])
def test_export_refuses_a_format_its_name_contradicts(state, tmp_path, fmt, name):
    """`export --format csv -o x.parquet` wrote CSV into x.parquet, which analyze then
    failed to read as Parquet; an existing file is left as it was."""
    out = tmp_path / name
    out.write_text("an earlier export\n")
    one_line_error(run("export", "--state-dir", str(state), "--format", fmt, "-o", str(out)),
                   name, f"--format {fmt}")
    assert out.read_text() == "an earlier export\n"


def test_export_with_a_format_writes_any_name_and_analyze_reads_it_by_suffix(state, tmp_path):
    """A name of another suffix takes --format; one that agrees with it is fine."""
    result = run("export", "--state-dir", str(state), "--format", "csv", "-o",
                 str(tmp_path / "trace.txt"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "trace.txt").read_text().startswith("time,host,chip,step,")
    result = run("export", "--state-dir", str(state), "--format", "parquet", "-o",
                 str(tmp_path / "trace.parquet"))
    assert result.returncode == 0, result.stderr
    analyzed = run("analyze", str(tmp_path / "trace.parquet"), "--format", "json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert len(json.loads(analyzed.stdout)["series"]) == 2


def test_export_to_a_fifo_or_a_symlink_writes_through_it(state, tmp_path):
    """The output was written beside and renamed over: `--format csv -o /dev/null` as
    root put a regular file in /dev/null's place, and a symlink was replaced by a file.
    A FIFO stands in for the device here: it stays a FIFO, and its reader gets the trace;
    a symlink stays a link, and the file it points at gets the trace."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()), daemon=True)
    reader.start()
    result = run("export", "--state-dir", str(state), "--format", "csv", "-o", str(fifo))
    reader.join(30)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert read and read[0].startswith("time,host,chip,step,") and read[0].count("\n") > 100
    real, link = tmp_path / "real.csv", tmp_path / "link.csv"
    real.write_text("an earlier export\n")
    link.symlink_to(real)
    result = run("export", "--state-dir", str(state), "-o", str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and real.read_text() == read[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "pipe", "real.csv"]


def test_a_trace_to_a_reader_that_leaves_early_ends_quietly():
    """`tpumon sim --write-trace - | head` said "Error: --write-trace -: Broken pipe"
    (export's stdout goes the same way: cli.trace_output). 30 h of polls are megabytes,
    far more than a pipe holds: the writer meets the closed pipe."""
    with subprocess.Popen([*TPUMON, "sim", "--write-trace", "-", "--duration", "30h"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=clean_env()) as proc:
        assert proc.stdout is not None and proc.stdout.readline().startswith(b"time,host,")
        proc.stdout.close()  # as `head -1` does
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err == b"", err


def test_a_directory_without_traces_is_one_error_line(tmp_path):
    """It said "no samples to analyze (only a header?)", of a directory; a folder named
    like a trace is no trace either (it was read, and failed: 'Is a directory')."""
    (tmp_path / "notes.txt").write_text("not a trace\n")
    (tmp_path / "old.csv").mkdir()
    one_line_error(run("analyze", str(tmp_path)), "a directory without trace files",
                   ".csv, .jsonl, .parquet")
    one_line_error(run("report", str(tmp_path), "-o", str(tmp_path / "r")),
                   "a directory without trace files")
    assert not (tmp_path / "r").exists()


def test_export_to_dev_stdout_appends_to_the_file_a_shell_appends_to(state, tmp_path):
    """`export -o /dev/stdout >> app.log` renamed a new file over app.log (its earlier
    lines gone, the shell writing to the old inode); opened for writing, it truncated it."""
    log = tmp_path / "app.log"
    log.write_text("earlier line\n")
    inode = log.stat().st_ino
    with open(log, "a") as out:
        result = subprocess.run([*TPUMON, "export", "--state-dir", str(state), "--format",
                                 "csv", "-o", "/dev/stdout"], stdout=out, stderr=subprocess.PIPE,
                                text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    text = log.read_text()
    assert log.stat().st_ino == inode and text.startswith("earlier line\ntime,host,chip,")
    assert text.count("\n") == 1 + 1 + 480


def test_export_to_stdout_still_says_how_many_rows_on_stderr(state):
    """The README promised the line whatever -o says; with '-' none came."""
    result = subprocess.run([*TPUMON, "export", "--state-dir", str(state)], capture_output=True,
                            text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 + 480 and result.stdout.startswith("time,host,")
    assert result.stderr.strip().splitlines()[-1] == "480 rows written to stdout"


@pytest.mark.parametrize("args, fragments", [
    (["--format", "jsonl", "-o", "NAME/x.txt"], ["x.txt", "read it as CSV", ".jsonl"]),
    (["-o", "NAME/loop.csv"], ["loop.csv", "symbolic links"]),
    (["-o", "NAME/pipe.parquet"], ["pipe.parquet", "Parquet is written to a file of its own"]),
])
def test_export_refuses_what_it_could_not_write_right(state, tmp_path, args, fragments):
    """A JSON Lines trace named x.txt that analyze then read as CSV; a symlink loop that was
    replaced by a file; Parquet into a pipe ('lseek failed')."""
    (tmp_path / "loop.csv").symlink_to(tmp_path / "loop2.csv")
    (tmp_path / "loop2.csv").symlink_to(tmp_path / "loop.csv")
    os.mkfifo(tmp_path / "pipe.parquet")
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(run("export", "--state-dir", str(state),
                       *[a.replace("NAME", str(tmp_path)) for a in args]), *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "loop.csv").is_symlink()


def test_export_over_a_file_keeps_its_mode(state, tmp_path):
    """The file renamed over an existing one took the umask's mode: a 0600 trace became
    0644."""
    out = tmp_path / "private.csv"
    out.write_text("an earlier export\n")
    out.chmod(0o600)
    assert run("export", "--state-dir", str(state), "-o", str(out)).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text().startswith("time,")


def test_export_to_a_closed_stdout_is_one_error_line(state):
    """`tpumon export >&-` printed a traceback."""
    result = subprocess.run([*TPUMON, "export", "--state-dir", str(state)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=60, env=clean_env(), preexec_fn=lambda: os.close(1))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == "Error: stdout is closed; give -o FILE"


def test_export_writes_what_it_selected(state, tmp_path):
    result = run("export", "--state-dir", str(state), "--chip", "1", "-o",
                 str(tmp_path / "one.jsonl"))
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "one.jsonl").read_text().splitlines()
    assert lines and all('"chip": "1"' in line or '"chip":"1"' in line for line in lines)
    assert not list(tmp_path.glob("*.partial"))


def test_analyze_says_which_samples_use_more_hbm_than_the_chip_has(tmp_path):
    """Rows with hbm_used_bytes above hbm_total_bytes were accepted without a word."""
    trace = tmp_path / "over.csv"
    rows = ["time,host,chip,step,hbm_used_bytes,hbm_total_bytes"]
    rows += [f"{1000 + i},vm,0,{i},{40 if i % 10 == 0 else 20},32" for i in range(100)]
    trace.write_text("\n".join(rows) + "\n")
    result = run("analyze", str(trace), "--format", "json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)  # stdout stays the document
    assert result.stderr.strip() == ("tpumon analyze: host vm chip 0: 10 of 100 samples use "
                                     "more HBM than the chip has")
