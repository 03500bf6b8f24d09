"""tpumon: a per-VM agent that watches TPU HBM and warns about slow leaks before the OOM."""

__version__ = "0.1.0"
