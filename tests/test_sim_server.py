"""The simulator's gRPC server, read by the agent's real runtime source and by tpu-info."""

import pytest
from tpu_info import metrics as tpu_info_metrics
from tpu_info.device import TpuChip

from tools import wait_for
from tpumon.sim.server import SimClock, Simulator, split_devices
from tpumon.sim.workload import V4_HBM_TOTAL_BYTES, Workload
from tpumon.sources.chips import inventory_for
from tpumon.sources.health import SourceUnavailable
from tpumon.sources.tpu_runtime import TpuRuntimeSource


class ManualClock(SimClock):
    """Simulated time that moves only when the test says so."""

    def __init__(self, start: float) -> None:
        super().__init__(1.0, start)
        self.t = start

    def now(self) -> float:
        return self.t

    observe = now


@pytest.fixture
def simulator():
    started = []

    def start(workload, clock, ports=(0,), chips=4):
        sim = Simulator(workload, clock, "127.0.0.1", list(ports), chips)
        sim.start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


def test_split_devices():
    assert split_devices(4, 1) == [[0, 1, 2, 3]]
    assert split_devices(4, 4) == [[0], [1], [2], [3]]
    assert split_devices(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_serves_the_workload_to_the_runtime_source(simulator):
    workload = Workload("healthy", seed=3, start_time=1000.0)
    clock = ManualClock(1000.0 + 3600)
    sim = simulator(workload, clock)
    reading = TpuRuntimeSource("127.0.0.1", sim.ports, 1.0, inventory_for("v4", 4)).poll()
    floors = workload.floor_bytes(clock.t)
    for chip in range(4):
        sample = reading.chips[str(chip)]
        assert sample.hbm_total_bytes == V4_HBM_TOTAL_BYTES
        assert floors[chip] <= sample.hbm_used_bytes <= V4_HBM_TOTAL_BYTES
        assert 0.0 <= sample.duty_cycle <= 1.0


def test_tpu_info_reads_the_simulator_too(simulator):
    """tpu-info's own client must accept the simulator as a runtime (it is the reference)."""
    sim = simulator(Workload("healthy", start_time=0.0), ManualClock(5000.0))
    usages = tpu_info_metrics.get_chip_usage(TpuChip.V4, f"localhost:{sim.ports[0]}")
    assert [u.device_id for u in usages] == [0, 1, 2, 3]
    assert all(u.total_memory == V4_HBM_TOTAL_BYTES and u.memory_usage > 0 for u in usages)


def test_one_chip_per_port(simulator):
    sim = simulator(Workload("healthy", start_time=0.0), ManualClock(5000.0), ports=(0, 0, 0, 0))
    source = TpuRuntimeSource("127.0.0.1", sim.ports, 1.0, inventory_for("v4", 4))
    reading = source.poll()
    assert {c: s.port for c, s in reading.chips.items()} == dict(
        zip("0123", sim.ports, strict=True))


def test_job_restart_closes_and_reopens_the_port(simulator):
    workload = Workload("job-restart", seed=0, start_time=0.0)
    first, second = workload.jobs
    clock = ManualClock(first.start_time + 3600)
    sim = simulator(workload, clock)
    source = TpuRuntimeSource("127.0.0.1", sim.ports, 0.5, inventory_for("v4", 4))
    assert len(source.poll().chips) == 4

    clock.t = (first.end_time + second.start_time) / 2  # the job crashed; nothing listens

    def down():
        try:
            source.poll()
        except SourceUnavailable as exc:
            return str(exc)
        return None

    assert "no runtime answering" in wait_for(down, timeout=5)
    clock.t = second.start_time + 600  # the next job is up
    reading = wait_for(lambda: None if down() else source.poll(), timeout=10)
    assert len(reading.chips) == 4


@pytest.mark.e2e
def test_agent_poll_loop_detects_a_leak_end_to_end(simulator):
    """Simulated runtime over gRPC -> runtime source -> agent -> detector -> /metrics."""
    from prometheus_client import generate_latest

    from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
    from tpumon.metrics.collectors import build_registry
    from tpumon.common.identity import Identity
    from tpumon.state import AgentState

    start = 1750000000.0
    workload = Workload("linear-leak", chips=2, seed=5, start_time=start,
                        leak_bytes_per_step=400_000, leak_chip_spread=0.0)
    clock = ManualClock(start)
    sim = simulator(workload, clock, chips=2)
    inventory = inventory_for("v4", 2)
    state = AgentState(Identity(host="t1v-n-9-w-0"), inventory)
    registry = build_registry(lambda: state.current)
    source = TpuRuntimeSource("127.0.0.1", sim.ports, 1.0, inventory, clock=clock.now)
    agent = Agent(AgentInputs(state, source, OwnerScanner(dict, 60), 30.0, registry))
    verdicts = set()
    while clock.t < start + 4 * 3600:  # the job OOMs at about 4.2 h
        snapshot = agent.poll_once()
        verdicts.add(snapshot.assessments["0"].verdict.value)
        clock.t += 30.0
    source.close()
    assert {"warming_up", "insufficient_data", "leak"} <= verdicts
    text = generate_latest(registry).decode()
    assert ('tpumon_leak_verdict{accelerator_type="",chip="0",host="t1v-n-9-w-0",slice="",'
            'verdict="leak",worker=""} 1.0') in text
    predicted = state.current.assessments["0"].predicted_oom_time
    assert clock.t < predicted < workload.oom_time + 3600


class FakeMonotonic:
    """time.monotonic for SimClock, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.t = 100.0
        monkeypatch.setattr("tpumon.sim.server.time.monotonic", lambda: self.t)


def test_the_simulated_world_waits_for_a_late_reader(monkeypatch):
    real = FakeMonotonic(monkeypatch)
    clock = SimClock(480.0, start=0.0, max_lag=90.0)
    real.t += 0.1
    assert clock.observe() == pytest.approx(48.0)  # on time: 480x
    real.t += 1.0  # the reader is held up for a second (480 simulated seconds)
    assert clock.now() == pytest.approx(48.0 + 90.0)  # others see the world wait
    assert clock.observe() == pytest.approx(48.0 + 90.0)  # and so does the reader
    real.t += 0.1
    assert clock.now() == pytest.approx(138.0 + 48.0)  # then time runs at 480x again
    assert clock.observe() == pytest.approx(138.0 + 48.0)


def test_without_a_bound_simulated_time_runs_on(monkeypatch):
    real = FakeMonotonic(monkeypatch)
    clock = SimClock(480.0, start=0.0, max_lag=0.0)
    real.t += 10.0
    assert clock.now() == clock.observe() == pytest.approx(4800.0)


def test_simulated_time_never_goes_back_whoever_reads_it(monkeypatch):
    import random
    real = FakeMonotonic(monkeypatch)
    clock = SimClock(480.0, start=0.0, max_lag=90.0)
    rng, last = random.Random(1), 0.0
    for _ in range(2000):
        real.t += rng.choice((0.0, 0.01, 0.1, 0.3, 2.0))
        now = clock.observe() if rng.random() < 0.3 else clock.now()
        assert now >= last
        last = now
    assert last > 90.0 * 100  # and it went forward


@pytest.mark.e2e
def test_while_the_runtime_is_down_time_runs_unobserved(simulator):
    """Between jobs no reader can look (the port is closed), so the simulator itself moves
    the bound: the next job comes up although nothing polls."""
    workload = Workload("job-restart", seed=0, start_time=0.0)
    first, second = workload.jobs
    acceleration = 2000.0
    clock = SimClock(acceleration, start=first.end_time + 1.0, max_lag=10.0)
    sim = simulator(workload, clock)
    source = TpuRuntimeSource("127.0.0.1", sim.ports, 0.5, inventory_for("v4", 4))
    assert second.start_time - first.end_time > 10.0 * 5  # far beyond the bound

    def reading():
        try:
            return source.poll()
        except SourceUnavailable:
            return None

    assert len(wait_for(reading, timeout=20).chips) == 4
    assert clock.now() >= second.start_time
    source.close()


@pytest.mark.parametrize("poll_interval, acceleration, waits", [
    (5.0, 60.0, True),  # 300 simulated s between polls: the job waits, at about 12x
    (0.25, 60.0, False),  # make demo's pace: 15 s apart
    (0.1, 480.0, False),  # the end-to-end tests': 48 s apart
])
def test_the_agent_says_when_its_polls_slow_the_simulation(caplog, poll_interval,
                                                           acceleration, waits):
    from tpumon.agent.bootstrap import check_simulation_pace
    from tpumon.common.config import load_config
    config = load_config(overrides={"agent.poll_interval": poll_interval,
                                    "simulator.acceleration": acceleration}, env={})
    with caplog.at_level("INFO", logger="tpumon.bootstrap"):
        check_simulation_pace(config)
    said = [r.getMessage() for r in caplog.records]
    assert bool(said) == waits
    if waits:
        assert said == ["polls every 5 s at 60x are 300 simulated s apart, more than "
                        "simulator.max_lag (60 s): the simulated job waits for each poll "
                        "(about 12x)"]


@pytest.mark.parametrize("overrides", [
    {"simulator.acceleration": 1200.0, "simulator.max_lag": 90.0},  # read 'ok' for 90 min
    {"simulator.acceleration": 1200.0, "simulator.max_lag": 0.0},
    {"simulator.acceleration": 100.0, "agent.poll_interval": 1.0, "simulator.max_lag": 0.0},
])
def test_a_pace_too_sparse_to_see_the_leak_is_refused(overrides):
    """At 1200x, polls every 0.25 s and the bound at 90 s, the linear leak read 'ok: no
    significant growth' after 90 simulated minutes: refused, with the reason."""
    from tpumon.agent.bootstrap import check_simulation_pace
    from tpumon.common.config import ConfigError, load_config
    config = load_config(overrides={"agent.poll_interval": 0.25, **overrides}, env={})
    with pytest.raises(ConfigError, match=r"simulated s between polls .* needs a poll at "
                                          r"least every 60 simulated s"):
        check_simulation_pace(config)
