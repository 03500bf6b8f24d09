"""The agent's HTTP endpoint: /metrics (prometheus-client's WSGI app), a landing page at /,
and /-/healthy for probes, served by prometheus-client's threading WSGI server.

Scrapes run on their own threads and only read the published snapshot, so a slow
scraper can never delay a poll, and a poll in progress never delays a scrape.
"""

from __future__ import annotations

import errno
import html
import json
import socket
import threading
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from tpumon import __version__
from tpumon.config import parse_listen_address
from tpumon.state import Snapshot
from tpumon.status import status_document


class ListenError(Exception):
    """The exporter cannot listen where it was told to; worded as one line for the user."""


class _QuietHandler(WSGIRequestHandler):
    """Scrapes every few seconds would flood the journal; stay silent per request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass


def landing_page(snap: Snapshot) -> str:
    """A small human page like node_exporter's: who am I, what do I see, where are metrics."""
    rows = []
    for chip in snap.chips():
        sample = snap.runtime.chips.get(chip) if snap.runtime else None
        a = snap.assessments.get(chip)
        verdict = html.escape(f"{a.verdict.value}: {a.reason}") if a else ""
        if sample is None:
            rows.append(f"<tr><td>{html.escape(chip)}</td><td colspan=2>no data</td>"
                        f"<td>{verdict}</td></tr>")
            continue
        total = sample.hbm_total_bytes or 0
        pct = f"{100 * sample.hbm_used_bytes / total:.1f} %" if total else "?"
        rows.append(f"<tr><td>{html.escape(chip)}</td>"
                    f"<td>{sample.hbm_used_bytes / 2**30:.2f} / {total / 2**30:.2f} GiB</td>"
                    f"<td>{pct}</td><td>{verdict}</td></tr>")
    sources = "".join(
        f"<li>{html.escape(h.name)}: {'up' if h.up else 'down: ' + html.escape(h.error or '')}</li>"
        for h in snap.health)
    ident = ", ".join(f"{k}={html.escape(v or '?')}" for k, v in snap.identity.labels().items())
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>tpumon</title></head><body>"
        f"<h1>tpumon {html.escape(__version__)}</h1><p>{ident}</p>"
        "<p><a href='/metrics'>Metrics</a> &middot; <a href='/api/status'>status (JSON)</a></p>"
        "<h2>Chips</h2><table><tr><th>chip</th><th>HBM</th><th>used</th><th>leak detector</th>"
        f"</tr>{''.join(rows)}"
        f"</table><h2>Sources</h2><ul>{sources}</ul></body></html>")


def _app(registry: CollectorRegistry, get_snapshot: Callable[[], Snapshot]) -> Callable:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/":
            body = landing_page(get_snapshot()).encode()
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [body]
        if path == "/api/status":
            body = json.dumps(status_document(get_snapshot())).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if path == "/-/healthy":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"OK\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not found. Metrics are at /metrics.\n"]

    return app


class MetricsServer:
    """Binds HOST:PORT first (so a clash fails before anything else starts), serves at once
    (503 until :meth:`attach` supplies the registry), and stops on :meth:`stop`."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._app: Callable | None = None
        self._server: ThreadingWSGIServer | None = None

    def attach(self, registry: CollectorRegistry, get_snapshot: Callable[[], Snapshot]) -> None:
        self._app = _app(registry, get_snapshot)

    def _dispatch(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if self._app is None:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"starting\n"]
        return self._app(environ, start_response)

    def start(self) -> tuple[str, int]:
        """Bind and serve on a daemon thread; returns the bound (host, port)."""
        host, port = parse_listen_address(self._address)
        server_class = type("Server", (ThreadingWSGIServer,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        try:
            self._server = make_server(host or "0.0.0.0", port, self._dispatch, server_class,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ListenError(f"cannot listen on {self._address} (exporter.listen_address): "
                              f"{reason or exc}") from None
        threading.Thread(target=self._server.serve_forever, name="tpumon-http",
                         daemon=True).start()
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
