"""The web configuration file (the exporter-toolkit's format, as Prometheus 2.42's promtool
checks it): read, checked against its schema (``schema.py``: pydantic models
that forbid unknown keys and check types and values), and turned into the settings
``live.py`` builds the TLS context and serves with. The first problem is one
ConfigError line naming the file and the key.

What Python's ssl module cannot honour is refused here, with the reason, rather than
emulated: asking for a client certificate without verifying it, TLS 1.0 and 1.1 (off in
OpenSSL 3), a list of curves; and keys of newer exporter-toolkit versions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from tpumon.common.config import ConfigError

if TYPE_CHECKING:
    from tpumon.web.webconfig.schema import WebConfigFile


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
    from tpumon.web.webconfig.strict_yaml import YAMLError, load_strict  # only with a file

    try:
        data = load_strict(text)
    except YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML{_yaml_where(exc)}") from None
    # pydantic loads only here: an agent without a web configuration never pays for it
    # (about 100 ms of start-up and 7 MiB)
    from pydantic import ValidationError

    from tpumon.web.webconfig.schema import WebConfigFile, problem
    try:
        parsed = WebConfigFile.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {problem(exc.errors()[0])}") from None
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


def _yaml_where(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{at}: {problem}"
