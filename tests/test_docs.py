"""The docs stay true: every configuration key and metric is documented as it is."""

import re
from pathlib import Path

from tpumon.common.config import SCHEMA, _toml_value, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_every_config_key_documented_with_its_default():
    doc = (ROOT / "docs/configuration.md").read_text()
    for key in SCHEMA:
        row = re.search(rf"^\| `{key.name}` \| `([^`]*)` \| `{key.env_var}` \|", doc, re.M)
        assert row, f"{key.dotted} missing from docs/configuration.md"
        assert row.group(1) == _toml_value(key.default), key.dotted


def test_example_config_file_has_every_key_at_its_default():
    config = load_config(ROOT / "deploy/tpumon.toml.example", env={})
    for key in SCHEMA:
        assert config.origins[key.dotted].startswith("config file"), key.dotted
        assert config[key.dotted] == key.default, key.dotted


def test_readme_gives_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
