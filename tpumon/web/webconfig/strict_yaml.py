"""YAML's safe loader refusing duplicate keys, like Go's yaml.UnmarshalStrict (what the
exporter-toolkit reads web configuration files with).

A module of its own so that PyYAML is imported only when a web configuration file is
read: the agent without one never loads it (about 0.8 MiB of RSS, docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import yaml

YAMLError = yaml.YAMLError


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing duplicate keys like Go's yaml.UnmarshalStrict."""


def _no_duplicates(loader: StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: the constructor below says so
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice", key_node.start_mark)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_strict(text: str) -> Any:
    """The document in ``text``; yaml.YAMLError (with its marks) when it is not valid."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
