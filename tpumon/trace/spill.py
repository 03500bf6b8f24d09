"""A trace's series kept on disk while it is replayed: ``tpumon analyze`` in bounded memory.

A replay needs each series whole, in time order, and the chips of one job together (their
evidence is pooled), but a trace's rows come interleaved: every poll writes one row per
chip, so the last row of any series may be the file's last. Holding every series in memory
would make ``analyze``'s peak RSS grow with the trace (a day of a 1,024-chip pod is 88M
rows). So the trace is read in tables of a bounded size
(:func:`tpumon.trace.arrow.read_tables`), each table's rows are grouped by series and
appended to one temporary file (:class:`Spill`), and a series is read back whole only when
its replay needs it (:meth:`SpilledSeries.load`), then dropped. Memory is one table being
read, or one series being replayed per process, plus the detectors' state; disk is 32 bytes
a sample (the four columns in the dtypes the replay takes, so the values are the same).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import FileIO
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tpumon.trace.schema import SeriesColumns

#: The dtypes of a series' columns as spilled and loaded: those of SeriesColumns.
_DTYPES = (np.float64, np.float64, np.int64, np.int64)


class SeriesAgain(Exception):
    """A series already read from an earlier file is in this one too (``key``)."""

    def __init__(self, key: tuple[str, str]) -> None:
        super().__init__(key)
        self.key = key


class TimeWentBack(Exception):
    """A series' first time in a table is earlier than its last in the tables before."""

    def __init__(self, key: tuple[str, str], time: float, last: float) -> None:
        super().__init__(key)
        self.key, self.time, self.last = key, time, last


class SpilledSeries:
    """One series in a spill file: its chunks (offset, rows: the four columns one after
    the other), read back as :class:`tpumon.trace.read.SeriesColumns` by :meth:`load`. Loads
    open the file anew, so forked replay workers read their own series without sharing
    a file position."""

    __slots__ = ("_path", "_chunks", "samples", "last_time")

    def __init__(self, path: str) -> None:
        self._path = path
        self._chunks: list[tuple[int, int]] = []
        self.samples = 0
        self.last_time = -np.inf

    def snapshot(self) -> SpilledSeries:
        """A copy that stays as the series is now while more rows are spilled."""
        copy = SpilledSeries(self._path)
        copy._chunks, copy.samples, copy.last_time = list(self._chunks), self.samples, \
            self.last_time
        return copy

    def load(self) -> SeriesColumns:
        """The series' columns, in file order."""
        from tpumon.trace.schema import SeriesColumns

        columns = [np.empty(self.samples, dtype) for dtype in _DTYPES]
        at = 0
        with open(self._path, "rb", buffering=0) as file:
            for offset, rows in self._chunks:
                file.seek(offset)
                for column in columns:
                    _read_into(file, column[at:at + rows].data.cast("B"))
                at += rows
        return SeriesColumns(*columns)


def _read_into(file: FileIO, into: memoryview) -> None:
    done = 0
    while done < len(into):
        got = file.readinto(into[done:])
        if not got:
            raise OSError(f"{file.name}: the spill file ended early")
        done += got


#: Which of a series' rows to keep, given its key and the rows of one table (a selection:
#: ``tpumon report --host/--chip/--since/--until``); None or no rows keeps none.
Keep = Callable[[tuple[str, str], "SeriesColumns"], "SeriesColumns | None"]


class Spill:
    """Series appended table by table to one file in ``directory`` (which the caller
    removes), in order of first appearance (``series``). :meth:`start_file` begins a trace
    file: a series already read from an earlier file is then an error (SeriesAgain).
    With ``keep``, only the rows it keeps are written (a series may then have no samples);
    the rows it leaves out are checked as the others are."""

    def __init__(self, directory: str, keep: Keep | None = None) -> None:
        self.path = os.path.join(directory, "series")
        self._keep = keep
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self.series: dict[tuple[str, str], SpilledSeries] = {}
        self._earlier: dict[tuple[str, str], SpilledSeries] = {}

    def start_file(self) -> None:
        """The series added from now on are another file's."""
        self._earlier = dict(self.series)

    def drop_file(self) -> None:
        """Forget the series of the file started last (read again by another parser)."""
        self.series = dict(self._earlier)

    def add(self, columns: dict[tuple[str, str], SeriesColumns]) -> None:
        """The next rows of the file's series (each in file order); TimeWentBack if a
        series' rows begin before its rows in the tables added before ended."""
        for key, c in columns.items():
            if key in self._earlier:
                raise SeriesAgain(key)
            spilled = self.series.get(key)
            if spilled is None:
                spilled = self.series[key] = SpilledSeries(self.path)
            elif len(c.times) and c.times[0] < spilled.last_time:
                raise TimeWentBack(key, float(c.times[0]), spilled.last_time)
        for key, c in columns.items():  # checked first: an error adds nothing
            if not len(c.times):
                continue
            spilled = self.series[key]
            spilled.last_time = float(c.times[-1])
            if self._keep is not None:
                kept = self._keep(key, c)
                if kept is None:
                    continue
                c = kept
            rows = len(c.times)
            if not rows:
                continue
            with self._writing():
                spilled._chunks.append((self._file.tell(), rows))
                for column, dtype in zip(c, _DTYPES, strict=True):
                    self._file.write(np.ascontiguousarray(column, dtype).data.cast("B"))
            spilled.samples += rows

    def flush(self) -> None:
        """What was added so far is in the file, for :meth:`SpilledSeries.load` elsewhere
        (a forked worker) while more is added."""
        with self._writing():
            self._file.flush()

    def close(self) -> None:
        """Done adding: what was written is there for :meth:`SpilledSeries.load`."""
        with self._writing():
            self._file.close()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """An OSError while writing (a full disk) names this file and says what it is: the
        trace is not at fault, and TMPDIR can put it elsewhere."""
        try:
            yield
        except OSError as exc:
            raise OSError(exc.errno, f"{exc.strerror or exc} (the temporary file of the "
                          "trace's series: set TMPDIR to a disk with room, 32 bytes a "
                          "sample)", self.path) from None
