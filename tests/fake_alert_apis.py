"""Loopback HTTP servers that answer as Slack's incoming webhooks and PagerDuty's Events
API v2 do (../shared/spec/reference.md, "Alert delivery"), for the notifier and end-to-end
tests.

Each validates a request the way the real service does (Slack: a JSON object with `text`,
`blocks` or legacy `attachments` (what Alertmanager sends), else 400 `invalid_payload`;
PagerDuty: routing_key, event_action, dedup_key length, and summary/source/severity on a
trigger, else 400 "invalid event"), records it,
and answers success unless a test scripted other answers with ``respond``. ``stop_answering``
makes it drop connections, as an unreachable service would; ``delay`` (seconds, settable
any time) holds every answer that long, as an overloaded service would; ``arrived`` counts
requests as they arrive, before the delay (``wait_for_arrivals``: one is being held), and
a request whose client went away while it was held is still recorded and answered, as a
real service acts on what it received.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATHS = {"slack": "/services/T000/B000/XXXXXXXX", "pagerduty": "/v2/enqueue"}
SLACK_ERRORS = {400: "invalid_payload", 403: "action_prohibited", 404: "channel_not_found",
                410: "channel_is_archived", 429: "rate_limited", 500: "internal_error",
                503: "service_unavailable"}
PD_SEVERITIES = {"critical", "error", "warning", "info"}


@dataclass
class Received:
    """One request as the fake service got it, and what it answered."""

    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any
    status: int = 0
    time: float = field(default_factory=time.time)


class FakeAlertAPI:
    """``with FakeAlertAPI("slack") as api: ... api.url ... api.requests``."""

    def __init__(self, kind: str, port: int = 0, path: str | None = None,
                 delay: float = 0.0) -> None:
        if kind not in PATHS:
            raise ValueError(kind)
        self.kind = kind
        self.path = path or PATHS[kind]  # a Slack webhook's path is its secret
        self.requests: list[Received] = []
        self.accepted: list[Received] = []
        self.arrived = 0
        self._script: deque[int] = deque()
        self._lock = threading.Condition()
        self._silent = False
        self.delay = delay
        self.delayed = threading.Event()  # set once a request is being held by ``delay``
        self._closing = threading.Event()  # releases held requests at exit
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.path}"

    def __enter__(self) -> "FakeAlertAPI":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def respond(self, *statuses: int) -> None:
        """Answer the next requests with these statuses (in order), then succeed again."""
        with self._lock:
            self._script.extend(statuses)

    def stop_answering(self, silent: bool = True) -> None:
        """Close connections without an answer (a network error to the client)."""
        self._silent = silent

    def wait_for_requests(self, n: int, timeout: float = 30.0,
                          accepted: bool = False) -> list[Received]:
        """The requests (or only the accepted ones) once at least ``n`` have arrived."""
        got = self.accepted if accepted else self.requests
        with self._lock:
            if not self._lock.wait_for(lambda: len(got) >= n, timeout):
                raise AssertionError(f"{self.kind}: {len(got)} of {n} requests within {timeout} s")
            return list(got)

    def wait_for_arrivals(self, n: int, timeout: float = 30.0) -> None:
        """Return once ``n`` requests have arrived (answered or still held)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.arrived >= n, timeout):
                raise AssertionError(f"{self.kind}: {self.arrived} of {n} requests arrived "
                                     f"within {timeout} s")

    def _answer(self, request: Received) -> tuple[int, bytes, dict[str, str]]:
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            return self._error(scripted)
        problem = (self._slack_problem if self.kind == "slack" else self._pd_problem)(request)
        if problem:
            return self._error(400, problem)
        if self.kind == "slack":
            return 200, b"ok", {"Content-Type": "text/html"}
        key = request.body.get("dedup_key") or f"generated-{len(self.accepted)}"
        return 202, json.dumps({"status": "success", "message": "Event processed",
                                "dedup_key": key}).encode(), {"Content-Type": "application/json"}

    def _error(self, status: int, detail: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Retry-After": "1"} if status == 429 else {}
        if self.kind == "slack":
            return status, (detail or SLACK_ERRORS.get(status, "error")).encode(), headers
        body = {"status": "invalid event" if status == 400 else "error",
                "message": detail or f"HTTP {status}",
                "errors": [detail] if detail else []}
        return status, json.dumps(body).encode(), {**headers,
                                                   "Content-Type": "application/json"}

    @staticmethod
    def _slack_problem(request: Received) -> str | None:
        body = request.body
        if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")
                                              or body.get("attachments")):
            return "invalid_payload"
        if "blocks" in body and not isinstance(body["blocks"], list):
            return "invalid_blocks"
        return None

    @staticmethod
    def _pd_problem(request: Received) -> str | None:
        body = request.body
        if not isinstance(body, dict):
            return "Event object is invalid"
        if not body.get("routing_key"):
            return "'routing_key' is missing or blank"
        action = body.get("event_action")
        if action not in ("trigger", "acknowledge", "resolve"):
            return "'event_action' is invalid"
        if len(str(body.get("dedup_key", ""))) > 255:
            return "'dedup_key' is too long"
        if action != "trigger":
            return None if body.get("dedup_key") else "'dedup_key' is missing"
        payload = body.get("payload")
        if not isinstance(payload, dict):
            return "'payload' is missing"
        for name in ("summary", "source", "severity"):
            if not payload.get(name):
                return f"'payload.{name}' is missing or blank"
        if payload["severity"] not in PD_SEVERITIES:
            return "'payload.severity' is invalid"
        if len(payload["summary"]) > 1024:
            return "'payload.summary' is too long"
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with api._lock:
                    api.arrived += 1
                    api._lock.notify_all()
                if api.delay:
                    api.delayed.set()
                    if api._closing.wait(api.delay):  # shutting down: drop it unanswered
                        self.close_connection = True
                        return
                if api._silent:
                    self.close_connection = True
                    self.connection.close()
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                request = Received(self.path, dict(self.headers), raw, body)
                if self.path != api.path:
                    status, reply, headers = api._error(404, "no_service")
                else:
                    status, reply, headers = api._answer(request)
                request.status = status
                with api._lock:
                    api.requests.append(request)
                    if status < 300:
                        api.accepted.append(request)
                    api._lock.notify_all()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client went away while it was held

            def log_message(self, *args: object) -> None:
                pass

        return Handler
