import os
import sys
from pathlib import Path

import pytest

from tpumon.trace import arrow as trace_columns

sys.path.insert(0, str(Path(__file__).parent))

# tests/frameworks/ needs PyTorch/XLA and JAX (.venv-frameworks): `make test-frameworks`
# runs it with RUN_FRAMEWORK_TESTS=1; `make test` leaves it out.
collect_ignore = [] if os.environ.get("RUN_FRAMEWORK_TESTS") else ["frameworks"]

from fake_runtime import FakeRuntime, RuntimeServer  # noqa: E402


def _property_tests_reproducible() -> None:
    """Property tests draw the same examples in every run (seeded by each test), so a run
    of `make test` is reproducible and CI never fails on an example nobody has seen: a new
    counterexample is found by `make test-explore` (fresh random examples each run), then
    kept as an @example. Session 33 found one such example in the detector at random.
    (.venv-frameworks, for `make test-frameworks`, has no Hypothesis and no such tests.)"""
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("reproducible", derandomize=True)
    settings.register_profile("explore", derandomize=False)
    settings.load_profile(os.environ.get("TPUMON_HYPOTHESIS", "reproducible"))


_property_tests_reproducible()


@pytest.fixture
def runtime_servers():
    """Factory: start a fake runtime on loopback (port 0 = free port); all stopped after."""
    started: list[RuntimeServer] = []

    def start(metrics=None, port: int = 0) -> RuntimeServer:
        server = RuntimeServer(FakeRuntime(metrics), port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def receiver(tmp_path):
    """The agent's reporter socket on a temporary path, started (stopped after the test)."""
    from tpumon.sources.reports import ReporterSocket

    r = ReporterSocket(tmp_path / "r.sock")
    r.start()
    yield r
    r.stop()


@pytest.fixture
def small_tables(monkeypatch):
    """Traces read in tables of a few hundred rows (tpumon.trace.arrow): every series
    of a test's trace spans many of them (tests/test_trace_spill.py, test_report_stream.py)."""
    monkeypatch.setattr(trace_columns, "TABLE_ROWS", 300)
    monkeypatch.setattr(trace_columns, "_STREAM_BLOCK_BYTES", 8192)
    monkeypatch.setattr(trace_columns, "_PARQUET_BATCH_ROWS", 128)
