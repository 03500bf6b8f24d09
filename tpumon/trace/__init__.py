"""Trace files, the public format of recorded HBM samples (docs: contracts section 1):
``schema`` (what a trace is), ``read`` and ``text`` (reading, strictly), ``write``,
``arrow`` and ``columns`` (pyarrow's tables into per-series columns), ``spill`` (the
temporary file that bounds memory), ``prometheus`` (a slice's history from Prometheus as
trace rows).

A data format, not a layer of the agent (which reads no traces): may import ``common``
only. Imports nothing itself, so neither numpy nor pyarrow loads until a trace is read;
its main names (``read_trace``, ``write_trace``, ``TraceRow``, ...) resolve here on first
use.
"""

from __future__ import annotations

from typing import Any

#: name -> the module under tpumon.trace that defines it
_PUBLIC = {"TraceRow": "schema", "TraceFormatError": "schema", "SeriesColumns": "schema",
           "SeriesSource": "schema", "COLUMNS": "schema", "read_trace": "read",
           "read_trace_columns": "read", "spill_trace": "read", "write_trace": "write"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module == "schema":
        from tpumon.trace import schema
        return getattr(schema, name)
    if module == "read":
        from tpumon.trace import read
        return getattr(read, name)
    if module == "write":
        from tpumon.trace import write
        return getattr(write, name)
    raise AttributeError(f"module 'tpumon.trace' has no attribute {name!r}")
