"""Where this VM sits in a TPU pod: the labels that let a person find the sick chip.

Each label is taken from the first place that has it (docs/identity.md has the table):

=================  ====================  ===================  ======================  ============
label              config / flag         environment          tpu-env metadata        fallback
=================  ====================  ===================  ======================  ============
host               identity.hostname     -                    -                       gethostname()
worker             identity.worker       TPU_WORKER_ID        WORKER_ID               '-w-N' suffix
accelerator_type   identity.accelerator  TPU_ACCELERATOR_TYPE ACCELERATOR_TYPE        ''
slice              identity.slice        TPU_NAME             NODE_ID                 ''
=================  ====================  ===================  ======================  ============

tpu-env is the ``instance/attributes/tpu-env`` entry of the GCE metadata server that every
TPU VM has (GKE sets the TPU_* variables instead). The metadata server is asked once, at
start-up, with a short timeout, and only on Google Compute Engine unless told otherwise.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

log = logging.getLogger("tpumon.identity")

METADATA_IP = "169.254.169.254"  # the IP, so an off-GCE DNS lookup can never stall start-up
ATTRIBUTES_PATH = "/computeMetadata/v1/instance/attributes/"
TPU_ENV_PATH = ATTRIBUTES_PATH + "tpu-env"
DMI_PRODUCT = Path("/sys/class/dmi/id/product_name")
LABELS = ("host", "worker", "accelerator_type", "slice")


@dataclass(frozen=True)
class Identity:
    """The identity labels every exported series carries, and where each value came from."""

    host: str
    worker: str = ""
    accelerator_type: str = ""
    slice: str = ""
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    def labels(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in LABELS}


def parse_tpu_env(text: str) -> dict[str, str]:
    """tpu-env is YAML-like lines ``KEY: 'value'``; only that flat shape occurs in it."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9_]+):\s*(.*?)\s*", line)
        if match:
            value = match.group(2)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            result[match.group(1)] = value
    return result


def on_gce(dmi_product: Path | None = None) -> bool:
    """Google's own test for GCE: the DMI product name, readable without any network."""
    try:
        path = DMI_PRODUCT if dmi_product is None else dmi_product
        return "Google" in path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return False


def fetch_metadata_attribute(name: str, timeout: float,
                             env: Mapping[str, str] | None = None) -> str | None:
    """One ``instance/attributes/NAME`` entry of the metadata server ($GCE_METADATA_HOST
    overrides its address), or None when it cannot be had: not on a TPU VM, no metadata
    server, no such attribute, too slow."""
    env = os.environ if env is None else env
    host = env.get("GCE_METADATA_HOST") or METADATA_IP
    request = urllib.request.Request(f"http://{host}{ATTRIBUTES_PATH}{name}",
                                     headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.read(256 * 1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.info("no %s from the metadata server at %s: %s", name, host, exc)
        return None


def fetch_tpu_env(timeout: float, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """tpu-env from the metadata server; {} when it cannot be had."""
    return parse_tpu_env(fetch_metadata_attribute("tpu-env", timeout, env) or "")


def parse_worker_endpoints(text: str) -> list[str]:
    """The slice's worker addresses, worker 0 first, from ``worker-network-endpoints``:
    comma-separated entries whose third ':' field is the worker's IP (``x:y:10.0.0.11``)."""
    addresses = []
    for entry in text.split(","):
        fields = entry.strip().split(":")
        if len(fields) >= 3 and fields[2].strip():
            addresses.append(fields[2].strip())
    return addresses


def _worker_from_hostname(hostname: str) -> str:
    """TPU VM hostnames end in '-w-N' (t1v-n-0a1b2c3d-w-3): N is the worker id."""
    match = re.search(r"-w-(\d+)$", hostname)
    return match.group(1) if match else ""


def resolve_identity(configured: Mapping[str, str], tpu_env: Mapping[str, str],
                     env: Mapping[str, str] | None = None) -> Identity:
    """Apply the precedence in the module docstring; ``configured`` holds config values."""
    env = os.environ if env is None else env
    host = configured.get("hostname") or socket.gethostname()
    candidates = {
        "host": [("config", host)],
        "worker": [("config", configured.get("worker", "")),
                   ("env TPU_WORKER_ID", env.get("TPU_WORKER_ID", "")),
                   ("tpu-env WORKER_ID", tpu_env.get("WORKER_ID", "")),
                   ("hostname suffix", _worker_from_hostname(host))],
        "accelerator_type": [("config", configured.get("accelerator_type", "")),
                             ("env TPU_ACCELERATOR_TYPE", env.get("TPU_ACCELERATOR_TYPE", "")),
                             ("tpu-env ACCELERATOR_TYPE", tpu_env.get("ACCELERATOR_TYPE", ""))],
        "slice": [("config", configured.get("slice", "")),
                  ("env TPU_NAME", env.get("TPU_NAME", "")),
                  ("tpu-env NODE_ID", tpu_env.get("NODE_ID", ""))],
    }
    values: dict[str, str] = {}
    origins: dict[str, str] = {}
    for label, options in candidates.items():
        origin, value = next(((o, v) for o, v in options if v), ("unknown", ""))
        values[label], origins[label] = value, origin
    if not configured.get("hostname"):
        origins["host"] = "gethostname()"
    return Identity(**values, origins=origins)


def discover_tpu_env(mode: str, timeout: float,
                     env: Mapping[str, str] | None = None) -> dict[str, str]:
    """tpu-env per the identity.metadata setting: 'on', 'off', or 'auto' (only on GCE)."""
    if mode == "off" or (mode == "auto" and not on_gce()):
        return {}
    return fetch_tpu_env(timeout, env)
