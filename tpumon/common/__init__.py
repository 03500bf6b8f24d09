"""What every layer shares: the configuration schema (``config``), the records sources
produce (``samples``), units and sentences (``units``, ``describe``), text from others made
safe (``untrusted_text``), the host's labels (``identity``), private files
(``private_paths``) and stop/reload signals as events (``signals``).

The bottom of the stack: these modules import each other and ``tpumon.instrument.protocol``
(standard library only), nothing else of tpumon's. Imports nothing itself.
"""
