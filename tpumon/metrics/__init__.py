"""Prometheus metrics built from the poll state at scrape time: ``collectors`` (one per
subsystem), the families of runtime metrics, job ends and replay (``runtime_families``,
``job_end_families``, ``replay_families``), ``pod_labels`` and ``exposition``.

A reader of the poll state: may import ``state`` and everything below it, and the health
of ``notify`` and ``store``. Imports nothing itself.
"""
