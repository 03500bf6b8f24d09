"""The slice as one view: every worker's agent asked at once, every chip in one table.

The jobs tpumon watches run SPMD over several TPU VMs; the sick chip of a 32-chip slice
should be one command away, not eight ssh sessions. Peers come from ``--peers``, from a
Kubernetes headless service (one DNS name, one address per pod) or from the TPU VM's
metadata (``worker-network-endpoints`` lists every worker, worker 0 first). Each agent's
``/api/status`` is asked concurrently (a bounded number at a time) under one deadline; a
worker that does not answer is a row that says so (down or late) and never hides the
others, and a late one is not waited on.
"""

from __future__ import annotations

import json
import math
import queue
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping

from tpumon.client.http import AgentError, ClientAuth
from tpumon.common.describe import chip_time_to_oom, describe_time_left, summarize_verdicts
from tpumon.common.identity import fetch_metadata_attribute, parse_worker_endpoints

MAX_STATUS_BYTES = 16 * 2**20  # a status document of hundreds of chips is well under this


class SliceError(Exception):
    """Peers cannot be found or the client options are unusable: one line saying why."""


@dataclass(frozen=True)
class ClientOptions:
    """How to reach agents behind exporter.web_config_file: the status command's --agent-*
    options (a CA, a client certificate, basic auth), and whether they serve HTTPS."""

    tls: bool = False
    auth: ClientAuth = field(default_factory=ClientAuth)

    @property
    def scheme(self) -> str:
        return "https" if self.tls or self.auth.ca_file or self.auth.cert_file else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "https":
            return None
        try:
            return self.auth.ssl_context()
        except AgentError as exc:
            raise SliceError(str(exc)) from None

    def headers(self) -> dict[str, str]:
        try:
            return self.auth.headers()
        except AgentError as exc:
            raise SliceError(str(exc)) from None


# ------------------------------------------------------------------ finding the peers


def split_peers(raw: str) -> list[str]:
    """--peers 'HOST:PORT,HOST:PORT' (a bare HOST gets the agent port later)."""
    return [p.strip() for p in raw.split(",") if p.strip()]


def peers_from_metadata(timeout: float, env: Mapping[str, str] | None = None) -> list[str]:
    """Every worker's address from this TPU VM's metadata, worker 0 first."""
    text = fetch_metadata_attribute("worker-network-endpoints", timeout, env)
    addresses = parse_worker_endpoints(text or "")
    if not addresses:
        raise SliceError("no peers: this VM's metadata has no worker-network-endpoints (not "
                         "a TPU VM?); give --peers HOST:PORT,... or --service NAME")
    return addresses


def peers_from_service(name: str) -> list[str]:
    """The addresses a Kubernetes headless service name resolves to (one per pod)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise SliceError(f"--service {name}: cannot resolve it: {exc}") from None
    return sorted({str(info[4][0]) for info in infos}, key=_address_order)


def _address_order(address: str) -> tuple:
    try:
        return (0, socket.inet_pton(socket.AF_INET, address))
    except OSError:
        return (1, address.encode())


def peer_url(peer: str, port: int, scheme: str) -> str:
    """'10.0.0.2' -> 'http://10.0.0.2:9847'; 'h:1234' and full URLs are kept."""
    if "://" in peer:
        return peer.rstrip("/")
    host, sep, given = peer.rpartition(":")
    if sep and given.isdigit() and host and (":" not in host or host.startswith("[")):
        return f"{scheme}://{peer}"
    bracketed = f"[{peer}]" if ":" in peer else peer
    return f"{scheme}://{bracketed}:{port}"


# ------------------------------------------------------------------ asking them


#: Requests in flight at once. A request holds its thread while it waits, so this many
#: down or slow peers can be waited on together before a healthy one queues behind them:
#: 256 keeps 20 % of a 1,024-worker pod (205 peers) from ever filling it (docs/pods.md).
MAX_IN_FLIGHT = 256


@dataclass(frozen=True)
class WorkerAnswer:
    """One peer's status document, or why there is none: ``state`` is "up", "down" (no
    connection, or an answer that is not a status document) or "late" (no answer by the
    deadline: not waited on)."""

    peer: str
    url: str
    document: Mapping[str, Any] | None = None
    error: str | None = None
    state: str = "up"


class PeerLate(Exception):
    """The agent took the connection but did not answer in time."""


def fetch_status(url: str, options: ClientOptions, timeout: float,
                 context: ssl.SSLContext | None = None,
                 headers: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """An agent's /api/status; raises PeerLate when it connected but did not answer
    within ``timeout`` seconds, OSError or ValueError (the peer is down) otherwise, each
    with a one-line reason."""
    request = urllib.request.Request(f"{url}/api/status", headers=dict(headers or {}))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=timeout) as response:
            body = response.read(MAX_STATUS_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:  # while connecting (TLS included)
        if isinstance(exc.reason, TimeoutError):
            raise OSError(f"no connection within {timeout:.2g} s") from None
        raise OSError(str(exc.reason)) from None
    except TimeoutError:  # connected; the answer (or its end) did not come
        raise PeerLate(f"no answer within {timeout:.2g} s") from None
    if len(body) > MAX_STATUS_BYTES:
        raise ValueError("status document too large")
    document = json.loads(body)
    if not isinstance(document, dict) or not isinstance(document.get("chips"), list):
        raise ValueError("not a tpumon status document")
    return document


def ask_all(peers: list[str], port: int, options: ClientOptions, deadline: float,
            in_flight: int = MAX_IN_FLIGHT) -> list[WorkerAnswer]:
    """Every peer's status, at most ``in_flight`` asked at a time, all within ``deadline``
    seconds: each request's own timeout is the time left, and a peer that has not
    answered (or not been asked) by then is a "late" answer, not waited on.

    The requests run on daemon threads, not a ThreadPoolExecutor's: the interpreter joins
    those at exit, so a peer that trickles its answer would hold the command (and each
    round of ``watch --slice``) long after its deadline."""
    context, headers = options.ssl_context(), options.headers()
    urls = [peer_url(p, port, options.scheme) for p in peers]
    end = time.monotonic() + deadline
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(urls)):
        todo.put(i)
    done: queue.SimpleQueue[tuple[int, WorkerAnswer]] = queue.SimpleQueue()

    def asker() -> None:
        while (left := end - time.monotonic()) > 0:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            done.put((i, _ask(peers[i], urls[i], options, left, context, headers)))

    for _ in range(max(1, min(in_flight, len(urls)))):
        threading.Thread(target=asker, name="slice-ask", daemon=True).start()
    answers: dict[int, WorkerAnswer] = {}
    while len(answers) < len(urls) and (left := end - time.monotonic()) > 0:
        try:
            i, answer = done.get(timeout=left)
        except queue.Empty:
            break
        answers[i] = answer
    late = f"no answer within {deadline:g} s"
    return [answers.get(i) or WorkerAnswer(peer, url, error=late, state="late")
            for i, (peer, url) in enumerate(zip(peers, urls, strict=True))]


def _ask(peer: str, url: str, options: ClientOptions, timeout: float,
         context: ssl.SSLContext | None, headers: Mapping[str, str]) -> WorkerAnswer:
    try:
        return WorkerAnswer(peer, url, document=fetch_status(url, options, timeout, context,
                                                             headers))
    except PeerLate as exc:
        return WorkerAnswer(peer, url, error=str(exc), state="late")
    except Exception as exc:  # noqa: BLE001 (whatever a peer sends is its answer, never a
        # dead asker: OSError, json's ValueError, http.client's HTTPException for garbage)
        return WorkerAnswer(peer, url, error=str(exc) or type(exc).__name__, state="down")


# ------------------------------------------------------------------ the slice's view


@dataclass(frozen=True)
class ChipRow:
    """One chip of the slice as the table shows it."""

    worker: str
    host: str
    chip: str
    up: bool
    hbm_used_bytes: int | None
    hbm_total_bytes: int | None
    verdict: str | None
    growth_bytes_per_step: float | None
    growth_bytes_per_hour: float | None
    seconds_to_oom: float | None  # the agent's own figure, wherever it forecasts one

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SliceView:
    """Every answer and every chip, and the slice they say they belong to."""

    answers: list[WorkerAnswer]
    chips: list[ChipRow] = field(default_factory=list)
    slice: str = ""
    accelerator_type: str = ""
    slices_seen: tuple[str, ...] = ()

    @property
    def missing(self) -> list[WorkerAnswer]:
        return [a for a in self.answers if a.document is None]

    def leaking(self) -> list[ChipRow]:
        return [c for c in self.chips if c.verdict == "leak"]

    def first_oom(self) -> ChipRow | None:
        dated = [c for c in self.leaking() if c.seconds_to_oom is not None]
        return min(dated, key=lambda c: c.seconds_to_oom or 0.0) if dated else None

    def to_json(self) -> dict[str, Any]:
        return {"slice": self.slice, "accelerator_type": self.accelerator_type,
                "summary": summary_line(self),
                "workers": [{"peer": a.peer, "url": a.url, "up": a.document is not None,
                             "state": a.state, "error": a.error,
                             "identity": (a.document or {}).get("identity")}
                            for a in self.answers],
                "chips": [c.to_json() for c in self.chips]}


def _chip_rows(document: Mapping[str, Any]) -> list[ChipRow]:
    ident = document.get("identity") or {}
    rows = []
    for chip in document.get("chips", []):
        # the agent's own figure for this poll, as its status and pages show it
        left = chip_time_to_oom(chip, document.get("time"))
        eta = left if left is not None and math.isfinite(left) else None
        rows.append(ChipRow(str(ident.get("worker", "")), str(ident.get("host", "")),
                            str(chip.get("chip")), bool(chip.get("up")),
                            chip.get("hbm_used_bytes"), chip.get("hbm_total_bytes"),
                            chip.get("verdict"), chip.get("growth_bytes_per_step"),
                            chip.get("growth_bytes_per_hour"),
                            None if eta is None else max(eta, 0.0)))
    return rows


def _order(row: ChipRow) -> tuple:
    def number_first(text: str) -> tuple:
        return (0, int(text), "") if text.isdigit() else (1, 0, text)
    return (number_first(row.worker), row.host, number_first(row.chip))


def build_view(answers: list[WorkerAnswer]) -> SliceView:
    """The slice's chips, worker by worker, chip by chip."""
    rows: list[ChipRow] = []
    slices: list[str] = []
    accelerators: list[str] = []
    for answer in answers:
        if answer.document is None:
            continue
        ident = answer.document.get("identity") or {}
        slices.append(str(ident.get("slice", "")))
        accelerators.append(str(ident.get("accelerator_type", "")))
        rows.extend(_chip_rows(answer.document))
    seen = tuple(dict.fromkeys(s for s in slices if s))
    return SliceView(answers, sorted(rows, key=_order), seen[0] if seen else "",
                     next((a for a in accelerators if a), ""), seen)


def summary_line(view: SliceView) -> str:
    """'v4-32 slice my-tpu: 3 of 4 workers answered, 12 chips; 12 leaking, first OOM w-2
    chip 1 in 3 h 12 min; 1 down (10.0.0.4)'."""
    name = " ".join(p for p in (view.accelerator_type, "slice", view.slice) if p)
    answered = len(view.answers) - len(view.missing)
    line = f"{name}: {answered} of {len(view.answers)} workers answered, {len(view.chips)} chips"
    # what the chips' verdicts add up to, saying what is not known yet (never "no leak"
    # over chips still warming up or collecting)
    if view.chips:
        line += "; " + summarize_verdicts(c.verdict for c in view.chips).partition(": ")[2]
    first = view.first_oom()
    if first is not None and first.seconds_to_oom is not None:
        line += (f", first OOM w-{first.worker or '?'} chip {first.chip} in "
                 f"{describe_time_left(first.seconds_to_oom)}")
    if view.missing:
        line += "; " + missing_counts(view.missing)
    if len(view.slices_seen) > 1:
        line += f"; agents name different slices: {', '.join(view.slices_seen)}"
    return line


def missing_counts(missing: list[WorkerAnswer], named: int = 4) -> str:
    """'13 down, 2 late (10.0.0.4, 10.0.0.9, 10.0.0.17, 10.0.0.30, ...)': the first few
    peers only, so that the line stays a line at 256 workers (the table names them all)."""
    counts = {state: sum(a.state == state for a in missing) for state in ("down", "late")}
    peers = ", ".join([a.peer for a in missing[:named]] + ["..."] * (len(missing) > named))
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) + f" ({peers})"
