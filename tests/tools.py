"""Small helpers shared by tests: waiting, free ports, external tools."""

from __future__ import annotations

import os
import shutil
import socket
import time
from typing import Callable

import pytest

from tpumon.instrument import Reporter


def require_tool(name: str) -> str:
    """Path of an external tool; skip without it locally, but fail in CI, where
    `make test` must have installed it (a skip there would hide a missing install step)."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; `make test` should have installed it")
    pytest.skip(f"{name} not installed (run `make test` to install it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    """Poll until ``predicate()`` is truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")



class FakeReporter(Reporter):
    """A reporter with made-up framework fields: for testing the transport, the agent and
    the exporter without a framework (tests/frameworks/ runs the real ones)."""

    framework = "fake"

    def __init__(self, *args, live: int = 7, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.live = live

    def framework_fields(self) -> dict:
        return {"rank": 3, "ordinal": 1, "live": self.live,
                "compiles": {"cached": 10, "uncached": 2},
                "devices": {"1": {"used": 5 * 2**30, "limit": 32 * 2**30, "peak": 6 * 2**30}}}
