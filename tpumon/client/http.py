"""The HTTP client that talks to a running agent (`tpumon status`, `watch`, `snapshot`).

One place that knows how to reach an agent: its URL, and the same client options a
Prometheus scrape configuration has for an agent behind ``exporter.web_config_file`` (a CA
file to trust its certificate, a client certificate and key for mutual TLS, a basic-auth
user and a password file). Every failure is an :class:`AgentError` whose message says in
one line which agent and what went wrong, so a command can stop with it; whether a missing
agent is an error or a reason to read the runtime itself is the command's decision.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TypedDict, cast


class AgentError(Exception):
    """The agent could not be asked, or refused: one line naming the agent."""


class AgentUnreachable(AgentError):
    """Nothing answered at the agent's address (as opposed to an answer that refused)."""


class ChipStatus(TypedDict, total=False):
    """One chip in the status document (tpumon/web/status.py builds it)."""

    chip: str
    up: bool
    hbm_used_bytes: Optional[int]
    hbm_total_bytes: Optional[int]
    hbm_used_ratio: Optional[float]
    duty_cycle: Optional[float]
    owner_pid: Optional[int]
    owner_process: Optional[str]
    owner_rss_bytes: Optional[int]
    verdict: Optional[str]
    reason: Optional[str]
    floor_bytes: Optional[float]
    growth_bytes_per_hour: Optional[float]
    growth_bytes_per_step: Optional[float]
    predicted_oom_time: Optional[float]
    predicted_oom_step: Optional[float]
    diagnosis: Optional[str]


class StatusDocument(TypedDict, total=False):
    """The agent's /api/status (and `tpumon status --format json`)."""

    version: str
    source: str
    time: float
    identity: dict[str, str]
    sources: dict[str, dict[str, Any]]
    chips: list[ChipStatus]
    host: Optional[dict[str, int]]
    processes: list[dict[str, Any]]
    notifications: Optional[dict[str, Any]]
    store: Optional[dict[str, Any]]


class SnapshotRequest(TypedDict):
    """The agent's answer to POST /api/snapshot."""

    pid: int
    steps: int
    request_id: str


REQUIRED_STATUS_KEYS = ("time", "identity", "sources", "chips")


@dataclass(frozen=True)
class ClientAuth:
    """How to prove who we are and whom to trust: the client side of a web-config file."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The system's trust store, or ``ca_file``; the client certificate if given."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise AgentError(f"cannot load the client's TLS files: {exc}") from None
        return context

    def headers(self) -> dict[str, str]:
        """The basic-auth header, from the first line of ``password_file``."""
        if not self.user:
            return {}
        try:
            password = Path(self.password_file or "").read_text().splitlines()[0] \
                if self.password_file else ""
        except (OSError, IndexError) as exc:
            raise AgentError(f"cannot read the password file {self.password_file}: "
                             f"{getattr(exc, 'strerror', None) or 'empty'}") from None
        token = base64.b64encode(f"{self.user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}


class AgentClient:
    """Asks one agent, at ``url`` (http:// or https://), with ``auth``."""

    def __init__(self, url: str, auth: ClientAuth | None = None, timeout: float = 2.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AgentError(f"--agent {url!r} is not a URL such as http://127.0.0.1:9847")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number or out of range
        except ValueError:
            raise AgentError(f"--agent {url!r} has an invalid port") from None
        self.url = url.rstrip("/")
        self.auth = auth or ClientAuth()
        self.timeout = timeout
        self._context = self.auth.ssl_context() if parts.scheme == "https" else None

    def status(self, timeout: float | None = None) -> StatusDocument:
        """The agent's status document; AgentError if it cannot be had."""
        doc = self._request("GET", "/api/status", timeout)
        if not isinstance(doc, dict) or any(k not in doc for k in REQUIRED_STATUS_KEYS):
            raise AgentError(f"{self.url}/api/status is not a tpumon status document")
        return cast(StatusDocument, doc)

    def request_snapshot(self, pid: int | None, steps: int | None) -> SnapshotRequest:
        """POST /api/snapshot: ask a reporting process for two live-tensor snapshots."""
        query = urllib.parse.urlencode({k: v for k, v in (("pid", pid), ("steps", steps)) if v})
        doc = self._request("POST", f"/api/snapshot?{query}", 10.0)
        if not isinstance(doc, dict) or "request_id" not in doc:
            raise AgentError(f"{self.url}/api/snapshot gave no request id")
        return cast(SnapshotRequest, doc)

    def _request(self, method: str, path: str, timeout: float | None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         data=b"" if method == "POST" else None,
                                         headers=self.auth.headers())
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout,
                                        context=self._context) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AgentError(_refusal(self.url, exc)) from None
        except ValueError:
            raise AgentError(f"the agent at {self.url} did not answer in JSON") from None
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            if isinstance(reason, ssl.SSLError):  # something answered; we would not trust it
                raise AgentError(f"TLS with the agent at {self.url} failed: {reason}") from None
            raise AgentUnreachable(f"no agent answering at {self.url}: {reason}") from None


def _refusal(url: str, exc: urllib.error.HTTPError) -> str:
    """The agent's own error message; else the HTTP status, and a 401 says what to give;
    any other status without the agent's JSON error may well be another server on the
    port (a newcomer's `http.server` on 9847 was "the agent ... refused: HTTP 404")."""
    try:
        return f"the agent at {url} refused: {json.loads(exc.read())['error']}"
    except (ValueError, KeyError, TypeError, OSError):
        if exc.code == 401:
            return (f"the agent at {url} refused: HTTP 401 (give --agent-user and "
                    "--agent-password-file)")
        return f"{url} answered HTTP {exc.code}, not as a tpumon agent does (another server?)"
