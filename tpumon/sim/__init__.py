"""Simulated TPU workloads: what libtpu would report during long training runs, for tests
and demos."""
