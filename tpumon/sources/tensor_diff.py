"""What grew between two live-tensor snapshots of one process: the leak, named.

An HBM trend says *that* memory grows; two snapshots of the live tensors some steps apart
say *what* grows: ``+1 f32[] per step, created at train.py:88 (loss = ...)``. Groups are
matched on (shape, dtype, device); the ones whose count or bytes grew are listed, largest
byte growth first, with their growth per step, the creation sites that account for it
(when the process tracks sites), and the share of the chip's HBM slope they explain (a
loss tensor kept per step is a leak, but 4 bytes a step cannot explain 100 MB a step:
then the leak is elsewhere and the summary says so in numbers).

A snapshot's group list may be truncated (the wire form is bounded; the smallest groups
go first): a group missing from a truncated snapshot is not compared rather than taken
as zero, and counted in ``uncompared``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpumon.instrument.snapshot import Snapshot, TensorGroup, short_dtype
from tpumon.common.units import format_bytes

Key = tuple[tuple[int, ...], str, str]


@dataclass(frozen=True)
class Growth:
    """One (shape, dtype, device) group between two snapshots ``steps`` steps apart."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    count_before: int
    count_after: int
    bytes_before: int
    bytes_after: int
    steps: int
    sites: dict[str, int] = field(default_factory=dict)  # site -> tensors gained there

    @property
    def count_delta(self) -> int:
        return self.count_after - self.count_before

    @property
    def bytes_delta(self) -> int:
        return self.bytes_after - self.bytes_before

    @property
    def count_per_step(self) -> float | None:
        """None when both snapshots are of the same step."""
        return self.count_delta / self.steps if self.steps > 0 else None

    @property
    def bytes_per_step(self) -> float | None:
        return self.bytes_delta / self.steps if self.steps > 0 else None

    @property
    def bytes_each(self) -> float | None:
        """The size of one tensor of the group (None for an empty group)."""
        count = self.count_after or self.count_before
        return (self.bytes_after or self.bytes_before) / count if count else None

    def label(self) -> str:
        return TensorGroup(self.shape, self.dtype, self.device, 0, 0).label()

    def cadence(self) -> str:
        """"+1 per step", "+1 every 100 steps", "+3 at the same step", or bytes when
        the count did not grow (a sharding's addressable share changed)."""
        amount, rate = self._rate()
        return f"{amount} {rate}"

    def describe(self) -> str:
        """The cadence with the tensors named: "+1 f32[] per step"."""
        amount, rate = self._rate()
        return f"{amount} {self.label()} {rate}"

    def explained_fraction(self, hbm_bytes_per_step: float | None) -> float | None:
        """This group's share of an HBM slope, in [0, 1]; None without a usable slope."""
        return _fraction(self.bytes_per_step, hbm_bytes_per_step)

    def _rate(self) -> tuple[str, str]:
        if self.count_delta <= 0:  # bytes grew at a constant count
            per = self.bytes_per_step
            if per is None:
                return f"+{format_bytes(self.bytes_delta)}", "at the same step"
            return f"+{format_bytes(per)}", "per step"
        return rate_text(self.count_delta, self.steps)


@dataclass(frozen=True)
class SnapshotDiff:
    """Two snapshots of one process compared: ``grown`` (largest byte growth first) and
    ``shrunk`` groups; ``uncompared`` groups were missing from a truncated snapshot."""

    framework: str
    before_step: int
    after_step: int
    grown: list[Growth]
    shrunk: list[Growth]
    uncompared: int = 0
    tracking: bool = False

    @property
    def steps(self) -> int:
        return self.after_step - self.before_step

    @property
    def bytes_delta(self) -> int:
        """Bytes of the grown groups' growth (shrinking groups are not netted out: a leak
        beside a shrinking cache is still a leak)."""
        return sum(g.bytes_delta for g in self.grown)

    @property
    def bytes_per_step(self) -> float | None:
        return self.bytes_delta / self.steps if self.steps > 0 else None

    def _nothing_grew(self, live_per_step: float | None) -> str:
        span = f"between steps {self.before_step} and {self.after_step}"
        rise = (live_per_step or 0.0) * self.steps
        if rise < 1:
            return f"no live tensors grew {span}"
        return (f"no tensor the snapshots list grew {span}, though the live count rose by "
                f"about {rise:,.0f} ({live_per_step:+.2f} per step): the growth is held where "
                "a snapshot cannot list it (not reachable from Python, e.g. inside the "
                "framework)")

    def explained_fraction(self, hbm_bytes_per_step: float | None) -> float | None:
        """How much of an HBM slope (bytes per step, summed over the devices this process
        holds tensors on) the grown groups explain, in [0, 1]; None with no growing slope
        or no step difference."""
        return _fraction(self.bytes_per_step, hbm_bytes_per_step)

    def summary(self, hbm_bytes_per_step: float | None = None, top: int = 3,
                live_per_step: float | None = None) -> str:
        """One line for alerts and ``tpumon status``. ``live_per_step``: the process's
        live-count trend, so that an empty diff beside a rising count is not read as
        "nothing grows"."""
        if not self.grown:
            text = self._nothing_grew(live_per_step)
        else:
            parts = [_describe(g, hbm_bytes_per_step) for g in self.grown[:max(top, 1)]]
            more = len(self.grown) - len(parts)
            if more:
                parts.append(f"and {more} more growing group{'s' if more > 1 else ''}")
            text = "likely leak: " + "; ".join(parts)
        if self.uncompared:
            text += f" ({self.uncompared} small groups not compared: snapshot truncated)"
        return text


def diff(before: Snapshot, after: Snapshot) -> SnapshotDiff:
    """What grew from ``before`` to ``after`` (two snapshots of the same process).

    Raises ValueError when ``after`` is of an earlier step (the process restarted: its
    tensors are not the ones ``before`` counted) or of another framework.
    """
    if after.framework != before.framework:
        raise ValueError(f"snapshots of {before.framework} and {after.framework}: "
                         "not one process")
    if after.step < before.step:
        raise ValueError(f"the later snapshot is of step {after.step}, before {before.step}: "
                         "the process restarted")
    steps = after.step - before.step
    old, new = _index(before), _index(after)
    grown, shrunk, uncompared = [], [], 0
    for key in old.keys() | new.keys():
        a, b = _known(before, old, key), _known(after, new, key)
        if a is None or b is None:
            uncompared += 1
            continue
        change = _growth(key, a, b, steps)
        if change.count_delta > 0 or change.bytes_delta > 0:
            grown.append(change)
        elif change.count_delta < 0 or change.bytes_delta < 0:
            shrunk.append(change)
    grown.sort(key=lambda g: (-g.bytes_delta, -g.count_delta, g.label()))
    shrunk.sort(key=lambda g: (g.bytes_delta, g.count_delta, g.label()))
    return SnapshotDiff(before.framework, before.step, after.step, grown, shrunk, uncompared,
                        tracking=after.tracking)


def _index(snapshot: Snapshot) -> dict[Key, TensorGroup]:
    return {g.key: g for g in snapshot.groups}


_EMPTY = TensorGroup((), "", "", 0, 0)


def _known(snapshot: Snapshot, index: dict[Key, TensorGroup], key: Key) -> TensorGroup | None:
    """The group, an empty one when the snapshot shows it has none, or None when it may
    have been cut from a truncated snapshot."""
    group = index.get(key)
    if group is not None:
        return group
    return None if snapshot.truncated_groups else _EMPTY


def _growth(key: Key, a: TensorGroup, b: TensorGroup, steps: int) -> Growth:
    sites = {site: n - a.sites.get(site, 0) for site, n in b.sites.items()
             if n > a.sites.get(site, 0)}
    sites = dict(sorted(sites.items(), key=lambda kv: (-kv[1], kv[0])))
    return Growth(*key, count_before=a.count, count_after=b.count, bytes_before=a.bytes,
                  bytes_after=b.bytes, steps=steps, sites=sites)


def _fraction(part_per_step: float | None, hbm_bytes_per_step: float | None) -> float | None:
    if (part_per_step is None or hbm_bytes_per_step is None
            or not math.isfinite(hbm_bytes_per_step) or hbm_bytes_per_step <= 0):
        return None
    return min(max(part_per_step / hbm_bytes_per_step, 0.0), 1.0)


def _describe(g: Growth, hbm_bytes_per_step: float | None) -> str:
    """"+1 f32[] per step (4 B each, ~0.01% of the growth), created at ..."."""
    notes = []
    if g.bytes_each is not None:
        notes.append(f"{format_bytes(g.bytes_each)} each")
    fraction = g.explained_fraction(hbm_bytes_per_step)
    if fraction is not None:
        notes.append(f"{percent(fraction)} of the growth")
    text = g.describe() + (f" ({', '.join(notes)})" if notes else "")
    if g.sites:
        first, others = next(iter(g.sites)), len(g.sites) - 1
        text += f", created at {first}"
        if others:
            text += f" and {others} other site{'s' if others > 1 else ''}"
    return text


def rate_text(count: int, steps: int) -> tuple[str, str]:
    """``count`` more tensors over ``steps`` steps as people say it: ("+1", "per step"),
    ("+2.5", "per step"), ("+1", "every 100 steps"), ("+1", "every ~170 steps")."""
    if steps <= 0:
        return f"+{count}", "at the same step"
    every = steps / count
    if every >= 1.5:
        return "+1", f"every {_approx(every)} steps"
    return f"+{_approx(count / steps, mark=False)}", "per step"


def _approx(x: float, mark: bool = True) -> str:
    """An exact integer as it is; within 5% of an integer, that integer (the pair's two
    steps can fall at either phase of a periodic leak); else two significant digits.
    Inexact ones are marked "~" when ``mark``."""
    nearest = round(x)
    if abs(x - nearest) < 1e-9:
        return str(nearest)
    tilde = "~" if mark else ""
    if abs(x - nearest) <= 0.05 * x:
        return f"{tilde}{nearest}"
    return f"{tilde}{float(f'{x:.2g}'):g}"


def percent(fraction: float) -> str:
    """97%, 4.2%, ~0.01%; "all" when the slope is fully accounted for."""
    if fraction >= 0.995:
        return "all"
    if fraction >= 0.1:
        return f"{fraction * 100:.0f}%"
    if fraction >= 0.01:
        return f"{fraction * 100:.1f}%"
    if fraction <= 0:
        return "none"
    return f"~{float(f'{fraction * 100:.1g}'):g}%"


__all__ = ["Growth", "SnapshotDiff", "diff", "percent", "rate_text",
           "short_dtype"]
