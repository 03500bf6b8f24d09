"""The agent's HTTP endpoint: the server (``http``) and its connection bounds
(``connections``), the pages and APIs it serves (``status``, ``snapshot_api``,
``report_page``, ``templates``), TLS and basic auth from a web-config file (``webconfig``).

A reader of the poll state: may import ``state`` and everything below it, ``notify``,
``store`` and ``metrics`` (for /metrics). Imports nothing itself.
"""
