"""SIGHUP: read the configuration again and apply what can change while running.

Nothing that holds state is rebuilt: the detectors, the history store, the outbox and the
reporters' trends stay as they are, so a reload loses no trend. The changed keys are
offered to each of the agent's components (``tpumon.agent.components``), which apply what they
can at once: the poll interval, the log level, the alert thresholds and links (for the
notifiers and the exported thresholds the Prometheus rules read), the reporters' allowed
uids, and the Slack and PagerDuty channels when notifications were already on. Anything
else (where to listen, which runtime, the state directory, identity) is named in one log
line as taking effect at the next restart. A configuration that does not load (a secret
file that cannot be read included) is one error line, and the running one stays.
"""

from __future__ import annotations

import logging
from typing import Callable

from tpumon.agent.bootstrap import Assembly, notification_channels
from tpumon.agent.components import CHANNEL_SECTIONS
from tpumon.common.config import KEYS, Config, ConfigError

log = logging.getLogger("tpumon.reload")


def reload_config(assembly: Assembly, running: Config,
                  load: Callable[[], Config]) -> Config:
    """The configuration to run with from now on: the new one applied, or ``running``."""
    try:
        new = load()
        changed = frozenset(k for k in KEYS if running[k] != new[k])
        if any(k.split(".")[0] in CHANNEL_SECTIONS for k in changed):
            notification_channels(new)  # their secrets must read before anything changes
    except ConfigError as exc:
        log.error("reload: %s; keeping the running configuration", exc)
        return running
    if not changed:
        log.info("reload: configuration unchanged")
        return new
    cold = assembly.components.reload(new, changed)
    if changed - cold:
        log.info("reload: applied %s", ", ".join(sorted(changed - cold)))
    if cold:
        log.warning("reload: %s changed; takes effect at the next restart",
                    ", ".join(sorted(cold)))
    return new
