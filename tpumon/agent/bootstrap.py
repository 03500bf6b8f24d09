"""Assembles an agent from a configuration: which chips, which ports, who am I, which sources.

Both ``tpumon agent`` and the one-shot ``tpumon status`` are built here, so they can never
disagree about where the runtime is or how a chip is named. With ``simulate`` the same
agent is pointed at a ``tpumon sim`` child instead of libtpu.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import time
import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.agent.components import (AlertThresholds, LogLevel, NotifierComponent,
                                     ReporterComponent, Service)
from tpumon.common.config import Config, ConfigError, parse_ports
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import Identity, discover_tpu_env, fetch_tpu_env, resolve_identity
from tpumon.sim.naming import DEFAULT_SLICE, accelerator_type, worker_hostname
from tpumon.sim.naming import tpu_env as simulated_tpu_env
from tpumon.sim.process import spawn_simulator
from tpumon.sources.chips import ChipInventory, ChipOwnerScan, detect_chips, inventory_for
from tpumon.notify.alerts import AlertLog, AlertSettings, AlertTracker
from tpumon.notify.secrets import SecretSetting, read_secret
from tpumon.common.private_paths import private_dir
from tpumon.diagnose.leak_snapshots import LeakSnapshots
from tpumon.agent.lifecycle import Lifecycle
from tpumon.sources.kernel_log import KernelLog
from tpumon.sources.pod_resources import PodResourcesSettings, open_pod_resources
from tpumon.sources.reports import ReporterSocket
from tpumon.sources.runtime_server import RuntimeTrust
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from tpumon.state import AgentState
from tpumon.web.status import Readers
from tpumon.store.database import (HistoryDB, Retention, database_path, move_aside,
                                   open_database)
from tpumon.store.resume import restore_detectors
from tpumon.store.writer import StoreWriter
from tpumon.common.units import format_bytes, utc

if TYPE_CHECKING:
    from tpumon.notify.notifier import Channel, Notifier

log = logging.getLogger("tpumon.bootstrap")
DEFAULT_RUNTIME_PORT = 8431


def resolve_ports(configured: list[int], env: Mapping[str, str],
                  tpu_env: Mapping[str, str]) -> tuple[list[int], str]:
    """Runtime ports and where they came from: config, TPU_RUNTIME_METRICS_PORTS, tpu-env, 8431."""
    if configured:
        return configured, "config"
    for origin, raw in (("env TPU_RUNTIME_METRICS_PORTS", env.get("TPU_RUNTIME_METRICS_PORTS")),
                        ("tpu-env TPU_RUNTIME_METRICS_PORTS",
                         tpu_env.get("TPU_RUNTIME_METRICS_PORTS"))):
        if raw:
            try:
                ports = parse_ports(raw)
            except ValueError:
                log.warning("ignoring unreadable %s=%r", origin, raw)
                continue
            if ports:
                return ports, origin
    return [DEFAULT_RUNTIME_PORT], "default"


@dataclass
class Assembly:
    """A ready-to-run agent, its components (started), and what it was built from."""

    agent: Agent
    state: AgentState
    registry: CollectorRegistry
    identity: Identity
    components: Lifecycle  # the agent among them; a reload goes through them all
    store: StoreWriter | None = None
    reporters: ReporterSocket | None = None
    notifier: Notifier | None = None

    def readers(self) -> Readers:
        """The store's and the notifier's own health, for /api/status and systemd."""
        store = self.store
        return Readers(None if store is None else lambda: store.health,
                       None if self.notifier is None else self.notifier.health)

    def close(self) -> None:
        """Stop every component, in the reverse order of building: the readers of the
        poll state first (the store writes what is queued, the notifier finishes the
        request in flight and its outbox keeps the rest), then the runtime source, the
        simulator and the reporters' socket."""
        self.components.stop()


def _path_for(config: Config, key: str, simulate: bool) -> str:
    """A path setting, or '' for "off": with --simulate only one set explicitly counts,
    so a simulation never touches the real agent's state or socket."""
    return "" if simulate and config.origins[key] == "default" else config[key]


def check_private_dirs(config: Config, simulate: bool) -> None:
    """Refuse (ConfigError, one line) a state or socket directory another user could
    redirect the agent's files in (tpumon.common.private_paths); create a missing one: the state
    directory 0750, the socket's 0755 (every user's processes reach the socket)."""
    state_dir = _path_for(config, "store.state_dir", simulate)
    if state_dir:
        private_dir(state_dir, "store.state_dir", 0o750)
    socket_path = _path_for(config, "reporter.socket", simulate)
    if socket_path:
        private_dir(Path(socket_path).parent, "reporter.socket", 0o755)


def open_reporter_socket(config: Config, simulate: bool) -> ReporterSocket | None:
    """The reporters' socket, bound; a path that cannot be bound is logged and the agent
    runs without reports (the runtime and the host are still watched)."""
    path = _path_for(config, "reporter.socket", simulate)
    if not path:
        return None
    reporters = ReporterSocket(path, config["reporter.allowed_uids"])
    try:
        reporters.start()
    except OSError as exc:
        log.error("reporter socket %s: cannot listen: %s; running without in-process "
                  "reports", path, exc.strerror or exc)
        return None
    log.info("in-process reports on %s", path)
    return reporters


def retention_of(config: Config) -> Retention:
    return Retention(raw_seconds=config["store.raw_retention_hours"] * 3600,
                     minute_seconds=config["store.minute_retention_days"] * 86400,
                     max_bytes=int(config["store.max_size_mb"] * 2**20))


def open_store(config: Config, simulate: bool, host: str,
               worker: str = "") -> tuple[StoreWriter | None, dict]:
    """The store's writer and every chip's detector resumed from it. A store that cannot be
    opened is a reported state (the writer retries), never a reason not to monitor. The
    host's worker id is kept in it (meta ``worker HOST``) for `tpumon report`, which
    otherwise knows only the host name."""
    state_dir = _path_for(config, "store.state_dir", simulate)
    if not state_dir:
        log.info("history store off%s", " (--simulate: give --state-dir to keep one)"
                 if simulate and config["store.state_dir"] else "")
        return None, {}
    retention = retention_of(config)
    try:
        db = open_database(state_dir, retention)
    except (OSError, sqlite3.Error) as exc:
        return StoreWriter(state_dir, retention, open_error=exc,
                           write_delay=config["store.write_delay"]), {}
    try:
        db = history_for_clock(db, simulate, retention)
    except (OSError, sqlite3.Error) as exc:
        return StoreWriter(state_dir, retention, open_error=exc,
                           write_delay=config["store.write_delay"]), {}
    if worker:
        try:
            with db.transaction():
                db.set_meta(f"worker {host}", worker)
        except sqlite3.Error as exc:  # only the report's worker line is lost
            log.warning("history store %s: cannot note the worker id: %s", db.path, exc)
    log.info("history store %s (%s)", db.path, format_bytes(db.size_bytes()))
    return (StoreWriter(state_dir, retention, db, write_delay=config["store.write_delay"]),
            restore_detectors(db, host))


RESTART_GAP = 600.0  # simulated s between one simulated run's last sample and the next's first


def history_for_clock(db: HistoryDB, simulate: bool, retention: Retention) -> HistoryDB:
    """The history this run may add to. Its samples are dated by one clock: the wall
    clock, or a simulation's (which runs many times faster, and continues where the last
    simulated run's history ends: simulated_start), and two clocks must never mix in one
    history. So a real agent sets a simulated history aside (one copy kept beside it) and
    starts a fresh one, and a simulation refuses a real agent's history outright."""
    clock = "simulated" if simulate else "real"
    stored = db.meta("clock") or ("real" if db.has_samples() else None)
    if simulate and stored == "real":
        db.close()
        raise ConfigError(f"--state-dir {db.path.parent}: holds a real agent's history; a "
                          "simulated run keeps its own (give it another directory)")
    if stored == "simulated" and not simulate:
        db.close()
        aside = move_aside(db.path, "previous-simulated-run")
        log.warning("history store %s: a simulated run's history (dated by its own clock) "
                    "is kept as %s; this agent starts a fresh one", db.path, aside)
        db = HistoryDB(db.path, retention)
    with db.transaction():
        db.set_meta("clock", clock)
    return db


def simulated_start(config: Config, simulate: bool) -> float | None:
    """Where a simulated run's clock starts: RESTART_GAP after the newest sample of the
    simulated history it adds to (a job restarted after a short outage), so that the
    history stays in order however far ahead the last run's clock ran; None (now) for a
    fresh history."""
    state_dir = _path_for(config, "store.state_dir", simulate)
    if not simulate or not state_dir or not database_path(state_dir).exists():
        return None
    try:
        db = HistoryDB(database_path(state_dir), Retention(), read_only=True)
    except (OSError, sqlite3.Error):
        return None  # open_store says what is wrong with it
    try:
        if db.meta("clock") != "simulated":
            return None
        latest = max((db.latest_time(series) for series, _, _ in db.series()),
                     default=-math.inf)
    finally:
        db.close()
    if latest + RESTART_GAP <= time.time():
        return None
    log.info("simulated clock: continuing the stored simulated history at %s, %g simulated "
             "s after its last sample (as a job restarted after an outage)",
             utc(latest + RESTART_GAP, seconds=True), RESTART_GAP)
    return latest + RESTART_GAP


SEVERITIES = ("warning", "critical")


def _secret(config: Config, key: str) -> SecretSetting:
    return SecretSetting(key, config[key], config[f"{key}_file"])


def pod_resources_settings(config: Config) -> PodResourcesSettings:
    """The kubernetes.* keys the pod-resources source reads, typed."""
    return PodResourcesSettings(
        config["kubernetes.pod_resources"], config["kubernetes.pod_resources_socket"],
        config.origins["kubernetes.pod_resources_socket"] != "default",
        config["kubernetes.pod_resources_interval"], config["runtime.timeout"],
        config["kubernetes.tpu_resource"])


def notification_channels(config: Config, env: Mapping[str, str] | None = None) -> list[Channel]:
    """The channels whose secret is configured (value, file or systemd credential). The
    delivery code (notifier, outbox, HTTP posts, the channels) is imported only for a
    channel configured: an agent without Slack or PagerDuty runs without it (0.3-0.6 MiB
    of RSS, docs/benchmarks.md)."""
    def at_least(level: str) -> tuple[str, ...]:
        return SEVERITIES[SEVERITIES.index(level):]

    channels: list[Channel] = []
    url = read_secret(_secret(config, "slack.webhook_url"), "slack-webhook-url", env)
    if url:
        if not url.startswith(("https://", "http://")):
            raise ConfigError("slack.webhook_url (from its file): must be an http(s) URL")
        from tpumon.notify.slack import SlackChannel
        channels.append(SlackChannel(url, at_least(config["slack.min_severity"])))
    key = read_secret(_secret(config, "pagerduty.routing_key"), "pagerduty-routing-key", env)
    if key:
        from tpumon.notify.pagerduty import PagerDutyChannel
        channels.append(PagerDutyChannel(config["pagerduty.url"], key,
                                         at_least(config["pagerduty.min_severity"])))
    return channels


def open_notifier(config: Config, simulate: bool, state: AgentState,
                  channels: list[Channel]) -> Notifier | None:
    """The notifier with its outbox beside the history store, resuming the alerts that
    were active; None when no channel is configured."""
    if not channels:
        return None
    from tpumon.notify.notifier import Notifier
    from tpumon.notify.outbox import open_outbox
    outbox = open_outbox(_path_for(config, "store.state_dir", simulate),
                         retention_of(config).outbox_bytes)
    tracker = AlertTracker(AlertSettings.from_config(config), outbox.active())
    log.info("notifications to %s (%d alert(s) active from before)",
             ", ".join(c.name for c in channels), len(tracker.active))
    return Notifier(lambda: state.current, tracker, outbox, channels)


def alert_tracker(config: Config, notifier: Notifier | None
                  ) -> tuple[AlertLog | None, AlertTracker]:
    """The tracker that raises the alerts: the notifier's, or without one (no Slack, no
    PagerDuty) an alert log's, for the agent to run: alerts are still raised, in the log."""
    if notifier is not None:
        return None, notifier.tracker
    logged = AlertLog(AlertSettings.from_config(config))
    return logged, logged.tracker


def agent_kernel_log(config: Config, simulate: bool, simulated: str | None) -> KernelLog | None:
    """The kernel log the agent reads: under --simulate the simulator's (a file it writes
    its job's OOM kill to; none when attached to a simulated slice's host), else
    agent.kernel_log (empty: none)."""
    path = simulated if simulate else config["agent.kernel_log"]
    return KernelLog(path) if path else None


def simulated_kernel_log() -> str:
    """An empty file for the simulated kernel's lines, removed when the agent exits."""
    fd, path = tempfile.mkstemp(prefix="tpumon-sim-kmsg-")
    os.close(fd)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def simulated_owners(pid: int, devices: Sequence[str],
                     runtime: list[TpuRuntimeSource]) -> Callable[[], dict[str, int]]:
    """The simulator's process owns the chips while its job runs (its runtime's ports
    answer), as a real job's process holds /dev/accel* while it lives: between jobs and
    after an OOM nobody does, and the agent sees the job end."""
    def owners() -> dict[str, int]:
        up = bool(runtime) and any(runtime[0].ports_up.values())
        return {d: pid for d in devices} if up else {}
    return owners


SPARSEST_SIMULATED_POLLS = 60.0  # simulated s between polls at most (see check_simulation_pace)


def check_simulation_pace(config: Config) -> None:
    """Refuse a simulation whose polls would come more than SPARSEST_SIMULATED_POLLS
    simulated seconds apart: so sparse, the polls catch the step's sawtooth at random
    phases, the floors under it are not found, and the linear leak reads 'ok' at 90 s
    apart; at 60 s it is called within hours, at 15 (make demo) within one.
    Say so when the bound (simulator.max_lag) makes the simulated job wait for polls."""
    poll, acceleration = config["agent.poll_interval"], config["simulator.acceleration"]
    apart = poll * acceleration
    bound = config["simulator.max_lag"]
    if min(apart, bound if bound > 0 else math.inf) > SPARSEST_SIMULATED_POLLS:
        raise ConfigError(
            f"--acceleration {acceleration:g} with polls every {poll:g} s puts {apart:g} "
            f"simulated s between polls (simulator.max_lag {bound:g}); the leak detector "
            f"needs a poll at least every {SPARSEST_SIMULATED_POLLS:g} simulated s to find "
            f"the floor under each step: use --acceleration "
            f"{SPARSEST_SIMULATED_POLLS / poll:g} or less, poll more often, or set "
            f"simulator.max_lag to {SPARSEST_SIMULATED_POLLS:g} or less")
    if bound > 0 and apart > bound:
        log.info("polls every %g s at %gx are %g simulated s apart, more than "
                 "simulator.max_lag (%g s): the simulated job waits for each poll "
                 "(about %gx)", config["agent.poll_interval"],
                 config["simulator.acceleration"], apart, bound,
                 bound / config["agent.poll_interval"])


def _attach_simulated_host(config: Config) -> tuple[ChipInventory, str, list[int],
                                                     dict[str, str], OwnerScanner]:
    """One host of a running ``tpumon sim --hosts N``: its tpu-env (identity, runtime ports)
    from its metadata server, as on a TPU VM; no chip owner (the simulator is not ours)."""
    where = config["simulator.host"]
    tpu_env = fetch_tpu_env(max(config["identity.metadata_timeout"], 2.0),
                            {"GCE_METADATA_HOST": where})
    if not {"NODE_ID", "WORKER_ID", "TPU_RUNTIME_METRICS_PORTS"} <= tpu_env.keys():
        raise ConfigError(f"simulator.host {where}: no simulated host's metadata there "
                          "(start one with 'tpumon sim --hosts N')")
    ports, _ = resolve_ports([], {}, tpu_env)
    address = where.rpartition(":")[0]
    inventory = inventory_for(config["simulator.chip_type"], config["simulator.chips"])
    log.info("attached to simulated worker %s of slice %s at %s:%s", tpu_env["WORKER_ID"],
             tpu_env["NODE_ID"], address, ",".join(map(str, ports)))
    return inventory, address, ports, tpu_env, OwnerScanner(dict, 5.0)


def build(config: Config, simulate: bool = False, env: Mapping[str, str] | None = None,
          history: bool = True) -> Assembly:
    """Wire sources, state and exporter registry; start the simulator child if asked.
    ``history`` False (a one-off ``tpumon status``) leaves the history store and the
    reporter socket (both the running agent's) alone. A build that fails part-way stops
    what it had built (the simulator child, the reporter socket) before the error goes on:
    the caller has no assembly to close."""
    components = Lifecycle()
    try:
        return _assemble(config, simulate, os.environ if env is None else env, history,
                         components)
    except BaseException:
        components.stop()
        raise


def _assemble(config: Config, simulate: bool, env: Mapping[str, str], history: bool,
              components: Lifecycle) -> Assembly:
    configured_identity = {k: config[f"identity.{k}"]
                           for k in ("hostname", "worker", "accelerator_type", "slice")}
    if simulate:
        from tpumon.sim.pod import check_scenario

        check_scenario(config)
    if history:
        check_private_dirs(config, simulate)
    channels = notification_channels(config, env) if history else []  # a bad secret file
    reporters = open_reporter_socket(config, simulate) if history else None  # fails first
    if reporters is not None:
        components.add(ReporterComponent(reporters))
    sources: list[TpuRuntimeSource] = []  # the runtime source, once made
    sim_kernel_log = simulated_kernel_log() if simulate and not config["simulator.host"] \
        else None
    if simulate and config["simulator.host"]:
        check_simulation_pace(config)
        inventory, address, ports, tpu_env, owners = _attach_simulated_host(config)
        configured_identity["hostname"] = configured_identity["hostname"] or \
            worker_hostname(tpu_env["NODE_ID"], tpu_env["WORKER_ID"])
    elif simulate:
        check_simulation_pace(config)
        simulator = spawn_simulator(config["simulator.scenario"], config["simulator.chips"],
                                    config["simulator.chip_type"], config["simulator.acceleration"],
                                    config["simulator.seed"],
                                    report_to=str(reporters.path) if reporters else None,
                                    max_lag=config["simulator.max_lag"],
                                    start_time=simulated_start(config, simulate),
                                    kernel_log=sim_kernel_log)
        components.add(Service("simulator", simulator.stop))
        inventory = inventory_for(config["simulator.chip_type"], config["simulator.chips"])
        address, ports = "127.0.0.1", simulator.ports
        # A one-VM slice, named as the simulated slices are, so that every label is filled
        tpu_env = simulated_tpu_env(DEFAULT_SLICE, 0, accelerator_type(
            config["simulator.chip_type"], config["simulator.chips"], 1), ports)
        owners = OwnerScanner(simulated_owners(simulator.pid, inventory.devices, sources), 0.0)
        log.info("simulating %d %s chips (scenario %s, %gx time) on 127.0.0.1:%s",
                 inventory.count, inventory.chip_type, config["simulator.scenario"],
                 config["simulator.acceleration"], ",".join(map(str, ports)))
    else:
        inventory = detect_chips()
        tpu_env = discover_tpu_env(config["identity.metadata"],
                                   config["identity.metadata_timeout"], env)
        ports, origin = resolve_ports(config["runtime.ports"], env, tpu_env)
        address = config["runtime.address"]
        owners = OwnerScanner(ChipOwnerScan(config["runtime.device_dir"]),
                              config["runtime.owners_interval"])
        _log_inventory(inventory, address, ports, origin)
    identity = resolve_identity(configured_identity, tpu_env, env)
    runtime = TpuRuntimeSource(address, ports, config["runtime.timeout"], inventory,
                               runtime_clock=simulate,
                               slow_interval=config["runtime.slow_metrics_interval"],
                               trust=RuntimeTrust(owners, lambda: reporters.allowed_uids
                                                  if reporters is not None else
                                                  config["reporter.allowed_uids"]))
    sources.append(runtime)
    components.add(Service("runtime source", runtime.close))
    state = AgentState(identity, inventory)
    notifier = open_notifier(config, simulate, state, channels)
    if notifier is not None:
        components.add(NotifierComponent(notifier, notification_channels))
    store, detectors = open_store(config, simulate, identity.host,
                                    identity.worker) if history else (None, {})
    if store is not None:
        components.add(Service("history store", store.stop, store.start))
    alert_log, tracker = alert_tracker(config, notifier)
    components.add(AlertThresholds(tracker))
    registry = build_registry(lambda: state.current,
                              store_health=None if store is None else lambda: store.health,
                              notifier_health=None if notifier is None else notifier.health,
                              alert_settings=lambda: tracker.settings)
    agent = components.add(Agent(AgentInputs(
        state, runtime, owners, config["agent.poll_interval"], registry, detectors=detectors,
        store=store, checkpoint_interval=config["store.checkpoint_interval"],
        reporters=reporters, alert_log=alert_log,
        leak_snapshots=None if reporters is None or not config[
            "reporter.snapshot_on_leak"] else LeakSnapshots(
            reporters.request_snapshot, config["reporter.snapshot_steps"]),
        kernel_log=agent_kernel_log(config, simulate, sim_kernel_log),
        pod_resources=open_pod_resources(pod_resources_settings(config), simulate,
                                         inventory))))
    components.add(LogLevel())
    components.start()
    return Assembly(agent, state, registry, identity, components, store, reporters, notifier)


def _log_inventory(inventory: ChipInventory, address: str, ports: list[int], origin: str) -> None:
    if inventory.chip_type:
        log.info("%d TPU %s chip(s) on this VM", inventory.count, inventory.chip_type)
    else:
        log.info("no TPU chips found in /sys/bus/pci; reporting what the runtime answers")
    log.info("runtime metric service: %s ports %s (from %s)", address,
             ",".join(map(str, ports)), origin)
    if os.geteuid() != 0:
        log.info("not root: chip owners are visible only for this user's processes")
