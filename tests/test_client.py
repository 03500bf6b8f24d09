"""tpumon/client/http.py through the commands that use it: `status`, `watch` and `snapshot`
against real agents, plain, behind HTTPS with basic auth, and behind mutual TLS (the web
configuration files promtool accepts, certificates from a throwaway openssl CA)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_webconfig import (HASH, PASSWORD, USER, agent_url, pki, start_agent,  # noqa: F401
                            web_config)
from tools import Processes, clean_env, free_port

TPUMON = [sys.executable, "-m", "tpumon"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, *args], capture_output=True, text=True, timeout=timeout,
                          env=clean_env(), stdin=subprocess.DEVNULL)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("command", [["status"], ["status", "--format", "json"], ["watch"],
                                     ["snapshot"]])
@pytest.mark.parametrize("url, fragment", [
    ("notaurl", "is not a URL"),
    ("http://127.0.0.1:{port}", "no agent answering at http://127.0.0.1:"),
    ("http://127.0.0.1:99999", "invalid port"),
])
@pytest.mark.slow
def test_a_named_agent_that_cannot_be_asked_is_an_error(command, url, fragment):
    """It once fell back to reading the runtime, printed an empty table and exited 0.
    (`watch` waits for a named agent that does not answer yet: test_watch.py.)"""
    if command == ["watch"] and "port}" in url:
        pytest.skip("watch waits for an agent that does not answer yet")
    result = run(*command, "--agent", url.format(port=free_port()), timeout=30)
    assert_one_line_error(result, fragment)


@pytest.fixture(scope="module")
def agents(pki, tmp_path_factory):  # noqa: F811
    """An agent with HTTPS and basic auth, and one with mutual TLS."""
    tmp = tmp_path_factory.mktemp("agents")
    processes = Processes(tmp)
    auth = web_config(tmp / "web-auth.yml", {
        "tls_server_config": {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key)},
        "basic_auth_users": {USER: HASH}})
    mtls = web_config(tmp / "web-mtls.yml", {
        "tls_server_config": {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key),
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": str(pki.ca_crt)}})
    (tmp / "password").write_text(PASSWORD + "\n")
    (tmp / "wrong").write_text("not-it\n")
    try:
        start_agent(processes, "auth", auth)
        start_agent(processes, "mtls", mtls)
        yield {"auth": agent_url(processes, "auth"), "mtls": agent_url(processes, "mtls"),
               "password": tmp / "password", "wrong": tmp / "wrong"}
    finally:
        processes.stop_all()


@pytest.mark.slow
def test_status_through_tls_and_basic_auth(agents, pki):  # noqa: F811
    result = run("status", "--format", "json", "--agent", agents["auth"],
                 "--agent-ca-file", str(pki.ca_crt), "--agent-user", USER,
                 "--agent-password-file", str(agents["password"]))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["source"] == "agent" and len(doc["chips"]) == 4


def test_status_through_mutual_tls(agents, pki):  # noqa: F811
    result = run("status", "--agent", agents["mtls"], "--agent-ca-file", str(pki.ca_crt),
                 "--agent-cert-file", str(pki.client_crt), "--agent-key-file",
                 str(pki.client_key))
    assert result.returncode == 0, result.stderr
    assert "(agent)" in result.stdout


@pytest.mark.parametrize("extra, fragment", [
    ([], "refused: HTTP 401"),
    (["--agent-user", USER, "--agent-password-file", "{wrong}"], "refused: HTTP 401"),
    (["--agent-user", USER, "--agent-password-file", "/nonexistent/pw"], "password file"),
])
@pytest.mark.slow
def test_wrong_credentials_are_one_line(agents, pki, extra, fragment):  # noqa: F811
    extra = [e.format(wrong=agents["wrong"]) for e in extra]
    result = run("status", "--agent", agents["auth"], "--agent-ca-file", str(pki.ca_crt),
                 *extra)
    assert_one_line_error(result, fragment)


def test_untrusted_agent_certificate_is_one_line(agents):
    result = run("status", "--agent", agents["auth"])
    assert_one_line_error(result, "CERTIFICATE_VERIFY_FAILED")


def test_snapshot_through_basic_auth_reaches_the_agent(agents, pki):  # noqa: F811
    """The request gets past TLS and the password to the agent's own answer (the simulated
    job here has no reporter, so the agent says no process takes snapshots)."""
    result = run("snapshot", "--agent", agents["auth"], "--agent-ca-file", str(pki.ca_crt),
                 "--agent-user", USER, "--agent-password-file", str(agents["password"]),
                 "--timeout", "1")
    assert_one_line_error(result, "refused")
    assert "no reporter socket" in result.stderr  # the agent's own answer
    # not turned away by the password (the agent's port may hold "401" itself)
    assert "401" not in result.stderr.replace(agents["auth"], "")


def test_another_server_on_the_agents_port_is_not_called_an_agent(tmp_path):
    """A newcomer's `python3 -m http.server 9847` was "the agent at ... refused: HTTP 404"."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = run("status", "--agent", url)
    finally:
        server.shutdown()
    assert_one_line_error(result, f"{url} answered HTTP 404, not as a tpumon agent does")
    assert "refused" not in result.stderr
