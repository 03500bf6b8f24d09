"""Components with a lifecycle: one small protocol for every part of the agent that runs
beside the poll loop or holds something to release, so that building, stopping and
reloading the agent are loops rather than a hand-written line per part.

A component is built from the configuration (``tpumon.agent.bootstrap``), started in the order
it was built, stopped in the reverse order (what reads the poll state goes before what
feeds it), and offered every reload: it applies the changed keys it can change while
running and hands back the others. A key that no component applies takes effect at the
next restart (``tpumon.agent.reload`` says so).
"""

from __future__ import annotations

import logging
from typing import Iterable, Protocol, TypeVar

from tpumon.common.config import Config

log = logging.getLogger("tpumon.lifecycle")


class Component(Protocol):
    """A part of the agent with a lifecycle; the defaults do nothing and apply nothing."""

    name: str

    def start(self) -> None:
        """Begin work (a thread, a child); one built ready to work needs nothing."""
        return None

    def stop(self) -> None:
        """Finish and release what it holds; called once, after every component built
        after it has stopped."""
        return None

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        """Apply those of the ``changed`` keys that this component can change while
        running, from ``config``; return the keys it did not apply."""
        return changed


def take(changed: frozenset[str], keys: Iterable[str] = (),
         sections: Iterable[str] = ()) -> frozenset[str]:
    """The changed keys among ``keys`` or in one of ``sections`` ("alerts": alerts.*)."""
    wanted, in_sections = set(keys), set(sections)
    return frozenset(k for k in changed if k in wanted or k.split(".")[0] in in_sections)


C = TypeVar("C", bound=Component)


class Lifecycle:
    """The agent's components in the order they were built."""

    def __init__(self) -> None:
        self._components: list[Component] = []

    def add(self, component: C) -> C:
        """Add a component just built; returns it."""
        self._components.append(component)
        return component

    def names(self) -> list[str]:
        """The components' names in the order they were built (and are started)."""
        return [c.name for c in self._components]

    def start(self) -> None:
        """Start each component in the order it was built."""
        for component in self._components:
            component.start()

    def stop(self) -> None:
        """Stop every component in the reverse order; one that fails to stop is logged
        and the others still stop."""
        for component in reversed(self._components):
            try:
                component.stop()
            except Exception:  # noqa: BLE001 - the rest must still stop
                log.exception("stopping %s failed", component.name)
        self._components = []

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        """Offer the changed keys to each component in turn; return those none applied."""
        left = changed
        for component in self._components:
            left = component.reload(config, left)
        return left
