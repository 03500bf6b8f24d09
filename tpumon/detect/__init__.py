"""Leak detection: a streaming, per-chip trend fit over HBM floors (pure computation).

``ChipDetector`` is fed samples (time, step or NaN, used, total) in arrays of any length:
one per poll in the agent, whole series in ``tpumon analyze``; both run the same code with
the same ``DetectorSettings``, so what analyze replays is what the agent would have said.
See ``detector.py`` for the method and docs/detector.md for the reasoning; what it says,
``verdict.py``; what it keeps of a job, ``job.py``.
"""

from tpumon.detect.detector import ChipDetector
from tpumon.detect.verdict import Assessment, DetectorSettings, Verdict

__all__ = ["Assessment", "ChipDetector", "DetectorSettings", "Verdict"]
