"""Components with a lifecycle: started in the order built, stopped in reverse, and a
reload offered to each in turn; then a real agent's assembly (no TPU: its runtime source
is never polled here) reloaded key by key, as SIGHUP does (test_reload.py runs the agent)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from tpumon.agent.bootstrap import build
from tpumon.common.config import load_config
from tpumon.agent.lifecycle import Component, Lifecycle, take
from tpumon.agent.reload import reload_config


class Recorder(Component):
    def __init__(self, name: str, calls: list[str], keys: tuple[str, ...] = (),
                 fail_stop: bool = False) -> None:
        self.name, self._calls, self._keys, self._fail_stop = name, calls, keys, fail_stop

    def start(self) -> None:
        self._calls.append(f"start {self.name}")

    def stop(self) -> None:
        self._calls.append(f"stop {self.name}")
        if self._fail_stop:
            raise RuntimeError("stuck")

    def reload(self, config, changed):
        self._calls.append(f"reload {self.name} {sorted(changed)}")
        return changed - take(changed, self._keys)


def test_started_in_order_stopped_in_reverse_even_past_a_failure(caplog):
    calls: list[str] = []
    parts = Lifecycle()
    for name in ("source", "store", "notifier"):
        parts.add(Recorder(name, calls, fail_stop=name == "store"))
    parts.start()
    with caplog.at_level(logging.ERROR, logger="tpumon.lifecycle"):
        parts.stop()
    assert calls == ["start source", "start store", "start notifier",
                     "stop notifier", "stop store", "stop source"]
    assert [r.getMessage() for r in caplog.records] == ["stopping store failed"]


def test_a_reload_offers_each_component_what_the_others_left():
    calls: list[str] = []
    parts = Lifecycle()
    parts.add(Recorder("a", calls, keys=("x.one",)))
    parts.add(Recorder("b", calls, keys=("x.two", "x.one")))
    cold = parts.reload(load_config(env={}), frozenset({"x.one", "x.two", "y.three"}))
    assert cold == {"y.three"}
    assert calls == ["reload a ['x.one', 'x.two', 'y.three']", "reload b ['x.two', 'y.three']"]


def test_take_picks_keys_and_sections():
    changed = frozenset({"alerts.a", "alerts.b", "agent.log_level", "slack.url"})
    assert take(changed, ["agent.log_level"], ["alerts"]) == {
        "alerts.a", "alerts.b", "agent.log_level"}
    assert take(changed) == frozenset()


CONFIG = """
[agent]
poll_interval = {interval}
log_level = "{level}"

[alerts]
oom_horizon_hours = {horizon}

[runtime]
ports = [{port}]

[reporter]
socket = "{socket}"
allowed_uids = [{uids}]

[identity]
metadata = "off"

[store]
state_dir = "{state}"

[slack]
{slack}
"""


@pytest.fixture
def assembly(tmp_path):
    """A real agent's parts, built from a configuration file as ``tpumon agent`` builds
    them (reporter socket and history store included), and the file to change."""
    path = tmp_path / "config.toml"
    values = dict(interval=5, level="info", horizon=6, port=1, uids="",
                  socket=tmp_path / "reporter.sock", state=tmp_path / "state", slack="")

    def write(**changes):
        values.update(changes)
        path.write_text(CONFIG.format(**values))

    def load():
        return load_config(path, env={})

    root_level = logging.getLogger().level
    write()
    built = build(load(), env={})
    built.write, built.load, built.missing = write, load, tmp_path / "missing"
    yield built
    built.close()
    logging.getLogger().setLevel(root_level)


def test_an_agent_is_built_sources_first_and_stops_readers_first(assembly):
    """Built in the order data flows, so stopped the other way: the store writes what is
    queued while the runtime source and the reporters' socket are still there."""
    assert assembly.components.names() == [
        "reporter socket", "runtime source", "history store", "alert thresholds",
        "poll loop", "log level"]


def exported_horizon(assembly) -> float:
    text = generate_latest(assembly.registry).decode()
    line = next(x for x in text.splitlines()
                if x.startswith("tpumon_alert_oom_horizon_seconds{"))
    return float(line.rsplit(" ", 1)[1])


def test_each_hot_key_is_applied_by_its_component_and_the_rest_wait(assembly, caplog):
    """What the if-chain in reload.py did, now each component's own: the poll interval,
    the log level, the alert thresholds (exported, and in the tracker that pages), the
    reporters' allowed uids; a runtime port and a channel without a notifier wait."""
    running = assembly.load()
    assembly.write(interval=2, level="debug", horizon=12, port=2, uids="1000, 1001")
    with caplog.at_level(logging.INFO, logger="tpumon.reload"):
        new = reload_config(assembly, running, assembly.load)
    assert new["agent.poll_interval"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        "reload: applied agent.log_level, agent.poll_interval, alerts.oom_horizon_hours, "
        "reporter.allowed_uids",
        "reload: runtime.ports changed; takes effect at the next restart"]
    assert assembly.agent.interval == 2
    assert logging.getLogger().level == logging.DEBUG
    assert exported_horizon(assembly) == 12 * 3600
    assert assembly.reporters is not None and assembly.reporters.allowed_uids == {1000, 1001}


def test_a_configuration_that_does_not_load_changes_nothing(assembly, caplog):
    running = assembly.load()
    assembly.write(horizon=-1, interval=2)
    with caplog.at_level(logging.INFO, logger="tpumon.reload"):
        assert reload_config(assembly, running, assembly.load) is running
        message = caplog.records[-1].getMessage()
        assert "alerts.oom_horizon_hours must be between 0.01 and 8784 hours" in message
        assert message.endswith("; keeping the running configuration"), message
        # a Slack webhook file that cannot be read: nothing applied either
        assembly.write(horizon=6, slack=f'webhook_url_file = "{assembly.missing}"')
        assert reload_config(assembly, running, assembly.load) is running
        message = caplog.records[-1].getMessage()
        assert f"{assembly.missing}: cannot read it" in message, message
        assert message.endswith("; keeping the running configuration"), message
        assert exported_horizon(assembly) == 6 * 3600 and assembly.agent.interval == 5
        assembly.write(interval=5, slack="")
        assert reload_config(assembly, running, assembly.load) == running
    assert caplog.records[-1].getMessage() == "reload: configuration unchanged"


@pytest.mark.e2e  # spawns the simulator: a few seconds
def test_a_build_that_fails_part_way_stops_what_it_had_built(tmp_path, monkeypatch):
    """The simulator child and the reporters' socket are built before the history store;
    a failure after them (here an error in the alert tracker's making, as any bug there
    would be) must not leave the child running nor the socket bound."""
    import psutil

    from tpumon.agent import bootstrap

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(bootstrap, "alert_tracker", broken)
    socket_path = tmp_path / "reporter.sock"
    config = load_config(env={"TPUMON_REPORTER_SOCKET": str(socket_path),
                              "TPUMON_STORE_STATE_DIR": ""})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="injected"):
        build(config, simulate=True, env={})
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and p.status() != psutil.STATUS_ZOMBIE]
    assert left == []
    assert not socket_path.exists()
