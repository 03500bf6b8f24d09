"""Floors: the HBM level under the in-step sawtooth, kept at bounded cost for weeks.

A poll lands at a random phase of a training step, so raw usage swings by GBs while a
leak adds KBs per step. The minimum over a bucket of polls is the floor (the memory alive
across steps) plus a little noise; the maximum minus the minimum is the transient. Floors
go into a two-level ring (fine buckets for recent days, coarse for weeks), so memory per
chip is fixed however long the run (a few thousand points).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True, slots=True)
class Groups:
    """Per-bucket aggregates of a run of samples: parallel arrays, one entry per bucket."""

    ids: np.ndarray
    first: np.ndarray  # index of each bucket's first sample in the input
    floor: np.ndarray
    peak: np.ndarray
    count: np.ndarray
    first_step: np.ndarray
    last_step: np.ndarray


def group_by_bucket(times: np.ndarray, steps: np.ndarray, used: np.ndarray,
                    width: float) -> Groups:
    """Aggregate consecutive samples by fixed-width time bucket (times non-decreasing)."""
    ids = np.floor(times / width).astype(np.int64)
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    last = np.r_[first[1:], len(ids)] - 1
    return Groups(ids[first], first, np.minimum.reduceat(used, first),
                  np.maximum.reduceat(used, first), np.diff(np.r_[first, len(ids)]),
                  steps[first], steps[last])


class _Ring:
    """Fixed-capacity arrays of (time, step, floor, peak); slices are views, appends O(1).

    Storage is twice the capacity; when it fills, the newest ``capacity`` rows move to
    the front, so the last ``capacity`` points are always one contiguous slice.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data = np.empty((4, 2 * capacity))
        self._rows = tuple(self._data)  # 1-d views: an element write costs half a 2-d one
        self._end = 0
        self._start = 0

    def __len__(self) -> int:
        return self._end - self._start

    def __getstate__(self) -> tuple[int, np.ndarray]:
        """Only the rows in use: ``_rows`` are views of ``_data``, which pickle would copy
        apart (and a checkpoint would carry the empty half of the storage)."""
        return self.capacity, self.view().copy()

    def __setstate__(self, state: tuple[int, np.ndarray]) -> None:
        capacity, rows = state
        _Ring.__init__(self, capacity)
        self._data[:, :rows.shape[1]] = rows
        self._end = rows.shape[1]

    def append(self, time: float, step: float, floor: float, peak: float) -> None:
        end = self._end
        if end == 2 * self.capacity:
            keep = self._data[:, end - self.capacity + 1:end].copy()
            self._data[:, :keep.shape[1]] = keep
            self._start, end = 0, keep.shape[1]
        times, steps, floors, peaks = self._rows
        times[end] = time
        steps[end] = step
        floors[end] = floor
        peaks[end] = peak
        self._end = end = end + 1
        if end - self._start > self.capacity:
            self._start = end - self.capacity

    def view(self) -> np.ndarray:
        """Rows time, step, floor, peak; columns oldest first."""
        return self._data[:, self._start:self._end]


class FloorHistory:
    """Bucket floors of one job since its trend started, fine for recent days, coarse beyond.

    ``window(start, points)`` returns at most ``points`` floors covering [start, now]:
    fine buckets where they reach back far enough, else coarse ones for the older part;
    consecutive buckets are merged (min) to stay within ``points``, keeping a fit's cost
    independent of the window's length.
    """

    def __init__(self, fine_capacity: int = 2048, coarse_factor: int = 16,
                 coarse_capacity: int = 1024) -> None:
        self.fine = _Ring(fine_capacity)
        self.coarse = _Ring(coarse_capacity)
        self._factor = coarse_factor
        self._pending: list[tuple[float, float, float, float]] = []

    def append(self, time: float, step: float, floor: float, peak: float) -> None:
        self.fine.append(time, step, floor, peak)
        self._pending.append((time, step, floor, peak))
        if len(self._pending) == self._factor:
            rows = self._pending
            self.coarse.append(rows[0][0], rows[-1][1], min(r[2] for r in rows),
                               max(r[3] for r in rows))
            self._pending = []

    def __len__(self) -> int:
        return len(self.fine)

    def recent(self, n: int) -> np.ndarray:
        """The last ``n`` fine buckets (rows time, step, floor, peak)."""
        view = self.fine.view()
        return view[:, max(view.shape[1] - n, 0):]

    def window(self, start: float, points: int) -> np.ndarray:
        """Rows time, step, floor, peak over [start, now], at most ``points`` columns."""
        data = self._since(start)
        n = data.shape[1]
        return data if n <= points else _merged(data, -(-n // points))

    def _since(self, start: float) -> np.ndarray:
        """All buckets from ``start`` on: fine ones, preceded by coarse ones where the fine
        ring does not reach back that far."""
        fine = self.fine.view()
        if fine.shape[1] and fine[0, 0] <= start:
            return fine[:, fine[0].searchsorted(start):]
        coarse = self.coarse.view()
        fine_start = fine[0, 0] if fine.shape[1] else np.inf
        older = coarse[:, (coarse[0] >= start) & (coarse[0] < fine_start)]
        return np.concatenate([older, fine], axis=1) if older.shape[1] else fine


@lru_cache(maxsize=1024)
def _runs(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last index of each run of ``size`` in ``n`` columns (the last run may be
    shorter); cached, as the same (n, size) recur from fit to fit and series to series."""
    starts = np.arange(0, n, size)
    ends = starts + (size - 1)
    ends[-1] = n - 1
    starts.flags.writeable = ends.flags.writeable = False  # shared by every later call
    return starts, ends


def _merged(data: np.ndarray, size: int) -> np.ndarray:
    """Runs of ``size`` consecutive buckets merged into one: the first's time, the last's
    step, the lowest floor and the highest peak (written in place: few numpy calls)."""
    starts, ends = _runs(data.shape[1], size)
    out = np.empty((4, len(starts)))
    data[0].take(starts, out=out[0])
    data[1].take(ends, out=out[1])
    np.minimum.reduceat(data[2], starts, out=out[2])
    np.maximum.reduceat(data[3], starts, out=out[3])
    return out
