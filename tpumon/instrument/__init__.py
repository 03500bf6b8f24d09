"""In-process reporters: what only the training process knows, sent to the tpumon agent.

Two lines in a training loop::

    from tpumon.instrument import TorchXlaReporter    # or JaxReporter
    reporter = TorchXlaReporter()                     # before the loop
    ...
        torch_xla.sync()
        reporter.step(step)                           # after each step

Imports only the standard library (and the framework the reporter is for, when it is
created), so adding it to a training job adds no dependency. Reports go to the agent on
a connection of the reporter's own, beside its socket (``$TPUMON_REPORTER_SOCKET``,
default /run/tpumon/reporter.sock), or as datagrams to that socket where no connection
can be made; with no agent listening they are dropped, never an error in the training
loop.
"""

from tpumon.instrument.protocol import PROTOCOL_VERSION
from tpumon.instrument.reporter import Reporter

__all__ = ["PROTOCOL_VERSION", "Reporter", "TorchXlaReporter", "JaxReporter"]


def __getattr__(name: str) -> type:
    """The framework reporters load on first use, so importing this package never imports
    torch or jax."""
    if name == "TorchXlaReporter":
        from tpumon.instrument.torch_xla import TorchXlaReporter
        return TorchXlaReporter
    if name == "JaxReporter":
        from tpumon.instrument.jax import JaxReporter
        return JaxReporter
    raise AttributeError(name)
