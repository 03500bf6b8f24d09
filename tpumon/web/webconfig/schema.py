"""The web configuration file's format as a schema: pydantic models that forbid unknown
keys, check types strictly and say what is wrong with a value, instead of hand-written
walks over the YAML; and ``problem``, which words pydantic's error as tpumon's one line.
Imported only when a web configuration file is loaded (``file.py``).
"""

from __future__ import annotations

import difflib
import ssl
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from pydantic_core import ErrorDetails

from tpumon.web.webconfig.terms import (BCRYPT_HASH, CIPHERS_TLS12, CIPHERS_TLS13,
                                        CLIENT_AUTH, HEADERS, NEWER_KEYS,
                                        OLD_TLS_VERSIONS, TLS_VERSIONS,
                                        UNSUPPORTED_CLIENT_AUTH)

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


_KNOWN: dict[str, type[BaseModel]] = {"": WebConfigFile, "tls_server_config": TLSServerConfig,
          "http_server_config": HTTPServerConfig}
_TYPES = {"bool_type": "must be true or false", "string_type": "must be a string",
          "list_type": "must be a list of names",
          "model_type": "must be a mapping of keys to values",
          "dict_type": "must be a mapping of keys to values"}


def problem(error: ErrorDetails) -> str:
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
