"""``tpumon report`` in bounded memory (issue 44): a trace spilled and its series replayed
one at a time gives the same pages and pictures as the whole trace read into memory (what
``report`` did before), byte for byte but for the moment the page was generated."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_report import HOST, SCENARIOS, rows_of
from test_trace_spill import SLICE, slice_rows, slice_traces_in

from tpumon import __version__
from tpumon.cli import main
from tpumon.cli.timespec import parse_when
from tpumon.detect.replay import spilled_path
from tpumon.report import build_reports, file_stem, write_report
from tpumon.report.data import chip_report, select, selection
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.read import read_trace_columns
from tpumon.trace.write import write_trace
from tpumon.trace.spill import SpilledSeries

_GENERATED = re.compile(r"\(tpumon report\) at [^<]*? UTC\.")


@pytest.fixture(scope="module")
def scenario_traces(tmp_path_factory) -> dict[str, Path]:
    """tests/test_report.py's traces: 10 h at 5 s polls on 2 chips of each scenario."""
    root = tmp_path_factory.mktemp("scenarios")
    out = {}
    for scenario in SCENARIOS:
        out[scenario] = root / f"{scenario}.csv"
        write_trace(rows_of(scenario), out[scenario])
    return out


@pytest.fixture(scope="module")
def slice_traces(tmp_path_factory) -> dict[str, Path]:
    """tests/test_trace_spill.py's: a two-host slice (one job, pooled; one host leaks) and a
    lone host with a staircase, polled together, as CSV, JSON Lines and Parquet, and as a
    directory of one CSV per host."""
    root = tmp_path_factory.mktemp("slice")
    rows = slice_rows()
    out = slice_traces_in(root, rows)
    out["directory"] = root / "hosts"
    out["directory"].mkdir()
    for host in dict.fromkeys(r.host for r in rows):
        write_trace([r for r in rows if r.host == host], out["directory"] / f"{host}.csv")
    return out


def streamed(trace: Path, outdir: Path, *options: str) -> dict[str, bytes]:
    """`tpumon report TRACE [options]` (spilled): {file name: contents}."""
    result = CliRunner().invoke(main, ["report", str(trace), "-o", str(outdir), *options])
    assert result.exit_code == 0, result.output
    written = [Path(line) for line in result.output.split()]
    return {p.name: _comparable(p) for p in written}


def whole(trace: Path, outdir: Path, hosts=(), chips=(), since=None,
          until=None) -> dict[str, bytes]:
    """The report as it was made before: every series read into memory, then selected."""
    series = select(read_trace_columns(trace), hosts, chips,
                    parse_when(since, "") if since else -np.inf,
                    parse_when(until, "") if until else np.inf)
    outdir.mkdir(parents=True)
    out = {}
    for report in build_reports(series, str(trace.resolve()), __version__, 0.0):
        for p in write_report(report, outdir):
            out[p.name] = _comparable(p)
    return out


def _comparable(path: Path) -> bytes:
    """A file's bytes; a page's with the moment it was generated left out."""
    data = path.read_bytes()
    if path.suffix == ".html":
        data = _GENERATED.sub("(tpumon report) at -.", data.decode()).encode()
    return data


def assert_same(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    assert sorted(got) == sorted(want) and got
    for name in want:
        assert got[name] == want[name], name  # the PNG's pixels and the page's every word


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_streamed_report_is_the_whole_trace_report(scenario_traces, scenario, tmp_path):
    trace = scenario_traces[scenario]
    got = streamed(trace, tmp_path / "streamed")
    assert_same(got, whole(trace, tmp_path / "whole"))
    assert {f"{file_stem(HOST)}.png", f"{file_stem(HOST)}.html"} == set(got)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_series_over_many_tables_give_the_same_report(slice_traces, small_tables, fmt,
                                                       tmp_path):
    trace = slice_traces[fmt]
    with spilled_path(str(trace)) as series:
        assert all(len(s._chunks) > 5 for s in series.values())  # many tables each
    got = streamed(trace, tmp_path / "streamed")
    assert len(got) == 6  # three hosts; the slice's two pooled as one job
    assert_same(got, whole(trace, tmp_path / "whole"))
    assert b">leak</span>" in got[f"{file_stem(SLICE + '-w-0')}.html"]


@pytest.mark.parametrize("options", [
    {"hosts": ("solo",), "chips": ("1",)},
    {"hosts": (f"{SLICE}-w-0",), "since": "2025-06-15T17:00:00"},
    {"since": "2025-06-15T16:00:00", "until": "2025-06-15T20:00:00"},
])
@pytest.mark.slow
def test_a_selection_is_spilled_alone_with_the_same_report(slice_traces, small_tables,
                                                             options, tmp_path):
    trace = slice_traces["csv"]
    flags = [f for h in options.get("hosts", ()) for f in ("--host", h)] + \
        [f for c in options.get("chips", ()) for f in ("--chip", c)] + \
        [f for key in ("since", "until") if key in options for f in (f"--{key}", options[key])]
    assert_same(streamed(trace, tmp_path / "streamed", *flags),
                whole(trace, tmp_path / "whole", **options))
    keep = selection(options.get("hosts", ()), options.get("chips", ()),
                     parse_when(options["since"], "") if "since" in options else -np.inf)
    with spilled_path(str(trace), keep=keep) as series:  # only what is kept is written
        kept = {key: s.samples for key, s in series.items() if s.samples}
    expected = select(read_trace_columns(trace), options.get("hosts", ()),
                      options.get("chips", ()),
                      parse_when(options["since"], "") if "since" in options else -np.inf)
    assert kept == {key: len(c.times) for key, c in expected.items()}


@pytest.mark.slow
def test_a_directory_of_traces_is_reported_as_one_trace(slice_traces, tmp_path):
    got = streamed(slice_traces["directory"], tmp_path / "directory")
    want = streamed(slice_traces["csv"], tmp_path / "file")
    source = re.compile(rb"<td>/[^<]*(?:hosts|trace\.csv)</td>")
    assert sorted(got) == sorted(want)
    for name in want:
        assert source.sub(b"", got[name]) == source.sub(b"", want[name]), name


def test_rows_left_out_are_still_checked(tmp_path, small_tables):
    """A series whose time goes back is an error, as before, even where the selection
    leaves its host out."""
    rows = sorted(list(generate_trace("healthy", duration_s=3600, poll_interval_s=5, chips=1,
                                      seed=1, host="a")) +
                  list(generate_trace("healthy", duration_s=3600, poll_interval_s=5, chips=1,
                                      seed=2, host="b")), key=lambda r: r.time)
    back = len(rows) - 10
    rows[back] = dataclasses.replace(rows[back], time=rows[0].time)
    trace = tmp_path / "back.csv"
    write_trace(rows, trace)
    host = rows[back].host
    other = "a" if host == "b" else "b"
    result = CliRunner().invoke(main, ["report", str(trace), "--host", other, "-o",
                                       str(tmp_path)])
    assert result.exit_code == 1 and f"back.csv:{back + 2}" in result.output, result.output


def test_a_chip_report_keeps_no_array_per_sample(tmp_path):
    """What a report keeps of a chip: envelope bins, buckets, the trend; the series stays
    in the spill file (read again only for the step axis's few labels)."""
    trace = tmp_path / "dense.csv"
    write_trace(generate_trace("linear-leak", duration_s=4 * 3600, poll_interval_s=0.5,
                               chips=1, seed=1, host=HOST), trace)
    with spilled_path(str(trace)) as series:
        (key, spilled), = series.items()
        report = chip_report(*key, spilled)
        assert isinstance(report.series, SpilledSeries)
        arrays = [v for v in vars(report).values() if isinstance(v, np.ndarray)] + \
            [v for v in vars(report.trend).values() if isinstance(v, np.ndarray)]
        assert arrays and max(len(a) for a in arrays) <= spilled.samples / 16
        assert report.has_steps and report.steps_at([report.start, report.end]) == \
            [0.0, float(spilled.load().steps[-1])]
