"""``tpumon sim``: a simulated TPU VM serving libtpu's runtime metric service, or writing traces."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from tpumon.cli.options import config_option
from tpumon.common.config import ConfigError, load_config, parse_ports
from tpumon.instrument import Reporter
from tpumon.instrument.snapshot import Snapshot, make_snapshot
from tpumon.agent.logs import setup_logging
from tpumon.common.signals import signals_to_events
from tpumon.sim.process import HOST_PREFIX, READY_PREFIX

if TYPE_CHECKING:
    from tpumon.sim.server import SimClock
    from tpumon.sim.workload import Workload

log = logging.getLogger("tpumon.sim")


def parse_duration(raw: str) -> float:
    """'90', '90s', '30m', '6h', '7d' -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", raw)
    if not match:
        raise ConfigError(f"--duration: cannot read {raw!r} (e.g. 90s, 30m, 6h, 7d)")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return float(match.group(1)) * unit


def positive_seconds(option: str, value: float) -> float:
    """A number of seconds that must be more than 0 (checked before any file is opened)."""
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{option}: must be a number of seconds more than 0, not {value:g}")
    return value


def sim_ports(raw: str) -> list[int]:
    """--port LIST as the simulator serves it: ports 1-65535, or a lone 0 for a free one
    (0 inside a list or a range would bind what nobody asked for)."""
    try:
        ports = parse_ports(raw)
    except ValueError:
        ports = []
    if ports == [0]:
        return ports
    if not ports or any(not 0 < p < 65536 for p in ports):
        raise ConfigError(f"--port: cannot read {raw!r} as ports 1-65535 (e.g. 8431, "
                          "8431-8434, or 0 for a free port)")
    return ports


def hbm_total_bytes(chip_type: str) -> int:
    """What the simulated runtime reports as a chip's HBM: a real v4's figure (not 32 GiB)."""
    from tpumon.sim.workload import V4_HBM_TOTAL_BYTES
    from tpumon.sources.chips import inventory_for

    inventory = inventory_for(chip_type, 1)
    return V4_HBM_TOTAL_BYTES if chip_type == "v4" else int(inventory.hbm_bytes_per_device or 0)


@click.command("sim")
@config_option
@click.option("--scenario", default=None, help="Workload scenario [default: simulator.scenario].")
@click.option("--chips", type=int, default=None, help="Simulated chips [default: 4].")
@click.option("--chip-type", type=click.Choice(["v4", "v5e", "v5p", "v6e"]), default=None,
              help="Simulated chip type [default: v4].")
@click.option("--acceleration", type=float, default=None,
              help="Simulated seconds per real second [default: 60].")
@click.option("--seed", type=int, default=None, help="Random seed [default: 0].")
@click.option("--max-lag", type=float, default=None, metavar="SECONDS",
              help="Simulated seconds the job may run ahead of the last reader; 0 for "
                   "no bound [default: simulator.max_lag, 60].")
@click.option("--listen", "listen_host", default="127.0.0.1", show_default=True,
              help="Address to serve on (keep it on loopback).")
@click.option("--port", "ports", default="8431", show_default=True, metavar="LIST",
              help="Port(s), e.g. 8431-8434 to serve one chip per port like PyTorch/XLA "
                   "multiprocess runs; 0 picks a free port.")
@click.option("--hosts", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Simulated VMs of one slice: host k serves on the --listen address + k "
                   "(127.0.0.1, 127.0.0.2, ...), each with its own runtime and metadata server.")
@click.option("--slice", "slice_name", default="tpumon-sim", show_default=True,
              help="The simulated slice's name (NODE_ID in each host's tpu-env).")
@click.option("--list", "list_scenarios", is_flag=True, help="List the scenarios and exit.")
@click.option("--write-trace", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Write a trace file instead of serving, in the format its name ends "
              "with (.csv, .jsonl or .parquet; - for CSV on stdout).")
@click.option("--duration", default="24h", show_default=True,
              help="Simulated length of the trace with --write-trace.")
@click.option("--poll-interval", type=float, default=5.0, show_default=True,
              help="Seconds between trace rows with --write-trace.")
@click.option("--report-to", default=None, metavar="SOCKET",
              help="Also act as the training process: send its step to this reporter socket "
                   "four times a second (tpumon.instrument's protocol); with --hosts, a "
                   "pattern with {worker} (one socket per host's agent).")
@click.option("--kernel-log", default=None, metavar="FILE", hidden=True,
              help="Append the kernel's OOM-kill line here when the job is killed for host "
                   "memory (the host-oom scenario; agent --simulate reads it).")
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@click.option("--start-time", type=float, default=None, hidden=True,
              help="Unix time the simulated clock starts at [default: now].")
def command(config_path: str | None, scenario: str | None, chips: int | None,
            chip_type: str | None, acceleration: float | None, seed: int | None,
            max_lag: float | None, listen_host: str, ports: str, hosts: int, slice_name: str,
            list_scenarios: bool,
            write_trace: str | None, duration: str, poll_interval: float, report_to: str | None,
            kernel_log: str | None, exit_with_parent: bool, start_time: float | None) -> None:
    """Simulate a TPU VM's chips for a training workload, on loopback, with no TPU.

    Serves libtpu's RuntimeMetricService so that 'tpumon agent --runtime-ports PORT' (or
    tpu-info) reads it as a real runtime; or, with --write-trace, writes the same workload
    as a trace file for 'tpumon analyze' and tests. With --hosts N, simulates N VMs of one
    slice (attach an agent to each with 'tpumon agent --simulate --sim-host ADDRESS'), or
    writes one trace of all N.
    """
    from tpumon.sim.pod import SLICE_SCENARIOS, check_scenario, host_scenario
    from tpumon.sim.workload import SCENARIOS, Workload

    if list_scenarios:
        listed = [(name, spec.description) for name, spec in SCENARIOS.items()] + \
            [(name, description) for name, (description, _) in SLICE_SCENARIOS.items()]
        width = max(len(name) for name, _ in listed)  # the longest name sets the column
        for name, description in listed:
            click.echo(f"{name:{width}}  {description}")
        return
    config = load_config(config_path, {
        "simulator.scenario": scenario, "simulator.chips": chips,
        "simulator.chip_type": chip_type, "simulator.acceleration": acceleration,
        "simulator.seed": seed, "simulator.max_lag": max_lag})
    check_scenario(config)
    setup_logging(config["agent.log_level"])
    served_ports = sim_ports(ports)  # every input checked before any file or port is touched
    positive_seconds("--poll-interval", poll_interval)
    trace_seconds = parse_duration(duration)
    if write_trace is not None and not trace_seconds >= poll_interval:
        # a trace of no poll wrote a header alone over an existing one
        raise ConfigError(f"--duration: {duration} holds no poll of --poll-interval "
                          f"{poll_interval:g} s; give a longer one")
    chip_count = config["simulator.chips"]
    total = hbm_total_bytes(config["simulator.chip_type"])
    if write_trace is not None:
        scenarios = [host_scenario(config["simulator.scenario"], k, hosts)
                     for k in range(hosts)]
        _write_trace(config["simulator.scenario"], scenarios, slice_name if hosts > 1 else None,
                     write_trace, trace_seconds, poll_interval, chip_count,
                     config["simulator.seed"], total)
        return
    single = host_scenario(config["simulator.scenario"], 0, 1)
    if hosts > 1:
        if report_to and "{worker}" not in report_to:
            raise ConfigError("--report-to: with --hosts, name each worker's socket with "
                              "{worker}, e.g. /tmp/reporter-w{worker}.sock")
        _serve_slice(config, slice_name, hosts, listen_host, served_ports,
                     total, exit_with_parent, report_to)
        return
    from tpumon.sim.server import SimClock

    clock = SimClock(config["simulator.acceleration"], start=start_time,
                     max_lag=config["simulator.max_lag"])
    workload = Workload(single, chips=chip_count, hbm_total_bytes=total,
                        seed=config["simulator.seed"], start_time=clock.now())
    _serve(workload, clock, listen_host, served_ports, chip_count,
           exit_with_parent, report_to, kernel_log)


def _write_trace(asked: str, scenarios: list[str], slice_name: str | None, path: str,
                 duration_s: float, poll_interval: float, chips: int, seed: int,
                 total: int) -> None:
    """Write the trace as ``tpumon export`` writes one: its format from the name, whole or
    not at all (a failure half-way never leaves a truncated file where an older trace was).
    Several hosts (a slice) get each worker's share of a slice scenario and its seed
    (seed + k) as ``--hosts`` serves them, are named as an agent on each of them names
    itself (``worker_hostname``: t1v-n-SLICE-w-k), and are merged in time."""
    import heapq

    from tpumon.cli.trace_output import output_format, write_whole
    from tpumon.sim.naming import worker_hostname
    from tpumon.sim.tracegen import SINGLE_HOST, generate_trace

    fmt = output_format(path, can_ask=False)
    hosts = [generate_trace(scenario, duration_s=duration_s, poll_interval_s=poll_interval,
                            chips=chips, seed=seed + k, hbm_total_bytes=total,
                            poll_jitter_s=min(0.05, poll_interval / 2),
                            host=worker_hostname(slice_name, k) if slice_name else SINGLE_HOST)
             for k, scenario in enumerate(scenarios)]
    rows = heapq.merge(*hosts, key=lambda row: row.time) if len(hosts) > 1 else hosts[0]
    try:
        count = write_whole(rows, path, fmt)
    except OSError as exc:
        raise ConfigError(f"--write-trace {path}: {exc.strerror or exc}") from None
    played = "/".join(dict.fromkeys(scenarios))
    log.info("wrote %d rows of scenario %s%s to %s", count, asked,
             f" (its hosts play {played})" if played != asked else "", path)


def _serve(workload: "Workload", clock: "SimClock", host: str, ports: list[int], chips: int,
           exit_with_parent: bool, report_to: str | None = None,
           kernel_log: str | None = None) -> None:
    from tpumon.sim.server import Simulator

    if len(ports) > chips:
        raise ConfigError(f"--port: {len(ports)} ports for {chips} chips; use at most one per chip")
    simulator = Simulator(workload, clock, host, ports, chips, kernel_log)
    try:
        bound = simulator.start()
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"--port: cannot serve on {host}:{ports}: {exc}") from None
    stop = threading.Event()
    with signals_to_events({signal.SIGTERM: stop, signal.SIGINT: stop}):
        print(f"{READY_PREFIX}{','.join(map(str, bound))}", flush=True)
        log.info("simulating %d chips (scenario %s, %gx time) on %s port(s) %s", chips,
                 workload.scenario.name, clock.acceleration, host, ",".join(map(str, bound)))
        parent = os.getppid()
        reporter = _StepReporter(socket=report_to, min_interval=0,
                                 leaks=workload.leak_bytes_per_step_by_chip) if report_to else None
        while not stop.wait(0.25 if reporter else 1.0):
            if exit_with_parent and os.getppid() != parent:
                log.info("parent exited; stopping")
                break
            if reporter is not None:
                sample = simulator.samples.current()
                if sample.runtime_up:
                    reporter.step(sample.step)
    simulator.stop()


def _serve_slice(config: Any, slice_name: str, hosts: int, base_address: str,
                 ports: list[int], total: int, exit_with_parent: bool,
                 report_to: str | None) -> None:
    """N simulated VMs of one slice until SIGTERM; one line per host says where it is.
    With ``report_to`` (a pattern with {worker}) each host's job reports its step to its
    own agent's socket, as an instrumented training process on each VM would."""
    from tpumon.sim.pod import SliceSpec, start_slice

    spec = SliceSpec(config["simulator.scenario"], hosts, config["simulator.chips"],
                     config["simulator.chip_type"], total, config["simulator.acceleration"],
                     config["simulator.max_lag"], config["simulator.seed"], slice_name,
                     base_address)
    if len(ports) > spec.chips:
        raise ConfigError(f"--port: {len(ports)} ports for {spec.chips} chips; use at most "
                          "one per chip")
    try:
        started = start_slice(spec, ports)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--hosts {hosts} --listen {base_address}: cannot serve: {exc}"
                          ) from None
    stop = threading.Event()
    with signals_to_events({signal.SIGTERM: stop, signal.SIGINT: stop}):
        for host in started:
            assert host.metadata is not None
            print(f"{HOST_PREFIX}worker={host.worker} address={host.address} "
                  f"ports={','.join(map(str, host.ports))} metadata={host.metadata.address} "
                  f"scenario={host.scenario}", flush=True)
        print(f"{READY_PREFIX}{','.join(str(p) for h in started for p in h.ports)}", flush=True)
        log.info("simulating slice %s: %d hosts of %d chips (scenario %s, %gx time)",
                 slice_name, hosts, spec.chips, spec.scenario, spec.acceleration)
        parent = os.getppid()
        reporters = [(h, _StepReporter(socket=report_to.format(worker=h.worker),
                                       min_interval=0,
                                       leaks=h.simulator.samples.workload.leak_bytes_per_step_by_chip))
                     for h in started] if report_to else []
        while not stop.wait(0.25 if reporters else 1.0):
            if exit_with_parent and os.getppid() != parent:
                break
            for host, reporter in reporters:
                sample = host.simulator.samples.current()
                if sample.runtime_up:
                    reporter.step(sample.step)
    for host in started:
        host.stop()


class _StepReporter(Reporter):
    """The simulated training process's reporter: its step, and snapshots of made-up live
    tensors (the simulator models bytes, not tensors): fixed weights, plus, where the
    scenario leaks, one kept activation per step of the leak's size, so that the demo's
    `tpumon snapshot` and leak alerts name a leaking tensor as a real job's would."""

    framework = "sim"

    def __init__(self, *args: Any, leaks: tuple[float, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.leaks = leaks  # bytes per step, per chip

    def take_snapshot(self, step: int) -> Snapshot:
        counts: dict = {}
        site = "simulated_train.py:88 (kept.append(activations))"
        for chip, leak in enumerate(self.leaks):
            device = f"tpu:{chip}"
            counts[((4096, 4096), "bfloat16", device, None)] = [6, 6 * 4096 * 4096 * 2]
            if int(leak) // 4:
                counts[((int(leak) // 4,), "float32", device, site)] = [step, step * (
                    int(leak) // 4) * 4]
        return make_snapshot("sim", step, time.perf_counter(), True, counts)
