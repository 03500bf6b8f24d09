"""Secrets (the Slack webhook URL, the PagerDuty routing key) from the configuration, a
file, or systemd's credentials directory, in that order; never logged or shown.

A file is the recommended form: `LoadCredential=` in the systemd unit, a Kubernetes
Secret mounted as a file, or a root-only file under /etc/tpumon. A file that was named but
cannot be read is a configuration error at start-up, not a silent "no notifications".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from tpumon.config import Config, ConfigError


def read_secret(config: Config, key: str, credential: str,
                env: Mapping[str, str] | None = None) -> str:
    """The value of ``key`` (e.g. 'slack.webhook_url'), else of the file named by
    ``key + '_file'``, else of $CREDENTIALS_DIRECTORY/``credential``; '' if none is set."""
    if config[key]:
        return config[key]
    env = os.environ if env is None else env
    named = config[f"{key}_file"]
    path = Path(named) if named else None
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
