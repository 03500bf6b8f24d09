"""Simulated TPU workloads: what libtpu would report during long training runs, for tests
and demos: ``scenarios`` and ``workload`` (the model), ``server`` (the runtime's gRPC
service), ``pod`` and ``metadata`` (a slice of hosts), ``agents`` (many agents' status at
once), ``tracegen`` (scenarios as trace files).

May import ``web`` and everything below it (its fake agents serve web's status
document). Imports nothing itself."""
