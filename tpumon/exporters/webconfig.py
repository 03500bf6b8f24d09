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

Rejected with one line naming the file and the key: unknown keys (and duplicates), what
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
import difflib
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tpumon.config import ConfigError

log = logging.getLogger("tpumon.exporter")

CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go asks for a certificate and takes any; OpenSSL verifies every certificate it asks for.
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
OLD_TLS_VERSIONS = ("TLS10", "TLS11")
# Go's tls.CipherSuites() names (the ones the exporter-toolkit accepts) -> OpenSSL's names.
CIPHERS_TLS12 = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3's suites are not configurable, in Go as in OpenSSL's cipher list: accepted, no effect.
CIPHERS_TLS13 = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                 "TLS_CHACHA20_POLY1305_SHA256")
# The only headers the exporter-toolkit lets a file set, and the values it allows (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "cipher_suites",
            "curve_preferences", "min_version", "max_version", "prefer_server_cipher_suites")
HTTP_KEYS = ("http2", "headers")
TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
# Keys of later exporter-toolkit versions (after the one in Prometheus 2.42's promtool).
NEWER_KEYS = {"tls_server_config.cert", "tls_server_config.key", "tls_server_config.client_ca",
              "tls_server_config.client_allowed_sans", "rate_limit"}
BCRYPT_HASH = re.compile(rb"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt ignores the rest, so longer ones are refused
REALM = "tpumon"


@dataclass(frozen=True)
class TLSSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + (
            (self.client_ca_file,) if self.client_ca_file else ())


@dataclass(frozen=True)
class WebConfig:
    """One web configuration file, parsed and checked (the files it names not yet read)."""

    path: Path
    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    http2: bool = True

    def describe(self) -> str:
        """'TLS, client certificate required, basic auth (2 users)': for the start-up line."""
        parts = ["TLS" if self.tls else "no TLS"]
        if self.tls and self.tls.client_auth_type == "RequireAndVerifyClientCert":
            parts.append("client certificate required")
        elif self.tls and self.tls.client_auth_type == "VerifyClientCertIfGiven":
            parts.append("client certificate verified if given")
        if self.users:
            parts.append(f"basic auth ({len(self.users)} user{'s' * (len(self.users) > 1)})")
        return ", ".join(parts)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check a web configuration file; ConfigError (one line) on any problem."""
    path = Path(path)
    where = f"web config file {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where} (exporter.web_config_file): cannot read it: "
                          f"{exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    from tpumon.exporters.strict_yaml import YAMLError, load_strict  # only with a file
    try:
        data = load_strict(text)
    except YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML{_yaml_where(exc)}") from None
    if data is None:
        data = {}
    top = _mapping(data, "", where)
    _known_keys(top, TOP_KEYS, "", where)
    tls = _tls_settings(_mapping(top.get("tls_server_config"), "tls_server_config", where),
                        path.parent, where)
    http = _mapping(top.get("http_server_config"), "http_server_config", where)
    _known_keys(http, HTTP_KEYS, "http_server_config.", where)
    http2 = http.get("http2", True)
    if not isinstance(http2, bool):
        raise ConfigError(f"{where}: http_server_config.http2 must be true or false")
    return WebConfig(path=path, tls=tls, http2=http2,
                     headers=_headers(_mapping(http.get("headers"),
                                               "http_server_config.headers", where), where),
                     users=_users(_mapping(top.get("basic_auth_users"), "basic_auth_users",
                                           where), where))


def _yaml_where(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{at}: {problem}"


def _mapping(value: Any, name: str, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {name or 'the file'} must be a mapping of keys to values")
    return value


def _known_keys(table: dict, known: Iterable[str], prefix: str, where: str) -> None:
    known = list(known)
    for key in table:
        dotted = f"{prefix}{key}"
        if dotted in NEWER_KEYS:
            raise ConfigError(f"{where}: {dotted} is not supported by tpumon (it follows the "
                              "web configuration format of Prometheus 2.42's promtool)")
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            suffix = f" (did you mean '{prefix}{hint[0]}'?)" if hint else ""
            raise ConfigError(f"{where}: unknown key '{dotted}'{suffix}")


def _string(table: dict, key: str, prefix: str, where: str) -> str:
    value = table.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {prefix}{key} must be a string")
    return value


def _tls_settings(table: dict, base: Path, where: str) -> TLSSettings | None:
    p = "tls_server_config."
    _known_keys(table, TLS_KEYS, p, where)
    cert, key = _string(table, "cert_file", p, where), _string(table, "key_file", p, where)
    auth = _string(table, "client_auth_type", p, where)
    ca = _string(table, "client_ca_file", p, where)
    if table.get("curve_preferences"):
        raise ConfigError(f"{where}: {p}curve_preferences is not supported by tpumon "
                          "(Python's ssl module cannot set a list of curves); remove it to "
                          "use OpenSSL's defaults (X25519, P-256, P-384, P-521)")
    versions = _tls_versions(table, p, where)
    suites = _cipher_suites(table, p, where)
    prefer = table.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise ConfigError(f"{where}: {p}prefer_server_cipher_suites must be true or false")
    if not (cert or key or auth or ca):
        return None  # as in the exporter-toolkit: no TLS (other keys have no effect then)
    if not cert:
        raise ConfigError(f"{where}: {p}cert_file is missing")
    if not key:
        raise ConfigError(f"{where}: {p}key_file is missing")
    _check_client_auth(auth, ca, p, where)
    return TLSSettings(cert_file=base / cert, key_file=base / key,
                       client_auth_type=auth or "NoClientCert",
                       client_ca_file=base / ca if ca else None,
                       min_version=versions["min_version"], max_version=versions["max_version"],
                       cipher_suites=tuple(suites), prefer_server_cipher_suites=prefer)


def _tls_versions(table: dict, p: str, where: str) -> dict[str, str]:
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = _string(table, name, p, where) or default
        if value in OLD_TLS_VERSIONS:
            raise ConfigError(f"{where}: {p}{name} {value} is not supported by tpumon "
                              "(TLS 1.0 and 1.1 are off in OpenSSL 3); use TLS12 or TLS13")
        if value not in TLS_VERSIONS:
            raise ConfigError(f"{where}: {p}{name}: unknown TLS version {value!r} "
                              "(TLS12 or TLS13)")
        versions[name] = value
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise ConfigError(f"{where}: {p}min_version is above max_version")
    return versions


def _cipher_suites(table: dict, p: str, where: str) -> list[str]:
    suites = table.get("cipher_suites") or []
    if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
        raise ConfigError(f"{where}: {p}cipher_suites must be a list of names")
    for suite in suites:
        if suite not in CIPHERS_TLS12 and suite not in CIPHERS_TLS13:
            raise ConfigError(f"{where}: {p}cipher_suites: unknown or insecure cipher suite "
                              f"{suite!r} (Go's names, such as "
                              "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
    return suites


def _check_client_auth(auth: str, ca: str, p: str, where: str) -> None:
    if auth in UNSUPPORTED_CLIENT_AUTH:
        raise ConfigError(f"{where}: {p}client_auth_type {auth} is not supported by tpumon "
                          "(OpenSSL verifies every client certificate it asks for); use "
                          "VerifyClientCertIfGiven or RequireAndVerifyClientCert with "
                          "client_ca_file")
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"{where}: {p}client_auth_type: unknown policy {auth!r} "
                          f"(one of {', '.join(k for k in CLIENT_AUTH if k)})")
    if ca and CLIENT_AUTH[auth] == ssl.CERT_NONE:
        raise ConfigError(f"{where}: {p}client_ca_file is set but client_auth_type is "
                          "NoClientCert (set RequireAndVerifyClientCert)")
    if not ca and CLIENT_AUTH[auth] != ssl.CERT_NONE:
        raise ConfigError(f"{where}: {p}client_auth_type {auth} needs client_ca_file (tpumon "
                          "does not trust the system's CAs for client certificates)")


def _headers(table: dict, where: str) -> tuple[tuple[str, str], ...]:
    headers = []
    for name, value in table.items():
        if name not in HEADERS:
            raise ConfigError(f"{where}: http_server_config.headers: header {name!r} cannot be "
                              f"configured (only {', '.join(HEADERS)})")
        value = "" if value is None else value
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise ConfigError(f"{where}: http_server_config.headers.{name} must be a one-line "
                              "string")
        allowed = HEADERS[name]
        if allowed and value and value not in allowed:
            raise ConfigError(f"{where}: http_server_config.headers.{name} must be one of "
                              f"{', '.join(allowed)} (got {value!r})")
        if value:  # blank: unset, as in the exporter-toolkit
            headers.append((name, value))
    return tuple(headers)


def _users(table: dict, where: str) -> dict[str, bytes]:
    users = {}
    for user, hashed in table.items():
        if not isinstance(user, str):
            raise ConfigError(f"{where}: basic_auth_users: user name {user!r} must be a string "
                              "(quote it)")
        name = f"basic_auth_users.{user}"
        # Never echo the value: it may be a plain password put there by mistake.
        if not isinstance(hashed, str):
            raise ConfigError(f"{where}: {name} must be a bcrypt hash string")
        raw = hashed.strip().encode()
        match = BCRYPT_HASH.match(raw)
        if not match:
            raise ConfigError(f"{where}: {name} is not a bcrypt hash (like $2y$10$ and 53 "
                              "characters; see 'Securing the endpoint' in docs/deploy.md)")
        if not 4 <= int(match.group(1)) <= 31:
            raise ConfigError(f"{where}: {name}: bcrypt cost {int(match.group(1))} is outside "
                              "4-31")
        if raw.startswith(b"$2$"):  # the original prefix, which Go accepts and reads as 2a
            raw = b"$2a$" + raw[3:]
        users[user] = raw
    return users


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
