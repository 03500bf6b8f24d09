"""Data sources: each polls one thing and returns plain samples (see tpumon.common.samples).

One source per module, like node_exporter's collectors: ``tpu_runtime`` (libtpu's runtime
metric service over gRPC), ``chips`` (which TPU chips this VM has and who owns them),
``host`` (host memory and the RSS of chip-owning processes). A source never decides what a
value means and never crashes the agent: failure is a state, tracked by ``health``.
"""
