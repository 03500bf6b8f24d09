"""What the agent makes of what it polled, besides the HBM trend: the training processes
and their count trends (``processes``, ``counts``), a job's end and its cause
(``job_ends``, ``known_issues``), when to ask for tensor snapshots (``leak_snapshots``).

Above ``sources`` and ``detect``, below the poll state: may import ``common``,
``instrument``, ``sources`` and ``detect``. Imports nothing itself.
"""
