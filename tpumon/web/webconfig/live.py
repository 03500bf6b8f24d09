"""TLS, client certificates and basic auth for the exporter, configured like every
Prometheus exporter: a web configuration file in the exporter-toolkit format (node_exporter's
``--web.config.file``; ``promtool check web-config`` validates it).

Supported, with the exporter-toolkit's meaning and defaults::

    tls_server_config:
      cert_file, key_file              # PEM; relative paths are relative to this file
      client_auth_type                 # NoClientCert, VerifyClientCertIfGiven,
                                       # RequireAndVerifyClientCert (these need client_ca_file)
      client_ca_file
      min_version, max_version         # TLS12, TLS13
      cipher_suites                    # Go's names, for TLS 1.2 (TLS 1.3's: no effect, as in Go)
      prefer_server_cipher_suites
    http_server_config:
      http2                            # accepted; tpumon serves HTTP/1.1 only
      headers                          # the five the exporter-toolkit allows
    basic_auth_users:                  # user: bcrypt hash
      alice: $2y$10$...

The format itself is declared in file.py and schema.py (a pydantic schema). Rejected with one
line naming the file and the key: unknown keys (and duplicates), what
Python's ssl module cannot do (RequestClientCert and RequireAnyClientCert, which ask for a
client certificate without verifying it; TLS10 and TLS11; curve_preferences), keys of newer
exporter-toolkit versions that Prometheus 2.42's promtool does not know either, client
certificate policies without client_ca_file, unreadable or mismatched certificates and keys,
encrypted keys, and passwords that are not bcrypt hashes.

Like the exporter-toolkit, the file and the certificates it names are read again when they
change (checked on every connection), so a renewed certificate or a new user needs no
restart; a change that does not load is logged and the previous configuration kept.
Turning TLS on or off takes a restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tpumon.common.config import ConfigError
from tpumon.web.webconfig.file import TLSSettings, WebConfig, load_web_config
from tpumon.web.webconfig.terms import (CIPHERS_TLS12, CIPHERS_TLS13, CLIENT_AUTH,
                                        TLS_VERSIONS)

__all__ = ["CIPHERS_TLS12", "CIPHERS_TLS13", "BasicAuth", "LiveWebConfig", "WebConfig",
           "build_ssl_context", "load_web_config", "protect"]

log = logging.getLogger("tpumon.exporter")

BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt ignores the rest, so longer ones are refused
REALM = "tpumon"


def build_ssl_context(tls: TLSSettings, where: str) -> ssl.SSLContext:
    """The server's TLS context, with every file read and checked; ConfigError if not."""
    p = "tls_server_config."
    for label, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file),
                        ("client_ca_file", tls.client_ca_file)):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{where}: {p}{label} {path}: cannot read it: "
                              f"{exc.strerror or exc}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    asked: list[bool] = []

    def password() -> bytes:  # called only for an encrypted key; never prompt on a terminal
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=password)
    except ssl.SSLError as exc:
        if asked:
            raise ConfigError(f"{where}: {p}key_file {tls.key_file} is encrypted; tpumon needs "
                              "it unencrypted (readable by the agent only)") from None
        raise ConfigError(f"{where}: {p}cert_file {tls.cert_file} and key_file "
                          f"{tls.key_file}: not a PEM certificate and its private key "
                          f"({_ssl_reason(exc)})") from None
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except ssl.SSLError as exc:
            raise ConfigError(f"{where}: {p}client_ca_file {tls.client_ca_file}: no PEM CA "
                              f"certificate in it ({_ssl_reason(exc)})") from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    names = [CIPHERS_TLS12[s] for s in tls.cipher_suites if s in CIPHERS_TLS12]
    if names:
        try:
            context.set_ciphers(":".join(names))
        except ssl.SSLError:
            raise ConfigError(f"{where}: {p}cipher_suites: none of them is available in this "
                              f"OpenSSL ({ssl.OPENSSL_VERSION})") from None
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _ssl_reason(exc: ssl.SSLError) -> str:
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(exc))


class LiveWebConfig:
    """The web configuration in force: loaded and checked at start-up (ConfigError), then
    read again whenever the file or a certificate it names changes, like the exporter-
    toolkit does, so certificates can be renewed in place. A change that does not load is
    logged once and the previous configuration stays."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.config, self.context = self._load()
        self._signature = self._stat(self._watched(self.config))

    def _load(self) -> tuple[WebConfig, ssl.SSLContext | None]:
        config = load_web_config(self.path)
        where = f"web config file {self.path}"
        context = build_ssl_context(config.tls, where) if config.tls else None
        return config, context

    def _watched(self, config: WebConfig | None) -> tuple[Path, ...]:
        return (self.path,) + (config.tls.files() if config and config.tls else ())

    @staticmethod
    def _stat(paths: Iterable[Path]) -> tuple:
        def one(path: Path) -> tuple | None:
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_ino, st.st_size, st.st_mtime_ns

        return tuple(one(p) for p in paths)

    def current(self) -> tuple[WebConfig, ssl.SSLContext | None]:
        """The configuration and TLS context for a new connection or request."""
        with self._lock:
            signature = self._stat(self._watched(self.config))
            if signature != self._signature:
                self._signature = signature
                try:
                    config, context = self._load()
                    if (config.tls is None) != (self.config.tls is None):
                        raise ConfigError(f"web config file {self.path}: turning TLS on or off "
                                          "takes a restart of the agent")
                except ConfigError as exc:
                    log.warning("%s; keeping the previous web configuration", exc)
                else:
                    if self._watched(config) != self._watched(self.config):
                        self._signature = self._stat(self._watched(config))
                    self.config, self.context = config, context
                    log.info("web config file %s reloaded (%s)", self.path, config.describe())
            return self.config, self.context


# A bcrypt hash of "fakepassword" (the exporter-toolkit's): checked for unknown users too, so
# that timing does not tell which users exist.
_FAKE_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


class Throttled(Exception):
    """Credentials not checked now: too many wrong ones from this client lately, or too
    many bcrypt checks running or waiting (answered 429, try again shortly)."""


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, so that wrong passwords
    cannot starve the right one (docs/security.md).

    bcrypt is slow on purpose (~60 ms at cost 10 here), so results are cached, keyed by an
    HMAC of (user, hash, password) under a per-process random key (the password itself is
    kept nowhere). Successes and failures are cached apart: a flood of wrong passwords
    evicts only other failures, never a scraper's verified credentials. Only one bcrypt
    runs at a time and at most HASH_QUEUE run or wait; past that, and for a client that
    sent FAILURES_PER_CLIENT new wrong credentials in the last FAILURE_WINDOW seconds,
    uncached credentials are not checked at all (:class:`Throttled`), while cached ones
    are answered at once, right or wrong."""

    CACHE_SIZE = 100  # verified credentials, evicted only by other verified ones
    FAILED_CACHE_SIZE = 1000
    HASH_QUEUE = 4
    FAILURES_PER_CLIENT = 10
    FAILURE_WINDOW = 10.0
    CLIENTS = 1024  # clients whose recent failures are remembered

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._secret = os.urandom(32)
        self._clock = clock
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()
        self._hash_slots = threading.BoundedSemaphore(self.HASH_QUEUE)

    def check(self, users: Mapping[str, bytes], header: str | None,
              client: str = "") -> str | None:
        """The authenticated user, or None; :class:`Throttled` when not checked now."""
        credentials = _parse_basic(header)
        if credentials is None:
            return None
        user, password = credentials
        hashed = users.get(user)
        known = hashed is not None
        hashed = hashed if hashed is not None else _FAKE_HASH
        key = hmac.new(self._secret, repr((user, hashed, password)).encode(),
                       hashlib.sha256).digest()
        with self._cache_lock:
            if key in self._good:
                self._good.move_to_end(key)
                return user
            if key in self._bad:  # known wrong: costs nothing, so not held against anyone
                return None
            if self._throttled(client):
                raise Throttled(client)
        if not self._hash_slots.acquire(blocking=False):
            raise Throttled(client)
        try:
            ok = self._bcrypt(password, hashed) and known
        finally:
            self._hash_slots.release()
        with self._cache_lock:
            cache, size = (self._good, self.CACHE_SIZE) if ok else (
                self._bad, self.FAILED_CACHE_SIZE)
            cache[key] = None
            while len(cache) > size:
                cache.popitem(last=False)
            if not ok:
                self._failed(client)
        return user if ok else None

    def _recent(self, client: str) -> deque[float]:
        """The client's failures within FAILURE_WINDOW (under the cache lock)."""
        times = self._failures.get(client)
        if times is None:
            times = self._failures[client] = deque(maxlen=self.FAILURES_PER_CLIENT)
            while len(self._failures) > self.CLIENTS:
                self._failures.popitem(last=False)
        while times and times[0] < self._clock() - self.FAILURE_WINDOW:
            times.popleft()
        return times

    def _throttled(self, client: str) -> bool:
        return len(self._recent(client)) >= self.FAILURES_PER_CLIENT

    def _failed(self, client: str) -> None:
        self._recent(client).append(self._clock())
        self._failures.move_to_end(client)

    def _bcrypt(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt  # only where basic auth is configured (0.4 MiB of RSS otherwise)

        too_long = len(password) > BCRYPT_MAX_PASSWORD  # checked anyway: the same time
        with self._bcrypt_lock:
            try:
                match = bcrypt.checkpw(b"" if too_long else password,
                                       _FAKE_HASH if too_long else hashed)
            except ValueError:
                match = False
        return match and not too_long


def _parse_basic(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        return user.decode("utf-8"), password
    except (binascii.Error, UnicodeDecodeError):
        return None


def protect(app: Callable, live: LiveWebConfig) -> Callable:
    """WSGI middleware in front of the whole exporter (/metrics, /, /api/status and
    /-/healthy alike, as the exporter-toolkit does): the configured headers on every
    response, and 401 without valid basic auth credentials when users are configured."""
    auth = BasicAuth()
    challenge = ("WWW-Authenticate", f'Basic realm="{REALM}"')

    def app_with_auth(environ: dict, start_response: Callable) -> Iterable[bytes]:
        config, _ = live.current()

        def start(status: str, headers: list, exc_info: Any = None) -> Callable:
            if config.headers:
                names = {name.lower() for name, _ in config.headers}
                headers = [h for h in headers if h[0].lower() not in names]
                headers.extend(config.headers)
            return start_response(status, headers, exc_info)

        if not config.users:
            return app(environ, start)
        client = environ.get("REMOTE_ADDR", "")
        try:
            user = auth.check(config.users, environ.get("HTTP_AUTHORIZATION"), client)
        except Throttled:
            log.debug("429 for %s %s from %s", environ.get("REQUEST_METHOD"),
                      environ.get("PATH_INFO"), client)
            start("429 Too Many Requests", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("Retry-After", "1")])
            return [b"Too many wrong credentials lately; try again shortly\n"]
        if user is None:
            log.debug("401 for %s %s from %s", environ.get("REQUEST_METHOD"),
                      environ.get("PATH_INFO"), client)
            start("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"), challenge])
            return [b"Unauthorized\n"]
        return app(environ, start)

    return app_with_auth
