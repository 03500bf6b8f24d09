"""The agent's HTTP endpoint: /metrics (prometheus-client's WSGI app), a landing page at /,
and /-/healthy for probes, served by prometheus-client's threading WSGI server.

Scrapes run on their own threads and only read the published poll state, so a slow
scraper can never delay a poll, and a poll in progress never delays a scrape.

With a web configuration file (exporter.web_config_file, see webconfig/live.py) the endpoint
speaks TLS, optionally asks for client certificates, and requires basic auth on every
path. The TLS handshake runs on the connection's own thread, not in accept(), so a client
that connects and sends nothing cannot stall the others.
"""

from __future__ import annotations

import errno
import functools
import io
import json
import logging
import selectors
import socket
import ssl
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Iterator, cast
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer

from tpumon import __version__
from tpumon.common.config import parse_listen_address
from tpumon.web import snapshot_api
from tpumon.web.connections import (HEAD_END, MAX_BODY_BYTES, MAX_HEAD_BYTES,
                                    REQUEST_SECONDS, Connections, client_gone,
                                    receive_until)
from tpumon.metrics.exposition import metrics_app as exposition_app
from tpumon.web.report_page import Answer
from tpumon.web.webconfig.live import LiveWebConfig, protect
from tpumon.state import PollState
from tpumon.common.describe import describe_growth, oom_cell, verdict_label
from tpumon.common.units import format_bytes
from tpumon.web.status import NO_READERS, Readers, status_document

if TYPE_CHECKING:
    import jinja2


log = logging.getLogger("tpumon.exporter")

# Per socket operation on a TLS connection, the handshake included.
TLS_TIMEOUT = 10.0
# What Go's net/http answers a plain HTTP request on a TLS port.
PLAIN_HTTP_ON_TLS = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")


class ListenError(Exception):
    """The exporter cannot listen where it was told to; worded as one line for the user."""


# A response the client does not read holds its thread at most this long per send.
SEND_TIMEOUT = 10.0


class _Handler(WSGIRequestHandler):
    """One request per connection, read whole within REQUEST_SECONDS before anything is
    done with it (see connections.py), and answered only if the client is still there.
    Silent per request: scrapes every few seconds would flood the journal."""

    server: "_Server"

    def handle(self) -> None:
        deadline = time.monotonic() + REQUEST_SECONDS
        request = receive_until(self.connection, b"", lambda d: HEAD_END in d, deadline,
                                MAX_HEAD_BYTES)
        if request is None:
            return  # slow, gone, pushed out or oversized: no answer, nothing rendered
        head, _, received = request.partition(HEAD_END)
        self.rfile = io.BytesIO(head + HEAD_END)
        self.raw_requestline = self.rfile.readline(65537)
        if not self.parse_request():  # an error was sent
            return
        body = self._body(received, deadline)
        if body is None:
            return
        self.server.connections.answering(self.connection)
        self.connection.settimeout(SEND_TIMEOUT)
        if client_gone(self.connection):
            return
        handler = ServerHandler(io.BytesIO(body), cast(IO[bytes], self.wfile),
                                self.get_stderr(), self.get_environ(), multithread=False)
        handler.request_handler = self  # type: ignore[attr-defined]  # wsgiref logs with it
        handler.run(cast(Callable, self.server.get_app()))

    def _body(self, received: bytes, deadline: float) -> bytes | None:
        """The request's body (Content-Length bytes), within the same deadline."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.send_error(413 if length > 0 else 400)
            return None
        body = receive_until(self.connection, received, lambda d: len(d) >= length,
                             deadline, MAX_BODY_BYTES)
        return None if body is None else body[:length]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass


#: How often the index page reloads itself: it follows the polls like ``tpumon watch``.
REFRESH_SECONDS = 10


@functools.cache
def _templates() -> jinja2.Environment:
    """Made at the first page asked for: jinja2 is ~1.9 MiB of RSS that an agent only
    scraped for /metrics never needs (docs/benchmarks.md)."""
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("tpumon.web", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined)


def landing_page(snap: PollState) -> str:
    """A small human page like node_exporter's: who am I, what do I see, where are metrics.
    Its chips are the status document's (a chip whose job ended shows no forecast there),
    written by the same functions as status and /report."""
    chips = []
    for c in status_document(snap)["chips"]:
        said = c["verdict"] is not None
        row = {"chip": c["chip"], "hbm": None,
               "verdict": f"{verdict_label(c['verdict'])}: {c['reason']}" if said else "",
               "growth": describe_growth(c["growth_bytes_per_step"], c["growth_bytes_per_hour"])
               if said else "-",
               "oom": oom_cell(c["time_to_oom_seconds"], c["growth_bytes_per_hour"])
               if said else "-"}
        if c["up"]:
            total = c["hbm_total_bytes"] or 0
            row["hbm"] = f"{format_bytes(c['hbm_used_bytes'])} / {format_bytes(total)}"
            row["used"] = f"{100 * c['hbm_used_bytes'] / total:.1f} %" if total else "?"
        chips.append(row)
    return _templates().get_template("index.html.j2").render(
        version=__version__, chips=chips, sources=snap.health, refresh_seconds=REFRESH_SECONDS,
        identity=[(k, v) for k, v in snap.identity.labels().items() if v])  # known ones only


def _app(registry: CollectorRegistry, get_snapshot: Callable[[], PollState],
         report: Callable[[], Answer] | None = None,
         snapshot_request: snapshot_api.Request | None = None,
         readers: Readers = NO_READERS) -> Callable:
    metrics_app = exposition_app(registry)
    report_app = None if report is None else _report_app(report)

    def route(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/api/snapshot":
            status, doc = snapshot_api.handle(environ, get_snapshot(), snapshot_request)
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(doc).encode()]
        if path == "/":
            body = landing_page(get_snapshot()).encode()
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [body]
        if path == "/api/status":
            body = json.dumps(status_document(get_snapshot(), readers=readers)).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if path == "/-/healthy":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"OK\n"]
        if path == "/favicon.ico":  # every browser asks; a 404 is a console error in each
            start_response("204 No Content", [])
            return []
        if path == "/report" and report_app is not None:
            return report_app(environ, start_response)
        if path == "/report":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"No history store: the agent keeps one with --state-dir.\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not found. Metrics are at /metrics.\n"]

    return _methods(route)


#: /report answers in progress at once (the one drawing, and pages of a few MiB being sent
#: to clients that may read slowly, SEND_TIMEOUT per send); past them, 503 at once. So
#: /report never holds more than these of the server's 64 connection slots
#: (connections.py), and a scrape always finds one.
REPORT_SLOTS = 3
REPORT_BUSY = Answer("503 Service Unavailable",
                     b"Too many report requests at once; try again in a few seconds.\n", 5)


def _report_app(report: Callable[[], Answer]) -> Callable:
    """/report with at most REPORT_SLOTS answers in progress. A slot is held until the
    server is done sending (the body's close(), which WSGI servers call after the last
    byte or on an error), not just until ``report`` returns."""
    slots = threading.BoundedSemaphore(REPORT_SLOTS)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if not slots.acquire(blocking=False):
            return _send_answer(REPORT_BUSY, start_response)
        try:
            answer = report()
        except BaseException:
            slots.release()
            raise
        return _Releasing(_send_answer(answer, start_response), slots.release)

    return app


def _send_answer(answer: Answer, start_response: Callable) -> list[bytes]:
    ok = answer.status.startswith("200")
    headers = [("Content-Type", "text/html; charset=utf-8" if ok else "text/plain")]
    if answer.retry_after:
        headers.append(("Retry-After", str(answer.retry_after)))
    start_response(answer.status, headers)
    return [answer.body]


class _Releasing:
    """A response body that calls ``release`` once when the server closes it."""

    def __init__(self, body: list[bytes], release: Callable[[], None]) -> None:
        self._body = body
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def _methods(route: Callable) -> Callable:
    """GET and HEAD everywhere but /api/snapshot (POST only); anything else is 405 with
    Allow. HEAD is answered like GET with the same headers (Content-Length included) and
    no body, as Prometheus' own exporters do."""
    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        allowed = ("POST",) if environ.get("PATH_INFO") == "/api/snapshot" else ("GET", "HEAD")
        if method not in allowed:
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"),
                                                      ("Allow", ", ".join(allowed))])
            return [f"{method[:16]} is not allowed here; use {' or '.join(allowed)}\n"
                    .encode()]
        if method != "HEAD":
            return route(environ, start_response)
        answer: list = []
        result = route({**environ, "REQUEST_METHOD": "GET"},
                       lambda status, headers, exc_info=None: answer.extend((status, headers)))
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):  # as a WSGI server would (/report frees its slot)
                result.close()
        status, headers = answer
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = [*headers, ("Content-Length", str(len(body)))]
        start_response(status, headers)
        return []

    return app


#: What socketserver hands a server's request methods (a stream server's is a socket).
_Request = socket.socket | tuple[bytes, socket.socket]


class _Server(ThreadingWSGIServer):
    """prometheus-client's threading WSGI server, with TLS per connection when the web
    configuration has it, and quiet about clients that go away."""

    web: LiveWebConfig | None = None
    request_queue_size = 1024  # the listen backlog: a burst of connects is not SYN-dropped
    # handle_request() is called when a connection waits; should it be gone by then, it
    # returns rather than block the serving loop until the next one
    timeout = 0.0

    def server_activate(self) -> None:
        self.connections = Connections()
        super().server_activate()

    def process_request(self, request: Any, client_address: tuple) -> None:
        """A thread for the connection if connections.py's bound lets it in."""
        if not self.connections.admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.connections.release(request)
        super().shutdown_request(request)

    def finish_request(self, request: _Request, client_address: tuple) -> None:
        context = self.web.current()[1] if self.web is not None else None
        if context is None or not isinstance(request, socket.socket):
            super().finish_request(request, client_address)
            return
        conn = _tls_accept(context, request, client_address)
        if conn is None:
            return
        self.connections.replace(request, conn)
        try:
            super().finish_request(conn, client_address)
        finally:
            self.connections.release(conn)
            _tls_close(conn)

    def handle_error(self, request: _Request, client_address: tuple) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # a reset, a timeout, a TLS alert: the client's business
            log.debug("connection from %s: %s", client_address[0], exc)
            return
        super().handle_error(request, client_address)


def _tls_accept(context: ssl.SSLContext, sock: socket.socket,
                client_address: tuple) -> ssl.SSLSocket | None:
    """The TLS handshake on this connection's thread; None (logged at debug) if it fails.
    A plain HTTP request gets Go's 400 answer, so curl and browsers say what is wrong."""
    sock.settimeout(TLS_TIMEOUT)
    try:
        first = sock.recv(1, socket.MSG_PEEK)
        if not first:  # connected and closed: a port check
            return None
        if first != b"\x16":  # not a TLS handshake record
            log.debug("not a TLS handshake from %s", client_address[0])
            if first.isalpha():
                sock.sendall(PLAIN_HTTP_ON_TLS)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(1.0)
                for _ in range(16):  # read the request, so that closing does not reset
                    if not sock.recv(65536):
                        break
            return None
        return context.wrap_socket(sock, server_side=True)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
        return None


def _tls_close(conn: ssl.SSLSocket) -> None:
    """Send TLS close_notify without waiting for the client's, then close."""
    try:
        conn.setblocking(False)
        conn.unwrap()
    except (OSError, ValueError):
        pass
    finally:
        conn.close()



class _Server6(_Server):
    """The same, listening on an IPv6 address."""

    address_family = socket.AF_INET6

class MetricsServer:
    """Binds HOST:PORT first (so a clash fails before anything else starts), serves at once
    (503 until :meth:`attach` supplies the registry), and stops on :meth:`stop`.

    ``web_config_file``: an exporter-toolkit web configuration (TLS, client certificates,
    basic auth), read and checked in :meth:`start` before binding (ConfigError)."""

    def __init__(self, address: str, web_config_file: str = "") -> None:
        self._address = address
        self._web_config_file = web_config_file
        self._web: LiveWebConfig | None = None
        self._app: Callable | None = None
        self._server: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._wakeup = socket.socketpair()  # stop() writes, the serving loop wakes

    @property
    def scheme(self) -> str:
        """'https' when serving TLS."""
        return "https" if self._web is not None and self._web.context is not None else "http"

    def describe(self) -> str:
        """How the endpoint is protected, for the start-up line ('' when it is not)."""
        return self._web.config.describe() if self._web is not None else ""

    def attach(self, registry: CollectorRegistry, get_snapshot: Callable[[], PollState],
               report: Callable[[], Answer] | None = None,
               snapshot_request: snapshot_api.Request | None = None,
               readers: Readers = NO_READERS) -> None:
        """Serve the agent: its registry, its poll states, ``report`` at /report (the HTML
        of ``tpumon report``, when the agent keeps a history store; at most REPORT_SLOTS
        answers in progress, so it never crowds out a scrape), with a reporter
        socket tensor snapshot requests at /api/snapshot, and in /api/status the health
        ``readers`` (the store, the notifiers) give of themselves."""
        self._app = _app(registry, get_snapshot, report, snapshot_request, readers)

    def _dispatch(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if self._app is None:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"starting\n"]
        return self._app(environ, start_response)

    def start(self) -> tuple[str, int]:
        """Bind and serve on a daemon thread; returns the bound (host, port)."""
        host, port = parse_listen_address(self._address)
        if self._web_config_file:
            self._web = LiveWebConfig(self._web_config_file)
        app = self._dispatch if self._web is None else protect(self._dispatch, self._web)
        try:
            self._server = make_server(host or "0.0.0.0", port, app,
                                       _Server6 if ":" in host else _Server,
                                       handler_class=_Handler)
            self._server.web = self._web  # read per connection, so set before serving
        except OSError as exc:
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ListenError(f"cannot listen on {self._address} (exporter.listen_address): "
                              f"{reason or exc}") from None
        if self.scheme == "https":
            self._server.base_environ["HTTPS"] = "on"  # wsgi.url_scheme
        self._thread = threading.Thread(target=self._serve, args=(self._server,),
                                        name="tpumon-http", daemon=True)
        self._thread.start()
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def _serve(self, server: ThreadingWSGIServer) -> None:
        """Accept connections until :meth:`stop` writes to the wake-up socket. Asleep in
        select() in between, with no timeout: stdlib's serve_forever() looks at a shutdown
        flag every 0.5 s, two wake-ups a second for nothing (~0.02 % of a core)."""
        with selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_READ)
            selector.register(self._wakeup[0], selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wakeup[0] in ready:
                    return
                server.handle_request()  # a connection waits: accept it, at once

    def stop(self) -> None:
        """Stop accepting (a request in progress finishes on its own thread), then close."""
        if self._server is None:
            return
        self._wakeup[1].send(b"x")
        if self._thread is not None:
            self._thread.join(5.0)
        self._server.server_close()
        self._server = None
        for end in self._wakeup:
            end.close()
