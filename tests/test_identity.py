"""Identity labels: precedence, and the metadata server (a real HTTP server on loopback)."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpumon.common.identity import (TPU_ENV_PATH, discover_tpu_env, fetch_tpu_env, on_gce,
                                    parse_tpu_env, resolve_identity)

TPU_ENV = ("ACCELERATOR_TYPE: 'v4-256'\nNODE_ID: 'penghao-tpu-1'\n"
           "TPU_RUNTIME_METRICS_PORTS: '8431,8432,8433,8434'\nWORKER_ID: '5'\n"
           "ZONE: 'us-central2-b'\nEMPTY: ''\n")


class MetadataServer:
    """Answers like the GCE metadata server: tpu-env only with the Metadata-Flavor header."""

    def __init__(self, delay: float = 0.0):
        seen = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append((self.path, self.headers.get("Metadata-Flavor")))
                time.sleep(delay)
                if self.path != TPU_ENV_PATH or self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(404)
                    return
                body = TPU_ENV.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metadata():
    servers = []

    def start(delay=0.0):
        servers.append(MetadataServer(delay))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_parse_tpu_env():
    env = parse_tpu_env(TPU_ENV)
    assert env["ACCELERATOR_TYPE"] == "v4-256" and env["WORKER_ID"] == "5"
    assert env["TPU_RUNTIME_METRICS_PORTS"] == "8431,8432,8433,8434" and env["EMPTY"] == ""


def test_fetch_from_metadata_server(metadata):
    server = metadata()
    env = fetch_tpu_env(1.0, {"GCE_METADATA_HOST": server.host})
    assert env["NODE_ID"] == "penghao-tpu-1"
    assert server.requests == [(TPU_ENV_PATH, "Google")]


def test_slow_metadata_server_costs_at_most_the_timeout(metadata):
    server = metadata(delay=3.0)
    started = time.monotonic()
    assert fetch_tpu_env(0.3, {"GCE_METADATA_HOST": server.host}) == {}
    assert time.monotonic() - started < 1.0


def test_no_metadata_server_is_empty():
    from tools import free_port
    assert fetch_tpu_env(0.5, {"GCE_METADATA_HOST": f"127.0.0.1:{free_port()}"}) == {}


def test_metadata_modes(metadata, tmp_path, monkeypatch):
    server = metadata()
    env = {"GCE_METADATA_HOST": server.host}
    assert discover_tpu_env("off", 1.0, env) == {}
    assert discover_tpu_env("on", 1.0, env)["WORKER_ID"] == "5"
    dmi = tmp_path / "product_name"
    dmi.write_text("Standard PC (Q35 + ICH9, 2009)\n")
    monkeypatch.setattr("tpumon.common.identity.DMI_PRODUCT", dmi)
    assert discover_tpu_env("auto", 1.0, env) == {}  # not GCE: never asks
    assert len(server.requests) == 1
    dmi.write_text("Google Compute Engine\n")
    assert discover_tpu_env("auto", 1.0, env)["WORKER_ID"] == "5"
    assert on_gce(dmi) and not on_gce(tmp_path / "missing")


def test_precedence_config_env_metadata_hostname():
    tpu_env = parse_tpu_env(TPU_ENV)
    ident = resolve_identity({"hostname": "t1v-n-0a1b2c3d-w-7"}, tpu_env, env={})
    assert (ident.worker, ident.accelerator_type, ident.slice) == ("5", "v4-256", "penghao-tpu-1")
    assert ident.origins["worker"] == "tpu-env WORKER_ID"
    ident = resolve_identity({"hostname": "t1v-n-0a1b2c3d-w-7"}, tpu_env,
                             env={"TPU_WORKER_ID": "2", "TPU_ACCELERATOR_TYPE": "v5p-64"})
    assert (ident.worker, ident.accelerator_type) == ("2", "v5p-64")
    ident = resolve_identity({"hostname": "t1v-n-0a1b2c3d-w-7", "worker": "9"}, tpu_env,
                             env={"TPU_WORKER_ID": "2"})
    assert ident.worker == "9" and ident.origins["worker"] == "config"
    ident = resolve_identity({"hostname": "t1v-n-0a1b2c3d-w-7"}, {}, env={})
    assert ident.worker == "7" and ident.origins["worker"] == "hostname suffix"
    assert ident.labels() == {"host": "t1v-n-0a1b2c3d-w-7", "worker": "7",
                              "accelerator_type": "", "slice": ""}


def test_hostname_defaults_to_the_machine():
    import socket
    ident = resolve_identity({}, {}, env={})
    assert ident.host == socket.gethostname() and ident.origins["host"] == "gethostname()"
