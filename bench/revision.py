"""tpumon as it is at another git revision, importable beside today's (for side-by-side
benchmarks in one process: before and after on the same machine, at the same moment).

``git archive`` extracts the revision's ``tpumon`` package into a temporary directory under
a name of its own, with every ``tpumon`` in its imports renamed, so any revision loads
whatever its layout (modules have moved between packages over time)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def import_revision(ref: str) -> str:
    """The name under which tpumon at ``ref`` is importable (its directory is put on
    ``sys.path``); e.g. ``importlib.import_module(import_revision("HEAD~3") + ".trace")``."""
    package = f"_tpumon_at_{re.sub(r'[^A-Za-z0-9]', '_', ref)}"
    if package in sys.modules:
        return package
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "tpumon"], check=True,
                             capture_output=True).stdout
    directory = tempfile.mkdtemp(prefix="tpumon-revision-")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    os.rename(os.path.join(directory, "tpumon"), os.path.join(directory, package))
    for folder, _, files in os.walk(os.path.join(directory, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(re.sub(r"\btpumon(?=[. ])", package, text))
    sys.path.insert(0, directory)
    return package
