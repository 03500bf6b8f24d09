"""The web configuration file's format (the exporter-toolkit's, as Prometheus 2.42's
promtool checks it), declared as a schema: pydantic models that forbid unknown keys and
check types and values, instead of hand-written walks over the YAML. ``load_web_config``
turns the first problem pydantic finds into one ConfigError line naming the file and the
key; ``webconfig.py`` builds the TLS context and serves with what this returns.

What Python's ssl module cannot honour is refused here, with the reason, rather than
emulated: asking for a client certificate without verifying it, TLS 1.0 and 1.1 (off in
OpenSSL 3), a list of curves; and keys of newer exporter-toolkit versions.
"""

from __future__ import annotations

import difflib
import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from tpumon.config import ConfigError

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
# Keys of later exporter-toolkit versions (after the one in Prometheus 2.42's promtool).
NEWER_KEYS = {"tls_server_config.cert", "tls_server_config.key", "tls_server_config.client_ca",
              "tls_server_config.client_allowed_sans", "rate_limit"}
BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
TLS = "tls_server_config."


class _Section(BaseModel):
    """A mapping of known keys only; YAML's null for a key is its default, as in Go."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) \
            else data


class TLSServerConfig(_Section):
    cert_file: str = ""
    key_file: str = ""
    client_auth_type: str = ""
    client_ca_file: str = ""
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: list[str] = []
    curve_preferences: list[Any] = []
    prefer_server_cipher_suites: bool = True

    @field_validator("client_auth_type")
    @classmethod
    def _policy(cls, auth: str) -> str:
        if auth in UNSUPPORTED_CLIENT_AUTH:
            raise ValueError(f"{TLS}client_auth_type {auth} is not supported by tpumon "
                             "(OpenSSL verifies every client certificate it asks for); use "
                             "VerifyClientCertIfGiven or RequireAndVerifyClientCert with "
                             "client_ca_file")
        if auth not in CLIENT_AUTH:
            raise ValueError(f"{TLS}client_auth_type: unknown policy {auth!r} "
                             f"(one of {', '.join(k for k in CLIENT_AUTH if k)})")
        return auth

    @field_validator("min_version", "max_version")
    @classmethod
    def _version(cls, value: str, info: Any) -> str:
        value = value or ("TLS12" if info.field_name == "min_version" else "TLS13")
        if value in OLD_TLS_VERSIONS:
            raise ValueError(f"{TLS}{info.field_name} {value} is not supported by tpumon "
                             "(TLS 1.0 and 1.1 are off in OpenSSL 3); use TLS12 or TLS13")
        if value not in TLS_VERSIONS:
            raise ValueError(f"{TLS}{info.field_name}: unknown TLS version {value!r} "
                             "(TLS12 or TLS13)")
        return value

    @field_validator("cipher_suites")
    @classmethod
    def _suites(cls, suites: list[str]) -> list[str]:
        for suite in suites:
            if suite not in CIPHERS_TLS12 and suite not in CIPHERS_TLS13:
                raise ValueError(f"{TLS}cipher_suites: unknown or insecure cipher suite "
                                 f"{suite!r} (Go's names, such as "
                                 "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
        return suites

    @field_validator("curve_preferences")
    @classmethod
    def _curves(cls, curves: list[Any]) -> list[Any]:
        if curves:
            raise ValueError(f"{TLS}curve_preferences is not supported by tpumon (Python's "
                             "ssl module cannot set a list of curves); remove it to use "
                             "OpenSSL's defaults (X25519, P-256, P-384, P-521)")
        return curves

    @model_validator(mode="after")
    def _consistent(self) -> TLSServerConfig:
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            raise ValueError(f"{TLS}min_version is above max_version")
        if not self.enabled:
            return self  # as in the exporter-toolkit: no TLS (other keys have no effect then)
        for key in ("cert_file", "key_file"):
            if not getattr(self, key):
                raise ValueError(f"{TLS}{key} is missing")
        verify = CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file and verify == ssl.CERT_NONE:
            raise ValueError(f"{TLS}client_ca_file is set but client_auth_type is "
                             "NoClientCert (set RequireAndVerifyClientCert)")
        if not self.client_ca_file and verify != ssl.CERT_NONE:
            raise ValueError(f"{TLS}client_auth_type {self.client_auth_type} needs "
                             "client_ca_file (tpumon does not trust the system's CAs for "
                             "client certificates)")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.client_auth_type
                    or self.client_ca_file)


class HTTPServerConfig(_Section):
    http2: bool = True  # accepted; tpumon serves HTTP/1.1 only
    headers: dict[str, str | None] = {}

    @field_validator("headers")
    @classmethod
    def _allowed(cls, headers: dict[str, str | None]) -> dict[str, str | None]:
        for name, value in headers.items():
            where = f"http_server_config.headers.{name}"
            if name not in HEADERS:
                raise ValueError(f"http_server_config.headers: header {name!r} cannot be "
                                 f"configured (only {', '.join(HEADERS)})")
            if value is not None and ("\n" in value or "\r" in value):
                raise ValueError(f"{where} must be a one-line string")
            allowed = HEADERS[name]
            if allowed and value and value not in allowed:
                raise ValueError(f"{where} must be one of {', '.join(allowed)} "
                                 f"(got {value!r})")
        return headers


class WebConfigFile(_Section):
    """The whole file."""

    tls_server_config: TLSServerConfig = TLSServerConfig()
    http_server_config: HTTPServerConfig = HTTPServerConfig()
    basic_auth_users: dict[str, str] = {}

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            name = f"basic_auth_users.{user}"  # never echo the value: it may be a password
            match = BCRYPT_HASH.match(hashed.strip())
            if not match:
                raise ValueError(f"{name} is not a bcrypt hash (like $2y$10$ and 53 "
                                 "characters; see 'Securing the endpoint' in docs/deploy.md)")
            if not 4 <= int(match.group(1)) <= 31:
                raise ValueError(f"{name}: bcrypt cost {int(match.group(1))} is outside 4-31")
        return users


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


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing duplicate keys like Go's yaml.UnmarshalStrict."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: the schema says so
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice", key_node.start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


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
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML{_yaml_where(exc)}") from None
    try:
        parsed = WebConfigFile.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_problem(exc.errors()[0])}") from None
    return _settings(parsed, path)


def _settings(parsed: WebConfigFile, path: Path) -> WebConfig:
    tls, base = parsed.tls_server_config, path.parent
    http = parsed.http_server_config
    users = {user: re.sub(r"^\$2\$", "$2a$", hashed.strip()).encode()  # Go reads $2$ as 2a
             for user, hashed in parsed.basic_auth_users.items()}
    return WebConfig(
        path=path, http2=http.http2, users=users,
        headers=tuple((name, value) for name, value in http.headers.items() if value),
        tls=None if not tls.enabled else TLSSettings(
            cert_file=base / tls.cert_file, key_file=base / tls.key_file,
            client_auth_type=tls.client_auth_type or "NoClientCert",
            client_ca_file=base / tls.client_ca_file if tls.client_ca_file else None,
            min_version=tls.min_version, max_version=tls.max_version,
            cipher_suites=tuple(tls.cipher_suites),
            prefer_server_cipher_suites=tls.prefer_server_cipher_suites))


_KNOWN: dict[str, type[BaseModel]] = {"": WebConfigFile, "tls_server_config": TLSServerConfig,
          "http_server_config": HTTPServerConfig}
_TYPES = {"bool_type": "must be true or false", "string_type": "must be a string",
          "list_type": "must be a list of names",
          "model_type": "must be a mapping of keys to values",
          "dict_type": "must be a mapping of keys to values"}


def _problem(error: ErrorDetails) -> str:
    """pydantic's error as tpumon's one line: the dotted key, and what is wrong with it
    (a validator's own message as it is; never the value, which may be a password)."""
    loc = [str(part) for part in error["loc"]]
    dotted = ".".join(loc)
    kind = error["type"]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "extra_forbidden":
        if dotted in NEWER_KEYS:
            return (f"{dotted} is not supported by tpumon (it follows the web configuration "
                    "format of Prometheus 2.42's promtool)")
        section, key = ".".join(loc[:-1]), loc[-1]
        known = list(_KNOWN[section].model_fields) if section in _KNOWN else []
        hint = difflib.get_close_matches(key, known, n=1)
        prefix = f"{section}." if section else ""
        return f"unknown key '{dotted}'" + (f" (did you mean '{prefix}{hint[0]}'?)" if hint
                                            else "")
    if loc[:1] == ["basic_auth_users"] and loc[-1:] == ["[key]"]:
        return f"basic_auth_users: user name {error['input']!r} must be a string (quote it)"
    if dotted.startswith("basic_auth_users.") and kind == "string_type":
        return f"{dotted} must be a bcrypt hash string"
    if dotted.startswith("http_server_config.headers.") and kind == "string_type":
        return f"{dotted} must be a one-line string"
    return f"{dotted or 'the file'} {_TYPES.get(kind, 'is not valid: ' + error['msg'])}"


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{at}: {problem}"
