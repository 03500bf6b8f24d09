"""One HTTP POST of a JSON body, and what to do next: done, try again later, or give up.

Both services say the same things the same way: 2xx accepted; 429 slow down (with
Retry-After); 5xx and network errors are the service's trouble, worth retrying; any other
4xx is our request's fault and will not get better by sending it again. Messages never
carry the URL: a Slack webhook URL is itself the secret.
"""

from __future__ import annotations

import json
import math
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from tpumon import __version__

DELIVERED, RETRY, REJECTED = "delivered", "retry", "rejected"
USER_AGENT = f"tpumon/{__version__}"


@dataclass(frozen=True)
class Outcome:
    kind: str                        # DELIVERED, RETRY or REJECTED
    detail: str                      # for logs and status: "HTTP 503", "connection refused"
    reason: str = ""                 # counter label: rate_limited, server_error, network, rejected
    retry_after: float | None = None  # seconds, when the service said


def post_json(url: str, body: Any, timeout: float) -> Outcome:
    """POST ``body`` as JSON; never raises for anything the network or service does."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(4096)
            return Outcome(DELIVERED, f"HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        return _http_error(exc)
    except (urllib.error.URLError, OSError, socket.timeout) as exc:
        reason = getattr(exc, "reason", exc)
        return Outcome(RETRY, f"network error: {getattr(reason, 'strerror', None) or reason}",
                       "network")


def _http_error(exc: urllib.error.HTTPError) -> Outcome:
    try:
        said = exc.read(512).decode("utf-8", "replace").strip()
    except OSError:
        said = ""
    detail = f"HTTP {exc.code}" + (f": {said[:200]}" if said else "")
    if exc.code == 429:
        return Outcome(RETRY, detail, "rate_limited", _retry_after(exc.headers.get("Retry-After")))
    if exc.code >= 500:
        return Outcome(RETRY, detail, "server_error")
    return Outcome(REJECTED, detail, "rejected")


def _retry_after(raw: str | None) -> float | None:
    try:
        seconds = float(raw) if raw else None
    except ValueError:  # an HTTP date: rare from these services; fall back to backoff
        return None
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), 3600.0)  # a service asking for more than an hour: retry
