"""Configuration: precedence, validation, and one clear line per mistake."""

import os
import tomllib

import pytest

from tpumon.common.config import KEYS, SCHEMA, ConfigError, load_config, parse_ports, render_toml


def write(tmp_path, text):
    path = tmp_path / "tpumon.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file(monkeypatch, tmp_path):
    monkeypatch.setattr("tpumon.common.config.DEFAULT_CONFIG_PATH", tmp_path / "none.toml")
    config = load_config(None, env={})
    assert config.path is None
    assert config["agent.poll_interval"] == 5.0
    assert config["exporter.listen_address"] == ":9847"
    assert set(config.origins.values()) == {"default"}


def test_default_file_is_read_when_present(monkeypatch, tmp_path):
    path = write(tmp_path, "[agent]\npoll_interval = 9\n")
    monkeypatch.setattr("tpumon.common.config.DEFAULT_CONFIG_PATH", path)
    assert load_config(None, env={})["agent.poll_interval"] == 9.0


def test_precedence_defaults_file_env_flags(tmp_path):
    path = write(tmp_path, "[agent]\npoll_interval = 2\nhistory_points = 100\n"
                           "[exporter]\nlisten_address = '127.0.0.1:1'\n")
    env = {"TPUMON_AGENT_POLL_INTERVAL": "3.5", "TPUMON_AGENT_LOG_LEVEL": "debug"}
    config = load_config(path, {"agent.poll_interval": 7.0, "agent.log_level": None}, env=env)
    assert config["agent.poll_interval"] == 7.0            # flag beats env and file
    assert config["agent.log_level"] == "debug"            # env beats default (flag not given)
    assert config["agent.history_points"] == 100           # file beats default
    assert config["exporter.listen_address"] == "127.0.0.1:1"
    assert config["runtime.timeout"] == 1.0                 # default
    assert config.origins["agent.poll_interval"] == "command line"
    assert config.origins["agent.log_level"] == "environment TPUMON_AGENT_LOG_LEVEL"
    assert config.origins["agent.history_points"] == f"config file {path}"


def test_config_path_from_environment(tmp_path):
    path = write(tmp_path, "[runtime]\nports = [8431, 8432]\n")
    assert load_config(None, env={"TPUMON_CONFIG": str(path)})["runtime.ports"] == [8431, 8432]


@pytest.mark.parametrize("text, message", [
    ("[agent]\npoll_intervall = 1\n",
     "unknown key 'agent.poll_intervall' (did you mean 'agent.poll_interval'?)"),
    ("[agnet]\npoll_interval = 1\n", "unknown key 'agnet' (did you mean 'agent'?)"),
    ("[agent]\npoll_interval = 'fast'\n", "agent.poll_interval must be a number, got 'fast'"),
    ("[agent]\npoll_interval = -1\n", "agent.poll_interval must be between 0.01 and 3600 s"),
    ("[agent]\npoll_interval = 1e10\n", "agent.poll_interval must be between 0.01 and 3600 s"),
    ("[agent]\nhistory_points = 1.5\n", "agent.history_points must be an integer"),
    ("[agent]\nlog_level = 'loud'\n", "agent.log_level must be one of debug, info, warning, error"),
    ("[runtime]\nports = [8431, 70000]\n", "runtime.ports has port(s) outside 1-65535: 70000"),
    ("[runtime]\nports = '8431'\n", "runtime.ports must be a list of integers"),
    ("[exporter]\nlisten_address = 'nowhere'\n", "exporter.listen_address is not HOST:PORT"),
    ("[simulator]\nscenario = 'Melt down!'\n", "simulator.scenario must be a scenario's name"),
    ("agent = 3\n", "'agent' must be a table"),
    ("[agent\n", "invalid TOML"),
])
def test_bad_file_names_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_unreadable_or_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*absent.toml: cannot read it"):
        load_config(tmp_path / "absent.toml", env={})
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path, env={})  # a directory
    if os.geteuid() != 0:  # root reads anything
        path = write(tmp_path, "")
        path.chmod(0)
        with pytest.raises(ConfigError, match="Permission denied"):
            load_config(path, env={})


def test_bad_environment_values():
    with pytest.raises(ConfigError,
                       match="environment TPUMON_AGENT_POLL_INTERVAL: cannot read 'soon'"):
        load_config(None, env={"TPUMON_AGENT_POLL_INTERVAL": "soon"})
    with pytest.raises(ConfigError, match="unknown key 'TPUMON_AGENT_POLL'"):
        load_config(None, env={"TPUMON_AGENT_POLL": "1"})
    config = load_config(None, env={"TPUMON_RUNTIME_PORTS": "8431-8434"})
    assert config["runtime.ports"] == [8431, 8432, 8433, 8434]


def test_flag_values_are_validated_too():
    with pytest.raises(ConfigError, match="command line: agent.poll_interval "
                                          "must be between 0.01"):
        load_config(None, {"agent.poll_interval": 0.0}, env={})


def test_parse_ports_forms():
    assert parse_ports("8431") == [8431]
    assert parse_ports("8431, 8433") == [8431, 8433]
    assert parse_ports("8431-8433,9000") == [8431, 8432, 8433, 9000]
    with pytest.raises(ValueError):
        parse_ports("eighty")


def test_rendered_config_reads_back_identically(tmp_path):
    original = load_config(
        write(tmp_path, "[agent]\npoll_interval = 2.5\n[runtime]\nports = [1, 2]\n"), env={})
    rendered = render_toml(original)
    again = load_config(write(tmp_path, rendered), env={})
    assert again.values == original.values
    # every key is documented with its default and env var
    data = tomllib.loads(rendered)
    assert sum(len(table) for table in data.values()) == len(SCHEMA)
    for key in KEYS.values():
        assert key.env_var in rendered


def test_reporter_variables_in_the_environment_are_not_config_keys(tmp_path):
    """TPUMON_TRACK_SITES is for training processes; exported in the same shell it must not
    stop `tpumon` commands (it once made every command fail with "unknown key")."""
    import subprocess
    import sys

    from tools import clean_env

    config = load_config(env={"TPUMON_TRACK_SITES": "1", "TPUMON_REPORTER_SOCKET": "/x.sock"})
    assert config["reporter.socket"] == "/x.sock"
    with pytest.raises(ConfigError, match="unknown key 'TPUMON_TRACK_SITE'"):
        load_config(env={"TPUMON_TRACK_SITE": "1"})  # a near miss is still an error
    env = dict(clean_env(), TPUMON_TRACK_SITES="1")
    done = subprocess.run([sys.executable, "-m", "tpumon", "config", "show"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "poll_interval" in done.stdout, done.stderr


@pytest.mark.parametrize("url", ["https://grafana.example/d/tpumon\n[agent]\npoll_interval = 9",
                                 "https://grafana.example/d/\x01tpumon\x7f\t\"\\"])
def test_rendered_config_reads_back_any_string(tmp_path, url):
    """A string with a line break or a control character (from the environment) is still
    TOML that loads back as it was; the hand-written writer made invalid TOML of both."""
    original = load_config(write(tmp_path, ""), env={"TPUMON_ALERTS_DASHBOARD_URL": url})
    rendered = render_toml(original)
    again = load_config(write(tmp_path, rendered), env={})
    assert again["alerts.dashboard_url"] == url
    assert again.values == original.values


def test_a_scenario_the_simulator_lacks_is_named_where_it_came_from(tmp_path):
    """Which scenarios exist is the simulator's to say (the configuration imports no
    simulator): ``tpumon config check`` and every simulation ask it, one line naming the
    file and the key."""
    from tpumon.sim.pod import check_scenario

    path = write(tmp_path, "[simulator]\nscenario = 'meltdown'\n")
    config = load_config(path, env={})
    with pytest.raises(ConfigError) as err:
        check_scenario(config)
    assert str(err.value).startswith(f"config file {path}: simulator.scenario must be one "
                                     "of healthy, linear-leak")
    assert str(err.value).endswith("(got 'meltdown')")
    check_scenario(load_config(write(tmp_path, "[simulator]\nscenario = 'slice-leak'\n"),
                               env={}))
