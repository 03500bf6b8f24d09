"""The agent's daemon: the poll loop (``loop``), its assembly from a configuration
(``bootstrap``, ``components``, ``lifecycle``), ``run`` (serve, reload, stop), and the
plumbing around it: ``reload``, ``systemd``, ``logs``, ``grpc_env``.

The top of the stack below the CLI: may import every package but ``client`` and ``cli``.
Imports nothing itself, so importing one module loads only what that module needs.
"""
