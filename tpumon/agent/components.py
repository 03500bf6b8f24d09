"""The agent's parts as components (``tpumon.agent.lifecycle``): what each starts, stops and can
change on a reload. The parts themselves (the store's writer, the notifier, the
reporters' socket...) stay what they are; these say how each lives in the agent.

What a reload applies, by component: the poll interval (the agent itself,
``tpumon.agent.loop``), the log level, the [alerts] thresholds (the tracker that pages on them,
read by the metrics too), the reporters' allowed uids, and the Slack and PagerDuty
channels when notifications were already on. Nothing that holds state is rebuilt.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Sequence

from tpumon.common.config import Config
from tpumon.agent.lifecycle import Component, take
from tpumon.notify.alerts import AlertTracker
from tpumon.notify.settings import AlertSettings
from tpumon.sources.reports import ReporterSocket

if TYPE_CHECKING:  # delivery code loads only where a channel is configured (bootstrap)
    from tpumon.notify.notifier import Channel, Notifier

CHANNEL_SECTIONS = ("slack", "pagerduty")


class LogLevel(Component):
    """The root logger's level (agent.log_level)."""

    name = "log level"

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        mine = take(changed, ["agent.log_level"])
        if mine:
            logging.getLogger().setLevel(config["agent.log_level"].upper())
        return changed - mine


class AlertThresholds(Component):
    """The [alerts] section in the alert tracker that pages on it (the notifier's, or the
    alert log's without one); the metrics' tpumon_alert_* gauges read it there."""

    name = "alert thresholds"

    def __init__(self, tracker: AlertTracker) -> None:
        self.tracker = tracker

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        mine = take(changed, sections=["alerts"])
        if mine:
            self.tracker.settings = AlertSettings.from_config(config)
        return changed - mine


class NotifierComponent(Component):
    """The notifier's thread; a reload gives it new channels (new URL, key, severities)
    when it has some to deliver to."""

    name = "notifier"

    def __init__(self, notifier: Notifier,
                 channels_from: Callable[[Config], Sequence[Channel]]) -> None:
        self.notifier = notifier
        self._channels_from = channels_from

    def start(self) -> None:
        self.notifier.start()

    def stop(self) -> None:
        self.notifier.stop()

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        mine = take(changed, sections=CHANNEL_SECTIONS)
        channels = self._channels_from(config) if mine else ()
        if not channels:  # every channel unset: that stops the notifier, at a restart
            return changed
        self.notifier.replace_channels(channels)
        return changed - mine


class Service(Component):
    """A part that is started and stopped and of which nothing changes while running: the
    history store's writer thread (start, stop: writes what is queued), the runtime
    source's gRPC channels (close), the ``--simulate`` child (spawned when built, since
    its ports are the runtime's; stop)."""

    def __init__(self, name: str, stop: Callable[[], None],
                 start: Callable[[], None] | None = None) -> None:
        self.name, self._stop, self._start = name, stop, start

    def start(self) -> None:
        if self._start is not None:
            self._start()

    def stop(self) -> None:
        self._stop()


class ReporterComponent(Component):
    """The reporters' socket, bound when built (so that a path that cannot be bound is
    known before anything else starts); a reload changes who may report."""

    name = "reporter socket"

    def __init__(self, reporters: ReporterSocket) -> None:
        self.reporters = reporters

    def stop(self) -> None:
        self.reporters.stop()

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        mine = take(changed, ["reporter.allowed_uids"])
        if mine:
            self.reporters.allowed_uids = frozenset(config["reporter.allowed_uids"])
        return changed - mine
