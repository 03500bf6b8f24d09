"""gRPC settings for tpumon's own processes, made through the environment: gRPC's C core
reads them once, when ``grpc`` is first imported, so :func:`apply` runs before that (in the
CLI, before it loads a command). Training processes that import ``tpumon.instrument`` are
never touched.

Each setting is a default: a value the operator put in the environment wins.
"""

from __future__ import annotations

from typing import MutableMapping

# Newest grpcio the client setting below was measured with. gRPC removes experiments once
# they graduate, and an unknown one is logged as an error at start-up, so newer versions
# keep gRPC's default until measured again.
LEGACY_CLIENT_UNTIL = (1, 85)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def grpcio_version() -> str | None:
    from importlib import metadata  # 18 ms: only when a command is about to use gRPC

    try:
        return metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        return None


def apply(environ: MutableMapping[str, str], version: str | None = None) -> None:
    """Set tpumon's gRPC defaults in ``environ`` (before ``grpc`` is imported).

    - ``GRPC_VERBOSITY=ERROR``: the C core logs connection events (a GOAWAY on every
      runtime restart) at INFO to stderr; the agent reports those itself, once, as
      source state.
    - ``GRPC_EXPERIMENTS=-event_engine_client``: the client side on gRPC's older I/O
      manager, where the calling thread drives its own call, instead of the EventEngine,
      which hands every call to its own threads and back. For one small unary call a
      second (the agent's runtime poll) that hand-off is most of gRPC's cost: a poll
      loop took 0.335 % of a core with the EventEngine and 0.245 % without
      (docs/benchmarks.md). Only for the grpcio versions it was measured on.
    """
    environ.setdefault("GRPC_VERBOSITY", "ERROR")
    version = grpcio_version() if version is None else version
    if version is not None and _version(version) <= LEGACY_CLIENT_UNTIL:
        environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")
