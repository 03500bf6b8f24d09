"""SIGHUP: the agent reads its configuration again and applies what it can, keeping every
trend; a bad file is one error line and changes nothing."""

from __future__ import annotations

import signal

import pytest
from tools import AgentProcess, wait_for

pytestmark = pytest.mark.e2e  # starts agents or external servers: seconds each

CONFIG = """
[alerts]
oom_horizon_hours = {horizon}

[agent]
log_level = "{level}"

[runtime]
timeout = {timeout}
"""


def write(path, horizon=6.0, level="info", timeout=1.0):
    path.write_text(CONFIG.format(horizon=horizon, level=level, timeout=timeout))


def test_sighup_applies_the_new_configuration_and_keeps_state(tmp_path):
    config = tmp_path / "config.toml"
    write(config)
    agent = AgentProcess(tmp_path, tmp_path / "state", "--config", str(config))
    try:
        wait_for(lambda: (agent.value("tpumon_store_polls_written_total") or 0) >= 20, 60)
        assert agent.value("tpumon_alert_oom_horizon_seconds") == 6 * 3600
        before = agent.value("tpumon_poll_duration_seconds_count")

        write(config, horizon=12.0, level="debug", timeout=2.0)
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: agent.value("tpumon_alert_oom_horizon_seconds") == 12 * 3600, 30)
        log = agent.log()
        assert "reload: applied agent.log_level, alerts.oom_horizon_hours" in log
        assert "reload: runtime.timeout changed; takes effect at the next restart" in log
        assert agent.value("tpumon_poll_duration_seconds_count") > before  # same agent, going on

        config.write_text("[alerts]\noom_horizon_hours = -1\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "keeping the running configuration" in agent.log(), 30)
        assert "alerts.oom_horizon_hours must be between 0.01 and 8784 hours" in agent.log()
        assert agent.value("tpumon_alert_oom_horizon_seconds") == 12 * 3600
        polls = agent.value("tpumon_poll_duration_seconds_count")
        wait_for(lambda: agent.value("tpumon_poll_duration_seconds_count") > polls, 30)
    finally:
        assert agent.stop() == 0
    assert "Traceback" not in agent.log()
