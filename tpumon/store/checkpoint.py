"""A chip detector's state as bytes, so an agent restart resumes the trend where it stood.

The detector is plain Python and numpy objects, so the state is a pickle, read back with
an unpickler that rebuilds only the detector's own classes and numpy arrays (pickle's
documented "restricting globals" pattern): a tampered file cannot name any other callable.

A checkpoint is valid only for the detector code that wrote it. Its ``fingerprint`` is a
hash of tpumon/detect/*.py, so after an upgrade that changed the detector the checkpoint
is ignored and the trend is rebuilt by replaying the stored samples instead; no version
number that someone could forget to bump.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from functools import lru_cache
from pathlib import Path

from tpumon.detect import ChipDetector

_DETECT_DIR = Path(__file__).resolve().parent.parent / "detect"

#: (module, name) pairs the unpickler may rebuild besides tpumon.detect's own classes.
_NUMPY = {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")
          for n in ("_reconstruct", "scalar")} | {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}
_BUILTINS = {("builtins", "float"), ("builtins", "int"), ("builtins", "complex")}


class CheckpointError(Exception):
    """A checkpoint cannot be read back (damaged, or names a class it may not)."""


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """Hash of the detector's source: checkpoints are valid only for identical code."""
    digest = hashlib.sha256()
    for path in sorted(_DETECT_DIR.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def dump_detector(detector: ChipDetector) -> bytes:
    return pickle.dumps(detector, protocol=pickle.HIGHEST_PROTOCOL)


class _DetectorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        allowed = (module == "tpumon.detect" or module.startswith("tpumon.detect.")
                   or (module, name) in _NUMPY or (module, name) in _BUILTINS)
        if not allowed:
            raise CheckpointError(f"checkpoint names {module}.{name}, which it may not")
        return super().find_class(module, name)


def load_detector(blob: bytes) -> ChipDetector:
    """The detector a checkpoint holds; CheckpointError if it cannot be trusted."""
    try:
        detector = _DetectorUnpickler(io.BytesIO(blob)).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any damage reads as one kind of failure
        raise CheckpointError(f"damaged checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(detector, ChipDetector):
        raise CheckpointError(f"checkpoint holds a {type(detector).__name__}, not a detector")
    return detector
