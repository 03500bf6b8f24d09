"""SIGHUP: read the configuration again and apply what can change while running.

Nothing that holds state is rebuilt: the detectors, the history store, the outbox and the
reporters' trends stay as they are, so a reload loses no trend. What is applied at once:
the poll interval, the log level, the alert thresholds and links (for the notifiers and
the exported thresholds the Prometheus rules read), the reporters' allowed uids, and the
Slack and PagerDuty channels when notifications were already on. Anything else (where to
listen, which runtime, the state directory, identity) is named in one log line as taking
effect at the next restart. A configuration that does not load is one error line, and the
running one stays.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from tpumon.bootstrap import Assembly, notification_channels
from tpumon.config import KEYS, Config, ConfigError
from tpumon.notify.alerts import AlertSettings

log = logging.getLogger("tpumon.reload")

HOT_SECTIONS = ("alerts",)
HOT_KEYS = ("agent.poll_interval", "agent.log_level", "reporter.allowed_uids")
CHANNEL_SECTIONS = ("slack", "pagerduty")


def reload_config(assembly: Assembly, running: Config,
                  load: Callable[[], Config]) -> Config:
    """The configuration to run with from now on: the new one applied, or ``running``."""
    try:
        new = load()
        if any(_changed(running, new, k) for k in KEYS if k.split(".")[0] in CHANNEL_SECTIONS):
            channels = notification_channels(new)
        else:
            channels = None
    except ConfigError as exc:
        log.error("reload: %s; keeping the running configuration", exc)
        return running
    changed = sorted(k for k in KEYS if _changed(running, new, k))
    if not changed:
        log.info("reload: configuration unchanged")
        return new
    cold = [k for k in changed if not _apply(assembly, new, k, channels)]
    applied = [k for k in changed if k not in cold]
    if applied:
        log.info("reload: applied %s", ", ".join(applied))
    if cold:
        log.warning("reload: %s changed; takes effect at the next restart", ", ".join(cold))
    return new


def _changed(old: Config, new: Config, key: str) -> bool:
    return old[key] != new[key]


def _apply(assembly: Assembly, new: Config, key: str, channels: Any) -> bool:
    """Apply one changed key; False when it needs a restart."""
    section = key.split(".")[0]
    if key == "agent.poll_interval":
        assembly.agent.interval = new[key]
    elif key == "agent.log_level":
        logging.getLogger().setLevel(new[key].upper())
    elif key == "reporter.allowed_uids" and assembly.reporters is not None:
        assembly.reporters.allowed_uids = frozenset(new[key])
    elif section in HOT_SECTIONS:
        assembly.alert_tracker.settings = AlertSettings.from_config(new)
    elif section in CHANNEL_SECTIONS and assembly.notifier is not None and channels:
        assembly.notifier.replace_channels(channels)
    else:
        return False
    return True
