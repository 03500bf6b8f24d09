"""The web configuration format as a schema (web/webconfig/schema.py): each kind of mistake is
one line naming the key, never echoing a value that may be a password (the files that
promtool also rejects, and the TLS ones, are in test_webconfig.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpumon.common.config import ConfigError
from tpumon.web.webconfig.live import load_web_config

HASH = "$2y$10$" + "a" * 53


@pytest.mark.parametrize("content, message", [
    ("http_server_config:\n  http2: 'yes'\n", "http_server_config.http2 must be true or false"),
    ("http_server_config:\n  headers:\n    X-XSS-Protection: \"a\\nb\"\n",
     "http_server_config.headers.X-XSS-Protection must be a one-line string"),
    (f"basic_auth_users:\n  123: '{HASH}'\n",
     "basic_auth_users: user name 123 must be a string (quote it)"),
    ("basic_auth_users:\n  bob: 123\n", "basic_auth_users.bob must be a bcrypt hash string"),
    ("basic_auth_users:\n  bob: s3cret-pw\n", "basic_auth_users.bob is not a bcrypt hash"),
    ("tls_server_config: 3\n", "tls_server_config must be a mapping of keys to values"),
    ("tls_server_config:\n  cert_file: 3\n  key_file: k\n",
     "tls_server_config.cert_file must be a string"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: TLS_AES_128_GCM_SHA256\n",
     "tls_server_config.cipher_suites must be a list of names"),
    ("tls_server_config:\n  min_version: TLS13\n  max_version: TLS12\n",
     "tls_server_config.min_version is above max_version"),
    ("rate_limit:\n  interval: 1s\n", "rate_limit is not supported by tpumon"),
    ("junk\n", "the file must be a mapping of keys to values"),
    ("basic_auth_user:\n  a: b\n",
     "unknown key 'basic_auth_user' (did you mean 'basic_auth_users'?)"),
])
def test_each_mistake_is_one_line_naming_the_key(tmp_path, content, message):
    path = tmp_path / "web.yml"
    path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_web_config(path)
    text = str(error.value)
    assert text.startswith(f"web config file {path}: ") and "\n" not in text
    assert message in text, text
    assert "s3cret-pw" not in text


def test_nulls_are_defaults_and_go_reads_2_as_2a(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\nhttp_server_config:\n  headers:\n"
                    "    X-XSS-Protection: null\n    X-Frame-Options: deny\n"
                    f"basic_auth_users:\n  bob: '$2${HASH[4:]}'\n")
    config = load_web_config(path)
    assert config.tls is None and config.http2
    assert config.headers == (("X-Frame-Options", "deny"),)
    assert config.users == {"bob": ("$2a$" + HASH[4:]).encode()}


def test_an_agent_without_a_web_config_never_loads_pydantic():
    """pydantic costs the agent ~100 ms of start-up and ~7 MiB: only a web config pays."""
    code = ("import sys; import tpumon.agent.bootstrap, tpumon.web.http, tpumon.cli.agent; "
            "assert 'pydantic' not in sys.modules, 'pydantic loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
