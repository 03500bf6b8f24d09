"""TLS and basic auth for the exporter (exporter.web_config_file, the exporter-toolkit's web
configuration format), checked the way users meet them:

- every web configuration used here is first checked by the real ``promtool check
  web-config`` (Prometheus 2.42): the valid ones pass it, and each invalid one is rejected by
  promtool and tpumon alike (a few that promtool accepts and tpumon cannot honour are
  listed apart);
- real ``tpumon agent --simulate`` processes serve HTTPS with basic auth and with mutual TLS,
  scraped by a real Prometheus (tls_config, basic_auth) until ``up == 1``;
- certificates come from a throwaway CA made with the openssl command line.

Never a timing assertion: the machine is small and shared.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge

from tools import Processes, clean_env, free_port, require_tool, wait_for
from tpumon.common.config import ConfigError
from tpumon.web.http import MetricsServer
from tpumon.web.webconfig.live import (CIPHERS_TLS12, CIPHERS_TLS13, BasicAuth,
                                       LiveWebConfig, load_web_config)

TPUMON = [sys.executable, "-m", "tpumon"]
USER = "prometheus"
PASSWORD = "tr0ub4dor&3-horse"  # never to be seen in a log
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()

OPENSSL_CNF = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
[client]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
"""


# --- certificates and web configuration files --------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> SimpleNamespace:
    """A CA with a server certificate (localhost, 127.0.0.1), a renewed server certificate,
    a client certificate, and a client certificate from another CA."""
    require_tool("openssl")
    d = tmp_path_factory.mktemp("pki")
    (d / "openssl.cnf").write_text(OPENSSL_CNF)
    serial = iter(range(1000, 2000))

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    def new_key(name: str) -> None:
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", f"{name}.key")

    def ca(name: str) -> None:
        new_key(name)
        openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt",
                "-days", "3", "-subj", f"/CN={name}", "-config", "openssl.cnf",
                "-extensions", "ca")

    def issue(name: str, issuer: str, profile: str) -> None:
        new_key(name)
        openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", "-config", "openssl.cnf")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt",
                "-CAkey", f"{issuer}.key", "-set_serial", str(next(serial)), "-days", "2",
                "-out", f"{name}.crt", "-extfile", "openssl.cnf", "-extensions", profile)

    ca("ca")
    ca("rogue-ca")
    issue("server", "ca", "server")
    issue("server2", "ca", "server")
    issue("client", "ca", "client")
    issue("rogue-client", "rogue-ca", "client")
    openssl("pkey", "-in", "server.key", "-aes256", "-passout", "pass:xyz",
            "-out", "encrypted.key")
    return _pki_namespace(d)


def _pki_namespace(d: Path) -> SimpleNamespace:
    names = {}
    for path in d.iterdir():
        if path.suffix in (".crt", ".key"):
            names[f"{path.stem.replace('-', '_')}_{path.suffix[1:]}"] = path
    return SimpleNamespace(dir=d, **names)


def promtool_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), "check", "web-config", str(path)],
                          capture_output=True, text=True, timeout=30)


def web_config(path: Path, doc: dict | str) -> Path:
    """Write a web configuration file that promtool must accept."""
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    result = promtool_check(path)
    assert result.returncode == 0, f"promtool rejects {path}: {result.stdout}{result.stderr}"
    return path


# --- clients ------------------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def fetch(url: str, ca: Path | None = None, auth: str | None = None,
          cert: tuple[Path, Path] | None = None) -> tuple[int, dict, str]:
    """(status, headers, body); raises OSError when the connection or handshake fails."""
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cert:
            context.load_cert_chain(*cert)
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()
    except http.client.HTTPException as exc:  # the server hung up mid-response
        raise ConnectionError(repr(exc)) from exc


def refused(url: str, **kwargs) -> bool:
    try:
        fetch(url, **kwargs)
    except OSError:
        return True
    return False


def peer_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


# --- real agents behind a real Prometheus -------------------------------------------------


def start_agent(processes: Processes, name: str, web: Path, *extra: str) -> None:
    processes.start(name, [*TPUMON, "agent", "--simulate", "--listen-address", "127.0.0.1:0",
                           "--poll-interval", "0.5", "--web-config-file", str(web), *extra],
                    env=clean_env())


def agent_url(processes: Processes, name: str) -> str:
    def found():
        processes.check_alive()
        return re.search(r"serving metrics on (https?://\S+)/metrics", processes.log(name))

    return wait_for(found, timeout=60, interval=0.2).group(1)


@pytest.fixture(scope="module")
def stack(pki, tmp_path_factory):
    """Two agents: HTTPS with basic auth (and two headers), and mutual TLS (relative paths
    in its file); one Prometheus scraping both."""
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("stack")
    processes = Processes(tmp)
    auth_web = web_config(tmp / "web-auth.yml", {
        "tls_server_config": {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key)},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff",
                                           "X-Frame-Options": "deny"}},
        "basic_auth_users": {USER: HASH,
                             "alice": bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()},
    })
    mtls_web = web_config(pki.dir / "web-mtls.yml", {  # beside the certificates: relative paths
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": "ca.crt", "min_version": "TLS13"},
    })
    try:
        start_agent(processes, "agent-auth", auth_web, "--log-level", "debug")
        start_agent(processes, "agent-mtls", mtls_web)
        auth_url, mtls_url = agent_url(processes, "agent-auth"), agent_url(processes, "agent-mtls")
        (tmp / "password").write_text(PASSWORD + "\n")
        prom_port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "tpumon-auth", "scheme": "https",
                 "tls_config": {"ca_file": str(pki.ca_crt)},
                 "basic_auth": {"username": USER, "password_file": str(tmp / "password")},
                 "static_configs": [{"targets": [urllib.parse.urlsplit(auth_url).netloc]}]},
                {"job_name": "tpumon-mtls", "scheme": "https",
                 "tls_config": {"ca_file": str(pki.ca_crt), "cert_file": str(pki.client_crt),
                                "key_file": str(pki.client_key)},
                 "static_configs": [{"targets": [urllib.parse.urlsplit(mtls_url).netloc]}]},
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        processes.start("prometheus", [
            prometheus, f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        yield SimpleNamespace(auth=auth_url, mtls=mtls_url, processes=processes,
                              prometheus=f"http://127.0.0.1:{prom_port}")
    finally:
        processes.stop_all()


@pytest.mark.e2e
def test_https_with_basic_auth_serves_metrics(stack, pki):
    assert stack.auth.startswith("https://127.0.0.1:")
    status, headers, body = fetch(f"{stack.auth}/metrics", ca=pki.ca_crt,
                                  auth=basic(USER, PASSWORD))
    assert status == 200 and "tpumon_" in body
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "deny"
    for path in ("/", "/api/status", "/-/healthy"):
        assert fetch(stack.auth + path, ca=pki.ca_crt, auth=basic(USER, PASSWORD))[0] == 200
    # ... and by its name (the certificate names localhost too); twice, from the cache
    for _ in range(2):
        port = urllib.parse.urlsplit(stack.auth).port
        assert fetch(f"https://localhost:{port}/metrics", ca=pki.ca_crt,
                     auth=basic(USER, PASSWORD))[0] == 200


@pytest.mark.e2e
def test_server_certificate_must_be_trusted(stack):
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(f"{stack.auth}/metrics", auth=basic(USER, PASSWORD))  # system CAs only


@pytest.mark.e2e
def test_plain_http_is_refused(stack):
    url = stack.auth.replace("https://", "http://")
    status, _, body = fetch(f"{url}/metrics", auth=basic(USER, PASSWORD))
    assert status == 400 and "HTTP request to an HTTPS server" in body
    assert fetch(stack.mtls.replace("https://", "http://") + "/metrics")[0] == 400


@pytest.mark.e2e
@pytest.mark.parametrize("auth", [
    None, basic(USER, "wrong"), basic("mallory", PASSWORD), basic(USER, ""),
    basic(USER, PASSWORD + "x"), "Bearer " + PASSWORD, "Basic not-base64!",
    basic(USER, PASSWORD.upper()), basic(USER, "a" * 100),
], ids=["none", "wrong-password", "unknown-user", "empty-password", "longer", "bearer",
        "garbage", "case", "over-72-bytes"])
def test_missing_or_wrong_credentials_get_401_everywhere(stack, pki, auth):
    for path in ("/metrics", "/", "/api/status", "/-/healthy", "/nope"):
        status, headers, body = fetch(stack.auth + path, ca=pki.ca_crt, auth=auth)
        assert status == 401, path
        assert headers["WWW-Authenticate"] == 'Basic realm="tpumon"'
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "tpumon_" not in body


@pytest.mark.e2e
def test_mutual_tls_requires_a_client_certificate_from_the_ca(stack, pki):
    url = f"{stack.mtls}/metrics"
    assert refused(url, ca=pki.ca_crt)  # no client certificate
    assert refused(url, ca=pki.ca_crt, cert=(pki.rogue_client_crt, pki.rogue_client_key))
    status, _, body = fetch(url, ca=pki.ca_crt, cert=(pki.client_crt, pki.client_key))
    assert status == 200 and "tpumon_" in body
    context = ssl.create_default_context(cafile=str(pki.ca_crt))
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # min_version: TLS13
    context.load_cert_chain(pki.client_crt, pki.client_key)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=10, context=context)


@pytest.mark.e2e
def test_prometheus_scrapes_through_tls_basic_auth_and_client_certificates(stack):
    def up() -> dict[str, str] | None:
        stack.processes.check_alive()
        try:
            with urllib.request.urlopen(f"{stack.prometheus}/api/v1/query?query=up",
                                        timeout=5) as r:
                result = json.loads(r.read())["data"]["result"]
        except OSError:
            return None
        values = {s["metric"]["job"]: s["value"][1] for s in result}
        return values if values == {"tpumon-auth": "1", "tpumon-mtls": "1"} else None

    try:
        wait_for(up, timeout=45, interval=0.5)
    except AssertionError:
        targets = urllib.request.urlopen(f"{stack.prometheus}/api/v1/targets", timeout=5).read()
        raise AssertionError(f"targets: {targets.decode()[:3000]}") from None


@pytest.mark.e2e
def test_no_secret_in_the_logs_and_no_traceback(stack, pki):
    """After the others in file order, the debug log has seen every kind of request; it
    makes some of its own (run alone, or on another xdist worker, it once found no 401 in
    the log, and failed)."""
    for auth in (None, basic(USER, "wrong"), "Bearer " + PASSWORD, basic(USER, PASSWORD)):
        fetch(stack.auth + "/metrics", ca=pki.ca_crt, auth=auth)
    wait_for(lambda: "401 for GET /metrics" in stack.processes.log("agent-auth"),
             timeout=10, interval=0.1)
    for name in stack.processes.procs:
        if name.startswith("agent"):
            log_text = stack.processes.log(name)
            assert PASSWORD not in log_text and PASSWORD.upper() not in log_text
            assert base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode() not in log_text
            assert HASH not in log_text
            assert "Traceback" not in log_text


# --- start-up errors ----------------------------------------------------------------------


def bad_configs(pki) -> list[tuple[str, str, list[str]]]:
    """(name, file content, fragments of tpumon's one-line error). promtool rejects each."""
    crt, key = pki.server_crt, pki.server_key
    tls = f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
    return [
        ("prometheus-client-keys", f"tls_config:\n  ca_file: {crt}\n",
         ["unknown key 'tls_config'"]),
        ("misspelt", f"tls_server_config:\n  cert_fle: {crt}\n  key_file: {key}\n",
         ["unknown key 'tls_server_config.cert_fle'",
          "did you mean 'tls_server_config.cert_file'"]),
        ("newer-key", tls + "  client_allowed_sans: [prometheus]\n",
         ["tls_server_config.client_allowed_sans is not supported"]),
        ("no-key-file", f"tls_server_config:\n  cert_file: {crt}\n", ["key_file is missing"]),
        ("missing-cert", f"tls_server_config:\n  cert_file: {pki.dir}/nope.crt\n"
                         f"  key_file: {key}\n", ["cert_file", "nope.crt", "cannot read it"]),
        ("key-mismatch", f"tls_server_config:\n  cert_file: {crt}\n  key_file: {pki.client_key}\n",
         ["not a PEM certificate and its private key"]),
        ("encrypted-key", f"tls_server_config:\n  cert_file: {crt}\n"
                          f"  key_file: {pki.encrypted_key}\n", ["is encrypted"]),
        ("ca-without-policy", tls + f"  client_ca_file: {pki.ca_crt}\n",
         ["client_ca_file is set but client_auth_type is NoClientCert"]),
        ("missing-ca", tls + "  client_auth_type: RequireAndVerifyClientCert\n"
                             f"  client_ca_file: {pki.dir}/nope-ca.crt\n",
         ["client_ca_file", "cannot read it"]),
        ("bad-policy", tls + "  client_auth_type: Bogus\n", ["unknown policy 'Bogus'"]),
        ("bad-version", tls + "  min_version: TLS9\n", ["unknown TLS version 'TLS9'"]),
        ("insecure-cipher", tls + "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
         ["unknown or insecure cipher suite 'TLS_RSA_WITH_RC4_128_SHA'"]),
        ("plaintext-password", f"basic_auth_users:\n  {USER}: {PASSWORD}\n",
         [f"basic_auth_users.{USER} is not a bcrypt hash"]),
        ("bcrypt-cost-3", f"basic_auth_users:\n  {USER}: '$2y$03${HASH[7:]}'\n",
         ["bcrypt cost 3 is outside 4-31"]),
        ("users-list", f"basic_auth_users:\n  - {USER}\n", ["basic_auth_users must be a mapping"]),
        ("other-header", "http_server_config:\n  headers:\n    X-Foo: bar\n",
         ["header 'X-Foo' cannot be configured"]),
        ("frame-options", "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
         ["X-Frame-Options must be one of deny, sameorigin"]),
        ("duplicate", tls + f"  cert_file: {crt}\n", ["'cert_file' given twice"]),
        ("junk", "junk\n", ["must be a mapping"]),
        ("not-yaml", "tls_server_config: [\n", ["invalid YAML at line"]),
    ]


@pytest.mark.e2e
def test_promtool_and_tpumon_reject_the_same_bad_files(pki, tmp_path):
    for name, content, fragments in bad_configs(pki):
        path = tmp_path / f"{name}.yml"
        path.write_text(content)
        assert promtool_check(path).returncode != 0, f"promtool accepts {name}"
        with pytest.raises(ConfigError) as error:
            LiveWebConfig(path)
        message = str(error.value)
        assert "\n" not in message and message.startswith(f"web config file {path}"), message
        for fragment in fragments:
            assert fragment in message, (name, message)
        assert PASSWORD not in message


@pytest.mark.e2e
def test_what_promtool_accepts_but_tpumon_cannot_honour_is_rejected_clearly(pki, tmp_path):
    """Python's ssl module cannot ask for a client certificate without verifying it, speak
    TLS 1.0/1.1 under OpenSSL 3, or set a curve list; and tpumon will not verify client
    certificates against the system's CAs."""
    tls = (f"tls_server_config:\n  cert_file: {pki.server_crt}\n"
           f"  key_file: {pki.server_key}\n")
    for content, fragment in [
        (tls + "  client_auth_type: RequireAnyClientCert\n",
         "client_auth_type RequireAnyClientCert is not supported"),
        (tls + f"  client_auth_type: RequestClientCert\n  client_ca_file: {pki.ca_crt}\n",
         "client_auth_type RequestClientCert is not supported"),
        (tls + "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        (tls + "  min_version: TLS10\n", "min_version TLS10 is not supported"),
        (tls + "  curve_preferences: [X25519]\n", "curve_preferences is not supported"),
        (tls + "  min_version: TLS13\n  max_version: TLS12\n", "min_version is above"),
    ]:
        path = web_config(tmp_path / "web.yml", content)
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            LiveWebConfig(path)


@pytest.mark.parametrize("how", ["flag-missing-file", "env-plaintext-password"])
@pytest.mark.slow
def test_agent_refuses_a_bad_web_config_in_one_line(pki, tmp_path, how):
    env = clean_env()
    args = [*TPUMON, "agent", "--simulate", "--listen-address", "127.0.0.1:0"]
    if how == "flag-missing-file":
        path = tmp_path / "missing.yml"
        args += ["--web-config-file", str(path)]
        fragments = ["cannot read it", "exporter.web_config_file"]
    else:
        path = tmp_path / "web.yml"
        path.write_text(f"basic_auth_users:\n  {USER}: {PASSWORD}\n")
        env["TPUMON_EXPORTER_WEB_CONFIG_FILE"] = str(path)
        fragments = ["is not a bcrypt hash"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and PASSWORD not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: web config file {path}"), lines
    for fragment in fragments:
        assert fragment in lines[0]


# --- in-process: what the file format allows ----------------------------------------------


@pytest.fixture
def serve(tmp_path):
    """Factory: a MetricsServer with a web configuration on a free loopback port."""
    servers: list[MetricsServer] = []

    def start(web: Path | str) -> int:
        server = MetricsServer("127.0.0.1:0", str(web))
        _, port = server.start()
        registry = CollectorRegistry()
        Gauge("tpumon_test_value", "A value.", registry=registry).set(1)
        server.attach(registry, lambda: None)
        servers.append(server)
        return port

    yield start
    for server in servers:
        server.stop()


def test_every_cipher_suite_name_maps_to_openssl(pki, tmp_path):
    for openssl_name in CIPHERS_TLS12.values():
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(openssl_name)  # known to OpenSSL
    path = web_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_crt), "key_file": str(pki.server_key),
        "max_version": "TLS12", "prefer_server_cipher_suites": False,
        "cipher_suites": [*CIPHERS_TLS12, *CIPHERS_TLS13]}})
    assert LiveWebConfig(path).context is not None


def test_cipher_suites_limit_tls12(pki, tmp_path, serve):
    port = serve(web_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_crt), "key_file": str(pki.server_key),
        "max_version": "TLS12",
        "cipher_suites": ["TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"]}}))
    context = ssl.create_default_context(cafile=str(pki.ca_crt))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.version() == "TLSv1.2"
            assert tls.cipher()[0] == "ECDHE-ECDSA-CHACHA20-POLY1305"


def test_verify_client_cert_if_given(pki, tmp_path, serve):
    port = serve(web_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_crt), "key_file": str(pki.server_key),
        "client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": str(pki.ca_crt)}}))
    url = f"https://127.0.0.1:{port}/metrics"
    assert fetch(url, ca=pki.ca_crt)[0] == 200
    assert fetch(url, ca=pki.ca_crt, cert=(pki.client_crt, pki.client_key))[0] == 200
    assert refused(url, ca=pki.ca_crt, cert=(pki.rogue_client_crt, pki.rogue_client_key))


def test_basic_auth_without_tls(tmp_path, serve):
    port = serve(web_config(tmp_path / "web.yml", {"basic_auth_users": {USER: HASH}}))
    url = f"http://127.0.0.1:{port}/metrics"
    assert fetch(url)[0] == 401
    status, _, body = fetch(url, auth=basic(USER, PASSWORD))
    assert status == 200 and "tpumon_test_value 1.0" in body


def test_empty_web_config_is_plain_http(tmp_path, serve):
    port = serve(web_config(tmp_path / "web.yml", ""))
    assert fetch(f"http://127.0.0.1:{port}/metrics")[0] == 200


def test_a_silent_client_does_not_stall_the_others(pki, tmp_path, serve):
    port = serve(web_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_crt), "key_file": str(pki.server_key)}}))
    with socket.create_connection(("127.0.0.1", port)), \
            socket.create_connection(("127.0.0.1", port)):  # connect, say nothing
        assert fetch(f"https://127.0.0.1:{port}/metrics", ca=pki.ca_crt)[0] == 200


def test_renewed_certificate_is_served_without_a_restart(pki, tmp_path, serve, caplog):
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    crt.write_bytes(pki.server_crt.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    port = serve(web_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": "tls.crt", "key_file": "tls.key"}}))
    der = ssl.PEM_cert_to_DER_cert
    assert peer_certificate(port, pki.ca_crt) == der(pki.server_crt.read_text())
    crt.write_bytes(pki.server2_crt.read_bytes())  # as certbot or cert-manager would
    key.write_bytes(pki.server2_key.read_bytes())
    os.utime(crt, ns=(0, 10**18))  # a different mtime, however coarse the clock
    assert peer_certificate(port, pki.ca_crt) == der(pki.server2_crt.read_text())
    with caplog.at_level(logging.WARNING, logger="tpumon.exporter"):
        crt.write_text("not a certificate\n")  # a broken renewal: the last good one stays
        os.utime(crt, ns=(0, 2 * 10**18))
        assert peer_certificate(port, pki.ca_crt) == der(pki.server2_crt.read_text())
    assert "keeping the previous web configuration" in caplog.text


def test_basic_auth_caches_bcrypt(monkeypatch):
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw",
                        lambda password, hashed: calls.append(1) or real(password, hashed))
    auth, users = BasicAuth(), {USER: HASH.encode()}
    for _ in range(3):
        assert auth.check(users, basic(USER, PASSWORD)) == USER
        assert auth.check(users, basic(USER, "wrong")) is None
        assert auth.check(users, basic("nobody", PASSWORD)) is None  # checks a fake hash
    assert len(calls) == 3
    assert auth.check(users, None) is None and auth.check(users, "Basic Og==") is None
    assert len(calls) == 4  # ':' decodes to an empty user: checked like any unknown user


def test_start_up_line_says_how_the_endpoint_is_protected(pki, tmp_path):
    path = web_config(tmp_path / "web.yml", {
        "tls_server_config": {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key),
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": str(pki.ca_crt)},
        "basic_auth_users": {USER: HASH, "alice": HASH}})
    assert load_web_config(path).describe() == (
        "TLS, client certificate required, basic auth (2 users)")


def test_the_examples_in_deploy_md_pass_promtool_and_tpumon(pki, tmp_path):
    doc = (Path(__file__).resolve().parent.parent / "docs/deploy.md").read_text()
    section = doc[doc.index("## 6. Securing the endpoint"):]
    web, scrape = re.findall(r"```yaml\n(.*?)```", section, re.S)[:2]
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls/tpumon.crt").write_bytes(pki.server_crt.read_bytes())
    (tmp_path / "tls/tpumon.key").write_bytes(pki.server_key.read_bytes())
    config = LiveWebConfig(web_config(tmp_path / "web.yml", web)).config
    assert config.tls and list(config.users) == ["prometheus"]
    prometheus_yml = tmp_path / "prometheus.yml"
    prometheus_yml.write_text(scrape)
    result = subprocess.run([require_tool("promtool"), "check", "config", str(prometheus_yml)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
