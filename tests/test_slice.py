"""`tpumon status --slice`: peers from --peers, the TPU VM metadata and a headless
service's DNS name; every agent asked at once under one deadline; a worker that does not
answer is shown as such; one row per chip and a summary line; agents behind TLS and
basic auth (the same throwaway CA and agents as tests/test_webconfig.py)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_webconfig import PASSWORD, USER, pki, stack  # noqa: F401 (fixtures)
from tools import TPUMON, clean_env, free_port, wait_for
from tpumon.sim.metadata import MetadataServer
from tpumon.client.slice import (ClientOptions, SliceError, WorkerAnswer, ask_all, build_view,
                                 peer_url, peers_from_metadata, peers_from_service, summary_line)

GiB = 2**30


def status_doc(worker: int, verdicts: list[str], now: float = 1000.0,
               ooms: list[float | None] | None = None) -> dict:
    """An agent's /api/status as tpumon/web/status.py writes it (the fields --slice reads)."""
    ooms = ooms or [None] * len(verdicts)
    return {"time": now, "identity": {"host": f"t1v-n-x-w-{worker}", "worker": str(worker),
                                      "accelerator_type": "v4-32", "slice": "my-tpu"},
            "sources": {}, "chips": [
                {"chip": str(c), "up": True, "hbm_used_bytes": 20 * GiB,
                 "hbm_total_bytes": 32 * GiB, "verdict": v, "growth_bytes_per_step": 150e3,
                 "growth_bytes_per_hour": None, "predicted_oom_time": oom}
                for c, (v, oom) in enumerate(zip(verdicts, ooms, strict=True))]}


class StatusServer:
    """A loopback HTTP server answering /api/status with a fixed document (or hanging)."""

    def __init__(self, document: dict | None, host: str = "127.0.0.1", port: int = 0,
                 hang: float = 0.0):
        body = json.dumps(document).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                time.sleep(hang)
                try:
                    self.send_response(200 if self.path == "/api/status" else 404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up waiting: what the hanging one is for

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.address = f"{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    started = []

    def start(*args, **kwargs) -> StatusServer:
        started.append(StatusServer(*args, **kwargs))
        return started[-1]

    yield start
    for s in started:
        s.close()


def test_summary_names_the_slice_the_leak_and_the_first_oom():
    answers = [WorkerAnswer(f"10.0.0.{w}", f"http://10.0.0.{w}:9847",
                            status_doc(w, ["leak"] * 4, ooms=[1000 + 3600 * (9 - w) + c * 60
                                                              for c in range(4)]))
               for w in range(4)]
    view = build_view(answers)
    assert len(view.chips) == 16
    assert [(c.worker, c.chip) for c in view.chips[:5]] == \
        [("0", "0"), ("0", "1"), ("0", "2"), ("0", "3"), ("1", "0")]
    assert summary_line(view) == ("v4-32 slice my-tpu: 4 of 4 workers answered, 16 chips; "
                                  "16 leaking, first OOM w-3 chip 0 in 6.0 h")


def test_a_worker_that_does_not_answer_is_said_and_hides_nothing():
    answers = [WorkerAnswer("10.0.0.1", "http://10.0.0.1:9847", status_doc(1, ["ok", "ok"])),
               WorkerAnswer("10.0.0.2", "http://10.0.0.2:9847", error="no answer within 1 s",
                            state="late")]
    view = build_view(answers)
    assert len(view.chips) == 2
    assert summary_line(view) == ("v4-32 slice my-tpu: 1 of 2 workers answered, 2 chips; "
                                  "no leak; 1 late (10.0.0.2)")
    assert view.to_json()["workers"][1] == {"peer": "10.0.0.2", "url": "http://10.0.0.2:9847",
                                            "up": False, "state": "late",
                                            "error": "no answer within 1 s",
                                            "identity": None}


def test_a_slice_without_verdicts_is_not_called_leak_free():
    """`status --slice` said "no leak" when all 16 chips were insufficient_data."""
    answers = [WorkerAnswer(f"10.0.0.{w}", f"http://10.0.0.{w}:9847",
                            status_doc(w, ["insufficient_data"] * 2 + ["warming_up"] * 2))
               for w in range(4)]
    line = summary_line(build_view(answers))
    assert "no leak" not in line
    assert line == ("v4-32 slice my-tpu: 4 of 4 workers answered, 16 chips; 8 warming up, "
                    "8 collecting")
    mixed = [WorkerAnswer("10.0.0.1", "http://10.0.0.1:9847",
                          status_doc(1, ["ok", "insufficient_data"]))]
    assert summary_line(build_view(mixed)).endswith("2 chips; 1 ok, 1 collecting")


def test_peer_urls():
    assert peer_url("10.0.0.2", 9847, "http") == "http://10.0.0.2:9847"
    assert peer_url("10.0.0.2:1234", 9847, "https") == "https://10.0.0.2:1234"
    assert peer_url("fd00::2", 9847, "http") == "http://[fd00::2]:9847"
    assert peer_url("[fd00::2]:1", 9847, "http") == "http://[fd00::2]:1"
    assert peer_url("https://a:1/", 9847, "http") == "https://a:1"


@pytest.mark.slow
def test_every_agent_is_asked_at_once_under_one_deadline(servers):
    fast = [servers(status_doc(w, ["ok"] * 4)) for w in range(3)]
    slow = servers(status_doc(3, ["ok"] * 4), hang=5.0)
    refused = f"127.0.0.1:{free_port()}"
    peers = [s.address for s in fast] + [slow.address, refused]
    began = time.monotonic()
    answers = ask_all(peers, 9847, ClientOptions(), deadline=1.0)
    took = time.monotonic() - began
    assert took < 3.0, f"asked one after another? {took:.1f} s"
    assert [a.document is not None for a in answers] == [True, True, True, False, False]
    assert [a.state for a in answers] == ["up", "up", "up", "late", "down"]
    assert answers[3].error == "no answer within 1 s", answers[3]
    assert "refused" in answers[4].error.lower()
    assert len(build_view(answers).chips) == 12


def test_peers_from_the_tpu_vm_metadata():
    metadata = MetadataServer({"worker-network-endpoints":
                               "0:sim:127.0.0.1,1:sim:127.0.0.2,2:sim:127.0.0.3"})
    try:
        assert peers_from_metadata(2.0, {"GCE_METADATA_HOST": metadata.address}) == \
            ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    finally:
        metadata.close()
    with pytest.raises(SliceError, match="no worker-network-endpoints"):
        peers_from_metadata(0.5, {"GCE_METADATA_HOST": f"127.0.0.1:{free_port()}"})


def test_peers_from_a_headless_service_name():
    assert "127.0.0.1" in peers_from_service("localhost")
    with pytest.raises(SliceError, match="--service no-such-service.invalid: cannot resolve"):
        peers_from_service("no-such-service.invalid")


def run_status(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, "status", "--slice", *args], capture_output=True,
                          text=True, env={**clean_env(), "COLUMNS": "120", **(env or {})},
                          timeout=60)


@pytest.mark.e2e
def test_status_slice_from_metadata_on_a_slice_of_loopback_addresses(servers):
    """Each worker on its own loopback address and the same agent port, as on a pod; one
    worker's agent is down."""
    port = free_port()
    for w in range(3):
        servers(status_doc(w, ["leak", "ok"], ooms=[1000 + 7200 * (w + 1), None]),
                host=f"127.0.0.{w + 1}", port=port)
    metadata = MetadataServer({"worker-network-endpoints": ",".join(
        f"{w}:x:127.0.0.{w + 1}" for w in range(4))})
    try:
        result = run_status("--agent-port", str(port), "--deadline", "2",
                            env={"GCE_METADATA_HOST": metadata.address})
    finally:
        metadata.close()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].strip() == ("v4-32 slice my-tpu: 3 of 4 workers answered, 6 chips; "
                                "3 leaking, 3 ok, first OOM w-0 chip 0 in 2.0 h; 1 down "
                                "(127.0.0.4)")
    assert sum(" leak " in line for line in lines) == 3
    assert any("127.0.0.4" in line and " down " in line for line in lines)
    assert f"http://127.0.0.4:{port}: down: [Errno 111] Connection refused" in result.stdout


@pytest.mark.e2e
def test_status_slice_json_and_bad_input(servers):
    a, b = servers(status_doc(0, ["ok"])), servers(status_doc(1, ["ok"]))
    result = run_status("--peers", f"{a.address},{b.address}", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [(c["worker"], c["chip"]) for c in doc["chips"]] == [("0", "0"), ("1", "0")]
    for args, message in ((["--peers", ","], "--peers: no peer"),
                          (["--peers", "a", "--agent-ca-file", "/nonexistent"],
                           "cannot load the client's TLS"),
                          (["--service", "no-such-service.invalid"], "cannot resolve")):
        result = run_status(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert message in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.e2e
def test_agents_behind_tls_and_basic_auth(stack, pki, tmp_path):  # noqa: F811
    (tmp_path / "password").write_text(PASSWORD + "\n")
    auth = stack.auth.removeprefix("https://")
    mtls = stack.mtls.removeprefix("https://")
    result = run_status("--peers", auth, "--agent-ca-file", str(pki.ca_crt), "--agent-user",
                        USER, "--agent-password-file", str(tmp_path / "password"),
                        "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["workers"][0]["up"] and len(doc["chips"]) == 4, doc
    result = run_status("--peers", mtls, "--agent-ca-file", str(pki.ca_crt),
                        "--agent-cert-file",
                        str(pki.client_crt), "--agent-key-file", str(pki.client_key),
                        "--format", "json")
    assert json.loads(result.stdout)["workers"][0]["up"], result.stdout
    (tmp_path / "password").write_text("wrong\n")
    result = run_status("--peers", f"{auth},{mtls}", "--agent-ca-file", str(pki.ca_crt),
                        "--agent-user", USER, "--agent-password-file",
                        str(tmp_path / "password"), "--format", "json")
    workers = json.loads(result.stdout)["workers"]
    assert "HTTP 401" in workers[0]["error"], workers
    assert not workers[1]["up"], workers  # no client certificate


@pytest.mark.e2e
def test_watch_slice_in_a_real_terminal(servers, tmp_path):
    import sys

    from test_watch import COLUMNS, Tmux

    a, b = (servers(status_doc(w, ["leak", "ok"], ooms=[1000 + 3600 * (w + 1), None]))
            for w in range(2))
    dead = f"127.0.0.1:{free_port()}"
    term = Tmux(tmp_path, f"{sys.executable} -m tpumon watch --slice --peers "
                          f"{a.address},{b.address},{dead} --deadline 1 --interval 0.3")
    try:
        summary = ("v4-32 slice my-tpu: 2 of 3 workers answered, 4 chips; 2 leaking, 2 ok, first "
                   "OOM w-0 chip 0 in 1.0 h; 1 down")
        # the summary wraps at 80 columns, between words
        screen = wait_for(lambda: (s := term.screen()) and summary in " ".join(s.split())
                          and s, 30)
        lines = screen.splitlines()
        assert all(len(line) <= COLUMNS for line in lines)
        assert sum(" leak " in line for line in lines) == 2, screen
        assert any(dead in line and " down " in line for line in lines), screen
        assert "…" not in screen, screen  # nothing cut short at 80 columns
        term.run("send-keys", "-t", "w", "C-c")
        wait_for(term.exit_file.exists, 20)
        assert term.exit_file.read_text().strip() == "0"
        assert "Traceback" not in term.screen()
    finally:
        term.close()


@pytest.mark.e2e
def test_watch_slice_piped_prints_plain_frames(servers):
    """`tpumon watch --slice | cat` printed nothing at all (a screen-mode Live without a
    terminal), where `tpumon watch` piped prints a plain-text view every interval."""
    a, b = (servers(status_doc(w, ["leak", "ok"], ooms=[1000 + 3600 * (w + 1), None]))
            for w in range(2))
    with subprocess.Popen([*TPUMON, "watch", "--slice", "--peers", f"{a.address},{b.address}",
                           "--interval", "0.2"], stdout=subprocess.PIPE, text=True,
                          env=clean_env()) as proc:
        stop = threading.Timer(20, proc.kill)  # no frame in 20 s: its output ends
        stop.start()
        try:
            lines: list[str] = []
            while sum(line.startswith("tpumon watch --slice") for line in lines) < 2:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line, f"the output ended: {lines}"
                lines.append(line.rstrip("\n"))
        finally:
            stop.cancel()
            proc.kill()
    assert "\x1b" not in "".join(lines)  # no escape sequences in a pipe
    assert lines[1] == ("v4-32 slice my-tpu: 2 of 2 workers answered, 4 chips; 2 leaking, 2 ok, "
                        "first OOM w-0 chip 0 in 1.0 h"), lines
    assert sum(" leak " in line for line in lines) == 2, lines
