"""The ``tpumon`` command as a user runs it: real processes, real signals, real scrapes."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from fake_runtime import chips_metrics
from tools import clean_env, free_port, require_tool, wait_for

TPUMON = [sys.executable, "-m", "tpumon"]


def run(*args, env=None, timeout=60):
    full_env = clean_env()
    full_env.update(env or {})
    return subprocess.run(TPUMON + list(args), capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.slow
def test_version_and_help():
    result = run("version")
    assert result.returncode == 0
    assert re.match(r"tpumon \d+\.\d+\.\d+ \(tpu-info \d", result.stdout)
    help_text = run("--help").stdout
    for command in ("agent", "status", "sim", "version", "config"):
        assert re.search(rf"^\s+{command}\b", help_text, re.M), command
    agent_help = run("agent", "--help").stdout
    for flag in ("--listen-address", "--simulate", "--config", "--runtime-ports",
                 "--poll-interval"):
        assert flag in agent_help


@pytest.mark.slow
def test_small_things_a_newcomer_meets():
    """Issue 43: a mistyped command got no suggestion; `sim --list` pushed
    irregular-staircase's description a column right; `analyze bad.png` named only CSV and
    JSON Lines, though Parquet is read too."""
    typo = run("stauts")
    assert typo.returncode == 2 and "No such command 'stauts'. Did you mean 'status'?" in \
        typo.stderr, typo.stderr
    listed = run("sim", "--list").stdout.splitlines()
    starts = {len(line) - len(line.split(maxsplit=1)[1]) for line in listed}
    assert len(listed) > 10 and len(starts) == 1, listed  # one column for every description
    assert any(line.startswith("irregular-staircase ") for line in listed)


def test_a_binary_file_names_every_trace_format(tmp_path):
    png = tmp_path / "bad.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 20)
    assert_one_line_error(run("analyze", str(png)), "bad.png", "not UTF-8 text",
                          "CSV, JSON Lines, or Parquet")


@pytest.mark.parametrize("content, fragments", [
    ("[agent]\npoll_intervall = 3\n", ["unknown key 'agent.poll_intervall'", "did you mean"]),
    ("[agent]\npoll_interval = 'x'\n", ["agent.poll_interval must be a number"]),
    ("[exporter\n", ["invalid TOML"]),
])
@pytest.mark.slow
def test_agent_bad_config_file(tmp_path, content, fragments):
    path = tmp_path / "c.toml"
    path.write_text(content)
    assert_one_line_error(run("agent", "--config", str(path)), str(path), *fragments)


def test_agent_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    assert_one_line_error(run("agent", "--config", str(missing)), str(missing), "cannot read it")


@pytest.mark.e2e
def test_agent_bad_environment_and_flags():
    assert_one_line_error(run("agent", env={"TPUMON_AGENT_POLL_INTERVAL": "often"}),
                          "TPUMON_AGENT_POLL_INTERVAL")
    assert_one_line_error(run("agent", "--poll-interval", "0"), "agent.poll_interval")
    assert_one_line_error(run("agent", "--simulate", "--scenario", "meltdown"),
                          "simulator.scenario must be one of")
    assert_one_line_error(run("agent", "--runtime-ports", "84x1"), "--runtime-ports")


def test_agent_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("agent", "--simulate", "--listen-address", f"127.0.0.1:{port}")
    assert_one_line_error(result, f"127.0.0.1:{port}", "address already in use",
                          "exporter.listen_address")


@pytest.mark.slow
def test_config_check_and_show(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[agent]\npoll_interval = 2\n")
    result = run("config", "check", str(good))
    assert result.returncode == 0 and "ok" in result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nnope = 1\n")
    assert_one_line_error(run("config", "check", str(bad)), "unknown key 'agent.nope'")
    shown = run("config", "show", "--config", str(good))
    assert "poll_interval = 2.0" in shown.stdout and f"config file {good}" in shown.stdout


@pytest.mark.e2e
def test_status_against_a_runtime(runtime_servers):
    server = runtime_servers(chips_metrics({0: 3 * 2**30, 1: 4 * 2**30}, duty=75.0))
    result = run("status", "--direct", "--runtime-ports", str(server.port), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    chips = {c["chip"]: c for c in doc["chips"]}
    assert chips["0"]["hbm_used_bytes"] == 3 * 2**30 and chips["1"]["duty_cycle"] == 0.75
    assert doc["sources"]["tpu_runtime"]["up"] is True
    assert doc["source"] == "runtime" and chips["0"]["verdict"] == "insufficient_data"
    table = run("status", "--direct", "--runtime-ports", str(server.port))
    assert table.returncode == 0 and "4.00 GiB" in table.stdout and "75.0 %" in table.stdout
    # one reading has no verdict to explain chip by chip ("chip 0: insufficient_data: no
    # samples yet"): one line says why
    assert "no samples yet" not in table.stdout
    assert table.stdout.count("verdicts need the agent's history") == 1


@pytest.mark.e2e
def test_status_reads_the_runtime_and_says_so_when_the_local_agent_is_protected(
        runtime_servers, tmp_path):
    # An agent behind TLS or passwords answers nothing these commands can read: they say
    # so on stderr and show the runtime, instead of passing it off as the agent's view.
    server = runtime_servers(chips_metrics({0: 3 * 2**30}, duty=75.0))
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: $2b$10$abcdefghijklmnopqrstuv\n")
    result = run("status", "--runtime-ports", str(server.port), "--format", "json",
                 env={"TPUMON_EXPORTER_WEB_CONFIG_FILE": str(web)})
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == (
        f"tpumon: the local agent is protected by {web} (exporter.web_config_file); give "
        "--agent https://... with --agent-ca-file and --agent-user/--agent-password-file or "
        "--agent-cert-file to ask it. Reading the runtime directly, without the agent's "
        "history")
    doc = json.loads(result.stdout)
    assert doc["source"] == "runtime" and doc["chips"][0]["hbm_used_bytes"] == 3 * 2**30
    # --direct asks for exactly that: nothing to say.
    direct = run("status", "--direct", "--runtime-ports", str(server.port), "--format", "json",
                 env={"TPUMON_EXPORTER_WEB_CONFIG_FILE": str(web)})
    assert direct.returncode == 0 and direct.stderr == ""


@pytest.mark.e2e
def test_status_without_a_runtime_reports_it():
    port = free_port()
    # no local agent (nothing at exporter.listen_address): the runtime is read instead
    result = run("status", "--runtime-ports", str(port), "--format", "json",
                 env={"TPUMON_EXPORTER_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}"})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["sources"]["tpu_runtime"] == {
        "up": False, "error": f"no runtime answering on localhost:{port}"}
    table = run("status", "--direct", "--runtime-ports", str(port))
    assert "no runtime answering" in table.stdout


def scrape(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


@pytest.mark.e2e
def test_agent_simulate_end_to_end(tmp_path):
    """The whole agent on the built-in simulator: metrics, promtool, owner RSS, SIGTERM."""
    log_path = tmp_path / "agent.log"
    env = clean_env()
    with open(log_path, "w") as log:
        agent = subprocess.Popen(TPUMON + ["agent", "--simulate", "--listen-address", "127.0.0.1:0",
                                           "--poll-interval", "0.5", "--acceleration", "120"],
                                 stderr=log, env=env)
    try:
        match = wait_for(lambda: re.search(r"serving metrics on (http://\S+/metrics)",
                                           log_path.read_text()), timeout=30)
        url = match.group(1)
        text = wait_for(lambda: next((t for t in [scrape(url)] if "tpumon_hbm_used_bytes{" in t),
                                     None), timeout=30)
        used = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^tpumon_hbm_used_bytes\{[^}]*chip="(\d+)"[^}]*\} (\S+)$', text, re.M)}
        assert sorted(used) == ["0", "1", "2", "3"]
        assert all(0 < v < 34088157184 for v in used.values())
        sim_pid = int(re.search(r'tpumon_chip_owner_info\{[^}]*pid="(\d+)"', text).group(1))
        assert sim_pid != agent.pid and os.path.exists(f"/proc/{sim_pid}")
        rss = re.search(rf'tpumon_training_process_resident_memory_bytes\{{[^}}]*pid="{sim_pid}"'
                        r'[^}]*\} (\S+)', text)
        assert rss and float(rss.group(1)) > 10 * 2**20
        assert re.search(r'tpumon_source_up\{[^}]*source="tpu_runtime"[^}]*\} 1\.0', text)
        verdicts = re.findall(
            r'tpumon_leak_verdict\{[^}]*chip="0"[^}]*verdict="(\w+)"[^}]*\} (\S+)', text)
        assert len(verdicts) == 6 and [v for v, value in verdicts if value == "1.0"] in (
            ["insufficient_data"], ["warming_up"])
        status = run("status", "--agent", url.rsplit("/metrics", 1)[0], "--format", "json")
        doc = json.loads(status.stdout)
        assert doc["source"] == "agent" and len(doc["chips"]) == 4
        assert doc["chips"][0]["verdict"] in ("warming_up", "insufficient_data", "ok", "growing",
                                              "leak")
        lint = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text,
                              text=True, capture_output=True, timeout=30)
        assert lint.returncode == 0 and not (lint.stdout + lint.stderr), lint.stdout + lint.stderr
        started = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
        wait_for(lambda: not os.path.exists(f"/proc/{sim_pid}") or
                 open(f"/proc/{sim_pid}/stat").read().split()[2] == "Z", timeout=5)
        log_text = log_path.read_text()
        assert "Traceback" not in log_text and "stopping" in log_text
    finally:
        if agent.poll() is None:
            agent.kill()


def test_sim_writes_a_slice_trace_as_it_serves_the_slice(tmp_path):
    """--write-trace ignored --hosts: one host was written. Each host is now named,
    scenario'd and seeded as `sim --hosts` serves it (worker-leak: only the last leaks)."""
    from tpumon.sim.tracegen import generate_trace
    from tpumon.trace.read import read_trace

    out = tmp_path / "slice.csv"
    result = run("sim", "--scenario", "worker-leak", "--hosts", "3", "--slice", "s1",
                 "--write-trace", str(out), "--duration", "20m", "--poll-interval", "10",
                 "--seed", "4")
    assert result.returncode == 0, result.stderr
    rows = list(read_trace(out))
    assert [r.time for r in rows] == sorted(r.time for r in rows)
    for k, scenario in enumerate(["healthy", "healthy", "linear-leak"]):
        host = f"t1v-n-s1-w-{k}"
        expected = generate_trace(scenario, duration_s=1200, poll_interval_s=10, seed=4 + k,
                                  host=host, poll_jitter_s=0.05)
        assert [(r.chip, r.step, r.hbm_used_bytes) for r in rows if r.host == host] == \
            [(r.chip, r.step, r.hbm_used_bytes) for r in expected], host
    assert len(rows) == 3 * 120 * 4
    # the log names the scenario asked for (it said "healthy/linear-leak"), and analyze
    # lists the hosts as the slice counts them (the merged trace gave w-0, w-2, w-1)
    assert "of scenario worker-leak (its hosts play healthy/linear-leak)" in result.stderr
    table = run("analyze", str(out), "--format", "json")
    assert table.returncode == 0, table.stderr
    listed = [(s["host"], s["chip"]) for s in json.loads(table.stdout)["series"]]
    assert listed == [(f"t1v-n-s1-w-{k}", str(c)) for k in range(3) for c in range(4)]


def test_hosts_sort_as_a_slice_counts_its_workers():
    from tpumon.common.samples import host_sort_key

    names = ["t1v-n-x-w-10", "t1v-n-x-w-2", "t1v-n-x-w-0", "other", "t1v-n-x-w-1"]
    assert sorted(names, key=host_sort_key) == [
        "other", "t1v-n-x-w-0", "t1v-n-x-w-1", "t1v-n-x-w-2", "t1v-n-x-w-10"]
    assert sorted(["w-1²", "w-1"], key=host_sort_key) == ["w-1", "w-1²"]  # int("²") raised


@pytest.mark.e2e
def test_sim_writes_a_trace_that_reads_back(tmp_path):
    from tpumon.trace.read import read_trace

    out = tmp_path / "leak.csv"
    result = run("sim", "--scenario", "chip0-leak", "--write-trace", str(out), "--duration", "1h",
                 "--poll-interval", "10", "--seed", "4")
    assert result.returncode == 0, result.stderr
    rows = list(read_trace(out))
    assert len(rows) == 360 * 4
    assert {r.chip for r in rows} == {"0", "1", "2", "3"}
    assert rows[-1].step > rows[0].step
    parquet = tmp_path / "leak.parquet"  # written as Parquet, by its name as read
    result = run("sim", "--scenario", "chip0-leak", "--write-trace", str(parquet),
                 "--duration", "1h", "--poll-interval", "10", "--seed", "4")
    assert result.returncode == 0, result.stderr
    assert parquet.read_bytes()[:4] == b"PAR1"
    assert [(r.host, r.chip, r.step, r.hbm_used_bytes, round(r.time, 3))
            for r in read_trace(parquet)] == [
        (r.host, r.chip, r.step, r.hbm_used_bytes, r.time) for r in rows]
    assert_one_line_error(run("sim", "--write-trace", str(tmp_path / "no/such/dir.csv"),
                              "--duration", "1m"), "--write-trace", "No such file")
    assert_one_line_error(run("sim", "--write-trace", str(out), "--duration", "soon"), "--duration")
    assert_one_line_error(run("sim", "--write-trace", str(tmp_path / "leak.txt"), "--duration",
                              "1m"), "leak.txt", "cannot write .txt")  # as export refuses it
    assert not (tmp_path / "leak.txt").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--poll-interval", "-5"], "--poll-interval"),
    (["--poll-interval", "0"], "--poll-interval"),
    (["--poll-interval", "nan"], "--poll-interval"),
    (["--port", "99999"], "--port"),
    (["--port", "65536"], "--port"),
    (["--port", "0-3"], "--port"),
    (["--port", ":9847"], "--port"),
    (["--duration", "-1h"], "--duration"),
    (["--duration", "0"], "--duration"),  # wrote a header alone over the older trace
    (["--duration", "1s", "--poll-interval", "5"], "--duration"),  # no poll in it either
])
@pytest.mark.slow
def test_sim_refuses_bad_input_and_keeps_the_output_file(tmp_path, args, fragment):
    out = tmp_path / "kept.csv"
    out.write_text("an older trace\n")
    result = run("sim", "--write-trace", str(out), "--duration", "1m", *args)
    assert_one_line_error(result, fragment)
    assert "--runtime-ports" not in result.stderr
    assert out.read_text() == "an older trace\n"


def test_sim_port_out_of_range_is_not_served(tmp_path):
    """--port 99999 once served on 99999 mod 65536; it must be refused, not bound."""
    result = run("sim", "--port", "99999", timeout=20)
    assert_one_line_error(result, "--port", "99999")


def test_sim_trace_with_a_short_poll_interval(tmp_path):
    out = tmp_path / "t.csv"
    result = run("sim", "--write-trace", str(out), "--duration", "2s", "--poll-interval", "0.05")
    assert result.returncode == 0, result.stderr
    assert len(out.read_text().splitlines()) > 1 + 30 * 4
    assert not list(tmp_path.glob("*.partial"))
