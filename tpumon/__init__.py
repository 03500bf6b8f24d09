"""tpumon: a per-VM agent that watches TPU HBM and warns about slow leaks before the OOM."""

__version__ = "0.1.0"


def package_version(name: str) -> str:
    """An installed distribution's version, or "unknown"."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"
