"""tpumon: a per-VM agent that watches TPU HBM and warns about slow leaks before the OOM."""

__version__ = "0.1.0"


def package_version(name: str) -> str:
    """An installed distribution's version, or "unknown".

    The distribution's own metadata file is read first where it lies beside the package
    of the same name (a wheel's install): importing ``importlib.metadata`` and searching
    every path entry for one name costs the agent ~1.8 MiB of RSS it keeps for good
    (docs/benchmarks.md), for one label of ``tpumon_build_info``."""
    return _installed_beside(name) or _searched(name)


def _installed_beside(name: str) -> str | None:
    import email.parser
    import importlib.util
    from pathlib import Path

    module = name.replace("-", "_")  # a distribution's package and dist-info spell it so
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(next(iter(spec.submodule_search_locations))).parent
    for info in site.glob(f"{module}-*.dist-info"):
        try:
            with open(info / "METADATA", encoding="utf-8") as f:
                headers = email.parser.HeaderParser().parse(f)
        except (OSError, UnicodeDecodeError):
            continue
        if (headers["Name"] or "").replace("_", "-").lower() == name.lower():
            return headers["Version"]
    return None


def _searched(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"
