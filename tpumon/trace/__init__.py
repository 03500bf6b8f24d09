"""Trace files, the public format of recorded HBM samples (docs: contracts section 1):
``schema`` (what a trace is), ``read`` and ``text`` (reading, strictly), ``write``,
``arrow`` and ``columns`` (pyarrow's tables into per-series columns), ``spill`` (the
temporary file that bounds memory), ``prometheus`` (a slice's history from Prometheus as
trace rows).

A data format, not a layer of the agent (which reads no traces): may import ``common``
only. Imports nothing itself, so neither numpy nor pyarrow loads until a trace is read.
"""
