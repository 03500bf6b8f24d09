"""Data sources: each polls one thing and returns plain samples (see tpumon.common.samples).

One source per module, like node_exporter's collectors: ``tpu_runtime`` (libtpu's runtime
metric service over gRPC), ``chips`` (which TPU chips this VM has and who owns them),
``host`` (host memory and the RSS of chip-owning processes), ``kernel_log`` (processes the
kernel killed for memory), ``pod_resources`` (the kubelet's chip allocations), and what
the training processes tell: ``reports`` and ``reporter_inlet`` (their messages),
``last_words`` (how a process ended, parsed), ``snapshots`` and ``tensor_diff`` (live-tensor
snapshots asked for, and what grew between two). A source never decides what a value
means and never crashes the agent: failure is a state, tracked by ``health``.

May import ``common``, ``instrument`` and ``podresources``. Imports nothing itself.
"""
