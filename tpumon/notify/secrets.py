"""Secrets (the Slack webhook URL, the PagerDuty routing key) from the configuration, a
file, or systemd's credentials directory, in that order; never logged or shown.

A file is the recommended form: `LoadCredential=` in the systemd unit, a Kubernetes
Secret mounted as a file, or a root-only file under /etc/tpumon. A file that was named but
cannot be read is a configuration error at start-up, not a silent "no notifications".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tpumon.common.config import ConfigError


@dataclass(frozen=True)
class SecretSetting:
    """Where one secret may be given: ``key`` names it in errors ('slack.webhook_url'),
    ``value`` is the key's own value, ``file`` that of ``key + '_file'``; built from the
    configuration where the agent is assembled."""

    key: str
    value: str = ""
    file: str = ""


def read_secret(setting: SecretSetting, credential: str,
                env: Mapping[str, str] | None = None) -> str:
    """The setting's value, else the file's content, else $CREDENTIALS_DIRECTORY/
    ``credential``'s; '' if none is set."""
    key = setting.key
    if setting.value:
        return setting.value
    env = os.environ if env is None else env
    path = Path(setting.file) if setting.file else None
    if path is None and env.get("CREDENTIALS_DIRECTORY"):
        candidate = Path(env["CREDENTIALS_DIRECTORY"]) / credential
        path = candidate if candidate.exists() else None
    if path is None:
        return ""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}_file {path}: cannot read it: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    if not value:
        raise ConfigError(f"{key}_file {path}: the file is empty")
    return value
