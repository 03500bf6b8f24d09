"""The agent's clients: ``http`` (one agent's HTTP API: status, snapshots) and ``slice``
(every agent of a slice asked at once, one row per chip).

Used by the CLI only: may import ``common``, nothing of the agent. Imports nothing itself.
"""
