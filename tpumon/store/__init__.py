"""The history store: every poll's chip samples and the detectors' state in SQLite.

``database`` owns the file (schema, retention tiers, size cap, corrupt files moved aside),
``writer`` the thread that writes it without ever stalling a poll, ``checkpoint`` the
detector state as bytes, ``resume`` the detectors rebuilt from it at start-up, and
``trace_rows`` the stored samples as a trace. docs/history.md explains the whole.

A reader of the poll state: may import ``state`` and everything below it. Imports nothing
itself.
"""
