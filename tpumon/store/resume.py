"""Rebuild every chip's detector from the history store when the agent starts.

A checkpoint written by the same detector code is loaded, and the samples stored after
it are fed on top, so the detector ends exactly where it would have stood had the agent
never stopped (the detector gives the same result however its input is batched). Without
a usable checkpoint (the first start after an upgrade that changed the detector, or a
damaged one), the chip's stored history is replayed instead: the same verdict wherever
raw samples reach back over the trend, close to it where only minute floors remain.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from tpumon.detect import ChipDetector, DetectorSettings
from tpumon.store.checkpoint import CheckpointError, fingerprint, load_detector
from tpumon.store.database import HistoryDB
from tpumon.common.samples import Sample

log = logging.getLogger("tpumon.store")


def feed(detector: ChipDetector, samples: list[Sample]) -> None:
    """Feed stored samples to a detector in one batch."""
    if not samples:
        return
    times, steps, used, totals = zip(*samples, strict=True)
    detector.update(np.array(times, dtype=float),
                    np.array([math.nan if s is None else s for s in steps], dtype=float),
                    np.array(used, dtype=float), np.array(totals, dtype=float))


def restore_detectors(db: HistoryDB, host: str,
                      settings: DetectorSettings | None = None) -> dict[str, ChipDetector]:
    """Each of ``host``'s chips' detector, resumed from the store (see module docstring)."""
    detectors: dict[str, ChipDetector] = {}
    resumed = replayed = 0
    for series, series_host, chip in db.series():
        if series_host != host:
            continue
        detector, pending = _from_checkpoint(db, series, chip)
        if detector is None:
            detector, pending = ChipDetector(settings), list(db.read_series(series))
            replayed += 1
        else:
            resumed += 1
        feed(detector, pending)
        detectors[chip] = detector
    if detectors:
        log.info("resumed the trend of %d chip(s) from %s (%d from checkpoints, %d replayed "
                 "from stored samples)", len(detectors), db.path, resumed, replayed)
    return detectors


def _from_checkpoint(db: HistoryDB, series: int,
                     chip: str) -> tuple[ChipDetector | None, list[Sample]]:
    checkpoint = db.checkpoint(series)
    if checkpoint is None or checkpoint.fingerprint != fingerprint():
        return None, []
    try:
        return load_detector(checkpoint.state), db.samples_after(series, checkpoint.last_sample)
    except CheckpointError as exc:
        log.warning("chip %s: ignoring its detector checkpoint (%s); replaying its samples",
                    chip, exc)
        return None, []
