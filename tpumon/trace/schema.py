"""What a trace is (the public contract of shared spec, contracts section 1): its columns
and limits, one row, one series as arrays, and the error that names a bad line. A leaf,
shared by the readers (tpumon.trace.read, .text, .arrow), the writer (tpumon.trace.write)
and the spill file (tpumon.trace.spill), none of which it imports."""

from __future__ import annotations

from dataclasses import dataclass
import os
from typing import IO, TYPE_CHECKING, Any, NamedTuple, Protocol, Union

if TYPE_CHECKING:
    import numpy as np  # imported where used: the agent reads no traces

#: The formats a trace may have; a file's name tells which unless the caller says.
FORMATS = ("csv", "jsonl", "parquet")

#: A file name, ``-`` for stdin or stdout, or an open text file.
PathOrFile = Union[str, "os.PathLike[str]", IO[str]]

#: Column order used when writing; readers must not depend on it.
COLUMNS = ("time", "host", "chip", "step", "hbm_used_bytes", "hbm_total_bytes")
REQUIRED = ("time", "host", "chip", "hbm_used_bytes", "hbm_total_bytes")

#: Byte counts must be below this and steps below STEP_LIMIT, so that read_trace_columns
#: holds them exactly: as int64 and as float64. No HBM size or step count comes near either.
INT_LIMIT = 2**63
STEP_LIMIT = 2**53

#: The longest line a trace may have, in characters (a row is well under 1 KiB). A longer
#: one is refused once this much of it has been read, never held whole: a line of 1 GiB
#: costs its first MiB of memory, not 1 GiB.
MAX_LINE_CHARS = 1 << 20



@dataclass(frozen=True, slots=True)
class TraceRow:
    """One chip's HBM as seen at one poll."""

    time: float
    host: str
    chip: str
    step: int | None
    hbm_used_bytes: int
    hbm_total_bytes: int


class TraceFormatError(ValueError):
    """A trace file is malformed; names the file and the 1-based line.

    ``str()`` is one line, ``path:line: message``, because the CLI prints it
    as is on stderr and a person must be able to open the file at that line.
    """

    def __init__(self, path: str, line: int | None, message: str) -> None:
        super().__init__(f"{path}: {message}" if line is None else f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Custom __init__ arguments: tell pickle (multiprocessing) how to rebuild.
        return (type(self), (self.path, self.line, self.message))


class SeriesColumns(NamedTuple):
    """One (host, chip) series of a trace as arrays, in file order (so in time order)."""

    times: np.ndarray  #: float64, Unix seconds
    steps: np.ndarray  #: float64, NaN where the row has no step
    used: np.ndarray   #: int64, hbm_used_bytes
    total: np.ndarray  #: int64, hbm_total_bytes

    @property
    def samples(self) -> int:
        """Rows of the series (as :class:`tpumon.trace.spill.SpilledSeries` says)."""
        return len(self.times)

    def load(self) -> SeriesColumns:
        """Itself: a series in memory, where a spilled one is read back (SeriesSource)."""
        return self


class SeriesSource(Protocol):
    """A series as the replay takes it: in memory (SeriesColumns) or in a spill file
    (:class:`tpumon.trace.spill.SpilledSeries`), its arrays read when replayed."""

    @property
    def samples(self) -> int: ...

    def load(self) -> SeriesColumns: ...
