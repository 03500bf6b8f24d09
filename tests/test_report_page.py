"""/report's answers without a real drawing: no request waits for another's drawing, the
last page is served while the next is drawn, failures are kept, and at most REPORT_SLOTS
answers are in progress at once (the real agent under a flood: tests/test_hostile.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tpumon.web import report_page
from tpumon.web.http import REPORT_SLOTS, _methods, _report_app
from tpumon.web.report_page import (CACHE_SECONDS, FAILURE_SECONDS, STALE_SECONDS,
                                    Answer, ReportPage)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakePage(ReportPage):
    """Draws page 1, 2, ... (or raises ``failure``); each drawing waits for ``go`` when
    it is cleared, so a test can look while one runs."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"), "vm")
        self.drawn = 0
        self.failure = ""
        self.go = threading.Event()
        self.go.set()
        self.started = threading.Event()

    def _draw(self) -> bytes:
        self.drawn += 1
        self.started.set()
        assert self.go.wait(10)
        if self.failure:
            raise RuntimeError(self.failure)
        return f"page {self.drawn}".encode()


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(report_page.time, "monotonic", c)
    return c


def drawing(page: FakePage) -> threading.Thread:
    """A request that draws, held mid-drawing until ``page.go`` is set."""
    page.go.clear()
    page.started.clear()
    t = threading.Thread(target=page)
    t.start()
    assert page.started.wait(10)
    return t


def test_a_request_during_the_first_drawing_gets_503_with_retry_after_at_once(clock):
    page = FakePage()
    t = drawing(page)
    assert page() == Answer("503 Service Unavailable",
                            b"The report is being drawn; try again in a few seconds.\n", 5)
    page.go.set()
    t.join()
    assert page() == Answer("200 OK", b"page 1") and page.drawn == 1  # kept


def test_while_the_next_page_is_drawn_the_last_is_served_unless_too_old(clock):
    page = FakePage()
    assert page().body == b"page 1"
    clock.now += CACHE_SECONDS + 1
    t = drawing(page)
    assert page() == Answer("200 OK", b"page 1")  # at once, not the wait
    clock.now += STALE_SECONDS
    assert page().status.startswith("503")  # an hour old: not served as the report
    page.go.set()
    t.join()
    assert page().body == b"page 2" and page.drawn == 2


def test_a_failed_drawing_is_kept_for_a_while_then_drawn_again(clock):
    page = FakePage()
    page.failure = "no history yet"
    first = page()
    assert first == Answer("503 Service Unavailable", b"no history yet\n", 10)
    clock.now += FAILURE_SECONDS - 3
    assert page() == Answer("503 Service Unavailable", b"no history yet\n", 3)
    assert page.drawn == 1  # not drawn for every request
    page.failure = ""
    clock.now += 3
    assert page() == Answer("200 OK", b"page 2") and page.drawn == 2


def call(app, method: str = "GET") -> tuple[str, dict, object]:
    answer: list = []
    body = app({"PATH_INFO": "/report", "REQUEST_METHOD": method},
               lambda status, headers, exc_info=None: answer.extend((status, dict(headers))))
    return answer[0], answer[1], body


def test_report_answers_in_progress_are_bounded_until_their_bodies_are_closed():
    app = _report_app(lambda: Answer("200 OK", b"<html>"))
    held = [call(app) for _ in range(REPORT_SLOTS)]  # sent to clients that do not read
    assert all(status == "200 OK" for status, _, _ in held)
    status, headers, body = call(app)
    assert status == "503 Service Unavailable" and headers["Retry-After"] == "5"
    assert b"Too many report requests" in b"".join(body)
    held[0][2].close()  # what the server does after the last byte, or on an error
    held[0][2].close()  # twice frees one slot
    assert call(app)[0] == "200 OK"
    assert call(app)[0].startswith("503")


def test_head_and_a_failing_report_free_their_slot():
    broken: list[OSError] = []

    def report() -> Answer:
        if broken:
            raise broken[0]
        return Answer("200 OK", b"<html>")

    app = _methods(_report_app(report))
    for _ in range(2 * REPORT_SLOTS):
        status, headers, body = call(app, "HEAD")
        assert status == "200 OK" and headers["Content-Length"] == "6" and body == []
    broken.append(OSError("no space for the temporary directory"))
    for _ in range(2 * REPORT_SLOTS):
        with pytest.raises(OSError):
            call(app)
    broken.clear()
    assert call(app)[0] == "200 OK"
