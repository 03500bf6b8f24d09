"""gRPC settings for tpumon's own processes, made through the environment: grpcio's C core
reads them once, when ``grpc`` is first imported, so :func:`apply` runs before that (in the
CLI, before it loads a command). Training processes that import ``tpumon.instrument`` are
never touched.

Only the simulator imports grpcio (its server stands in for libtpu's); the agent's own
calls go through libcurl (:mod:`tpumon.sources.grpc_unary`), which reads none of this.
Each setting is a default: a value the operator put in the environment wins.
"""

from __future__ import annotations

from typing import MutableMapping


def apply(environ: MutableMapping[str, str]) -> None:
    """Set tpumon's gRPC defaults in ``environ`` (before ``grpc`` is imported).

    - ``GRPC_VERBOSITY=ERROR``: the C core logs connection events (a client going away on
      every agent restart) at INFO to stderr; tpumon reports what matters itself.
    """
    environ.setdefault("GRPC_VERBOSITY", "ERROR")
