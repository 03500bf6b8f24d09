"""Configuration: one TOML file, environment variables and flags, merged in a fixed order.

Precedence, lowest first: built-in defaults < the TOML file < ``TPUMON_<SECTION>_<KEY>``
environment variables < command-line flags. The schema below is the single source of
truth: validation, ``tpumon config show`` and docs/configuration.md all derive from it,
so a key cannot exist in one place and be missing in another.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from tpumon.instrument.protocol import REPORTER_ENV

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


DEFAULT_CONFIG_PATH = Path("/etc/tpumon/config.toml")
ENV_PREFIX = "TPUMON_"
# 9847: outside the ports of node_exporter (9100), dcgm-exporter (9400), libtpu's metric
# service (8431-8434), Orbax/Grain (9431) and GKE's TPU device plugin (2112).
DEFAULT_PORT = 9847
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """A configuration problem, worded as one line that names the key or file at fault."""


@dataclass(frozen=True)
class Key:
    """One configuration key: its type, default, check and documentation."""

    section: str
    name: str
    type: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None
    secret: bool = False  # never echoed: `config show` and error messages redact it

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def env_var(self) -> str:
        return f"{ENV_PREFIX}{self.section}_{self.name}".upper()


def _within(low: float, high: float, unit: str = "") -> Callable[[Any], str | None]:
    """A number in [low, high]: every number in the configuration has a sane range, so
    that a typo such as poll_interval = 1e10 is one clear line from `config check` and
    at start-up, not an OverflowError in a thread (a crash loop under systemd)."""
    def check(value: Any) -> str | None:
        if not (math.isfinite(value) and low <= value <= high):
            return f"must be between {low:g} and {high:g}{unit}"
        return None

    return check


def _history_points(value: int) -> str | None:
    return None if 0 < value <= 10_000_000 else "must be between 1 and 10000000"


def _snapshot_steps(value: int) -> str | None:
    return None if 0 <= value <= 1_000_000 else "must be between 0 and 1000000"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def _ports(value: list[int]) -> str | None:
    bad = [p for p in value if not 0 < p < 65536]
    return f"has port(s) outside 1-65535: {', '.join(map(str, bad))}" if bad else None


def _fraction(value: Any) -> str | None:
    return None if 0 < value <= 1 else "must be in (0, 1]"


def _url(value: str) -> str | None:
    ok = value == "" or value.startswith(("https://", "http://"))
    return None if ok else "must be an http(s) URL"


def _link_template(value: str) -> str | None:
    """Notification links are filled in per alert: a typo must fail at start-up, not then."""
    try:
        value.format(host="h", worker="w", slice="s", chip="0")
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        return f"may use only {{host}}, {{worker}}, {{slice}} and {{chip}} ({exc!r})"
    return None


def _scenario(value: str) -> str | None:
    """The form of a scenario's name; which ones exist the simulator checks where it is
    started (tpumon.sim.pod.check_scenario): the configuration imports no simulator."""
    return None if re.fullmatch(r"[a-z0-9][a-z0-9+-]*", value) else \
        "must be a scenario's name (see 'tpumon sim --list')"


def _listen_address(value: str) -> str | None:
    try:
        parse_listen_address(value)
    except ValueError as exc:
        return str(exc)
    return None


SCHEMA: tuple[Key, ...] = (
    Key("agent", "poll_interval", float, 5.0,
        "Seconds between polls of the TPU runtime and the host.", _within(0.01, 3600, " s")),
    Key("agent", "history_points", int, 4096,
        "Unused: the in-memory ring of samples it sized is gone (the history store keeps "
        "them); accepted so that older configuration files still load.",
        _history_points),
    Key("agent", "log_level", str, "info",
        "One of debug, info, warning, error.", _one_of(*LOG_LEVELS)),
    Key("agent", "kernel_log", str, "/dev/kmsg",
        "The kernel's log, read for processes killed for memory (a job's end is then named "
        "host_oom). Needs root or CAP_SYSLOG where kernel.dmesg_restrict is 1. Empty: not "
        "read."),
    Key("exporter", "listen_address", str, f":{DEFAULT_PORT}",
        "HOST:PORT for /metrics; ':PORT' listens on all interfaces, '[::1]:PORT' on IPv6.",
        _listen_address),
    Key("exporter", "web_config_file", str, "",
        "Web configuration file in the Prometheus exporter-toolkit format (node_exporter's "
        "--web.config.file): TLS, client certificates and basic auth for every path. Empty: "
        "plain HTTP, no authentication."),
    Key("runtime", "address", str, "localhost",
        "Host of libtpu's runtime metric service."),
    Key("runtime", "ports", list, [],
        "Ports of the runtime metric service. Empty: TPU_RUNTIME_METRICS_PORTS, then the "
        "TPU VM's tpu-env metadata, then 8431.", _ports),
    Key("runtime", "timeout", float, 1.0,
        "Deadline in seconds for every gRPC call; a hung runtime costs at most this per poll.",
        _within(0.01, 300, " s")),
    Key("runtime", "slow_metrics_interval", float, 15.0,
        "Seconds between asking for everything but HBM usage (asked every poll): total "
        "memory, duty cycle and the runtime's other metrics (bandwidth, idle time, HLO "
        "queue and timings, megascale/DCN distributions); 0 asks for all every poll. "
        "The default matches a 15 s Prometheus scrape.",
        _within(0, 86400, " s")),
    Key("runtime", "owners_interval", float, 30.0,
        "Seconds between scans of /proc for the processes that own each chip.",
        _within(0.1, 86400, " s")),
    Key("runtime", "device_dir", str, "/dev",
        "Directory of the chips' device files (accelN, vfio/N). A process holds a chip "
        "when one of its open files is the very file the agent sees there (the same "
        "character device number), whatever its link in /proc reads."),
    Key("kubernetes", "pod_resources", str, "auto",
        "Label each chip's series with the pod, namespace and container it is allocated "
        "to and its accelerator_id, from the kubelet's pod-resources API: 'auto' (when "
        "the socket exists at start-up), 'on' (a missing socket is a reported down "
        "state), 'off'.", _one_of("auto", "on", "off")),
    Key("kubernetes", "pod_resources_socket", str,
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "The kubelet's pod-resources socket (the DaemonSet mounts its directory "
        "read-only)."),
    Key("kubernetes", "pod_resources_interval", float, 30.0,
        "Seconds between asking the kubelet which pod holds each chip (pods change "
        "rarely; a new pod's labels appear within this).", _within(1, 3600, " s")),
    Key("kubernetes", "tpu_resource", str, "google.com/tpu",
        "The extended resource name of TPU chips in the pod-resources answer."),
    Key("identity", "hostname", str, "",
        "Host label. Empty: the machine's hostname."),
    Key("identity", "worker", str, "",
        "TPU worker id in the slice. Empty: TPU_WORKER_ID, tpu-env metadata, or the '-w-N' "
        "suffix of the hostname."),
    Key("identity", "accelerator_type", str, "",
        "Accelerator type such as v4-32. Empty: TPU_ACCELERATOR_TYPE or tpu-env metadata."),
    Key("identity", "slice", str, "",
        "TPU (slice) name. Empty: TPU_NAME or tpu-env metadata (NODE_ID)."),
    Key("identity", "metadata", str, "auto",
        "Ask the GCE metadata server: 'auto' (only on Google Compute Engine), 'on', 'off'.",
        _one_of("auto", "on", "off")),
    Key("identity", "metadata_timeout", float, 0.5,
        "Seconds to wait for the metadata server at start-up.", _within(0.01, 60, " s")),
    Key("store", "state_dir", str, "/var/lib/tpumon",
        "Directory of the history store (history.db: samples and detector state, resumed "
        "after a restart). Empty: no history store. With --simulate only when set "
        "explicitly."),
    Key("store", "raw_retention_hours", float, 24.0,
        "Hours of every poll's samples kept; older ones are rolled up into per-minute "
        "floors and peaks.", _within(0.01, 8784, " hours")),
    Key("store", "minute_retention_days", float, 30.0,
        "Days of per-minute floors and peaks kept.", _within(0.01, 3660, " days")),
    Key("store", "max_size_mb", float, 256.0,
        "Hard cap on the state directory's files (MiB): the history store's, the oldest "
        "data going first, and the notification outbox's (a sixteenth of it, 256 KiB to "
        "16 MiB; delivered notifications going first).",
        _within(1, 1048576, " MiB")),
    Key("store", "checkpoint_interval", float, 60.0,
        "Seconds between saves of the detectors' state (a restart replays the samples "
        "stored since).", _within(0.01, 86400, " s")),
    Key("store", "write_delay", float, 5.0,
        "Seconds a poll may wait to be written together with the next ones (fewer commits; "
        "a crash loses at most this much history).", _within(0, 3600, " s")),
    Key("reporter", "socket", str, "/run/tpumon/reporter.sock",
        "Unix datagram socket for the in-process reporters (tpumon.instrument); each "
        "reporter connects to <name>-seqpacket<ext> beside it (docs/reporters.md). Empty: "
        "none. With --simulate only when set explicitly."),
    Key("reporter", "allowed_uids", list, [],
        "Only reports from processes of these user ids are taken (the kernel vouches for "
        "the uid). Empty: any local user's. Where the agent cannot see which process holds "
        "a chip, only these users' processes (empty: root's and the agent's user's) give "
        "the chip its step."),
    Key("reporter", "snapshot_on_leak", bool, True,
        "When a chip's leak alert is raised and its training process reports, ask that "
        "process for two live-tensor snapshots and name what grew (tpumon snapshot does it "
        "on demand)."),
    Key("reporter", "snapshot_steps", int, 0,
        "Steps between the two snapshots. 0: about two minutes of the job's steps, at least "
        "100 and at most 10000.", _snapshot_steps),
    Key("alerts", "oom_horizon_hours", float, 6.0,
        "Critical alert when a leaking chip's forecast OOM is nearer than this. Exported as "
        "tpumon_alert_oom_horizon_seconds, which the Prometheus rules read too.",
        _within(0.01, 8784, " hours")),
    Key("alerts", "hbm_used_ratio_threshold", float, 0.95,
        "Warning when a chip's HBM floor stays above this fraction of its capacity. Exported "
        "as tpumon_alert_hbm_used_ratio_threshold.", _fraction),
    Key("alerts", "training_stall_minutes", float, 10.0,
        "Warning when a reporting training process has sent no step for this long while it "
        "is alive and its chips hold memory.", _within(0.01, 10080, " minutes")),
    Key("alerts", "resolve_after_minutes", float, 10.0,
        "An alert resolves after its condition has been false this long (no flapping).",
        _within(0.01, 10080, " minutes")),
    Key("alerts", "dashboard_url", str, "",
        "Link in every notification; {host}, {worker}, {slice} and {chip} are filled in. "
        "Empty: no link.", _link_template),
    Key("alerts", "report_url", str, "",
        "Link to the host's report in every notification, e.g. "
        "'http://{host}:9847/report' (the agent serves it from its history store); "
        "{host}, {worker}, {slice} and {chip} are filled in. Empty: no link.", _link_template),
    Key("slack", "webhook_url", str, "",
        "Slack incoming webhook URL (a secret: prefer webhook_url_file or the environment). "
        "Empty, with no file: no Slack notifications.", _url, secret=True),
    Key("slack", "webhook_url_file", str, "",
        "File holding the webhook URL. Empty: $CREDENTIALS_DIRECTORY/slack-webhook-url "
        "when systemd passes credentials."),
    Key("slack", "min_severity", str, "warning",
        "Least severity sent to Slack: warning or critical.", _one_of("warning", "critical")),
    Key("pagerduty", "routing_key", str, "",
        "PagerDuty Events API v2 routing (integration) key (a secret: prefer "
        "routing_key_file or the environment). Empty, with no file: no PagerDuty events.",
        secret=True),
    Key("pagerduty", "routing_key_file", str, "",
        "File holding the routing key. Empty: $CREDENTIALS_DIRECTORY/pagerduty-routing-key "
        "when systemd passes credentials."),
    Key("pagerduty", "min_severity", str, "critical",
        "Least severity sent to PagerDuty: warning or critical.",
        _one_of("warning", "critical")),
    Key("pagerduty", "url", str, "https://events.pagerduty.com/v2/enqueue",
        "Events API v2 endpoint.", _url),
    Key("simulator", "scenario", str, "linear-leak",
        "Workload scenario for --simulate and 'tpumon sim' (see 'tpumon sim --list').",
        _scenario),
    Key("simulator", "chips", int, 4, "Number of simulated chips.", _within(1, 64)),
    Key("simulator", "chip_type", str, "v4",
        "Simulated chip type.", _one_of("v4", "v5e", "v5p", "v6e")),
    Key("simulator", "acceleration", float, 60.0,
        "Simulated seconds per real second.", _within(0.001, 1000000)),
    Key("simulator", "seed", int, 0, "Random seed of the simulated workload.",
    _within(0, 2**32 - 1)),
    Key("simulator", "host", str, "",
        "With --simulate: the metadata address (HOST:PORT) of one host of a running "
        "'tpumon sim --hosts N' to attach to, instead of starting a simulator; its identity "
        "and runtime ports come from there. '': start one."),
    Key("simulator", "max_lag", float, 60.0,
        "Simulated seconds the job may run ahead of the runtime's last reader; a reader "
        "that comes later finds the simulated world waited for it (polls never farther "
        "apart than this, however busy the host; polls set further apart slow the "
        "simulation to it). 0: time runs on regardless.", _within(0, 1000000, " s")),
)

KEYS: dict[str, Key] = {k.dotted: k for k in SCHEMA}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(k.section for k in SCHEMA))


@dataclass
class Config:
    """Effective configuration: ``values['agent.poll_interval']`` and where each came from."""

    values: dict[str, Any] = field(default_factory=lambda: {k: v.default for k, v in KEYS.items()})
    origins: dict[str, str] = field(default_factory=lambda: {k: "default" for k in KEYS})
    path: Path | None = None

    def __getitem__(self, dotted: str) -> Any:
        return self.values[dotted]

    def set(self, dotted: str, value: Any, origin: str) -> None:
        """Validate and set one key; errors name the key and where the value came from."""
        key = KEYS[dotted]
        value = _coerce(key, value, origin)
        problem = key.check(value) if key.check else None
        if problem:
            shown = "a secret, not shown" if key.secret else repr(value)
            raise ConfigError(f"{origin}: {dotted} {problem} (got {shown})")
        self.values[dotted] = value
        self.origins[dotted] = origin


def _coerce(key: Key, value: Any, origin: str) -> Any:
    """Accept a value of the key's type (ints where floats are wanted); nothing looser."""
    ok = {
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        list: isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value),
    }[key.type]
    if not ok:
        expected = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
                    list: "a list of integers"}[key.type]
        shown = "a secret, not shown" if key.secret else repr(value)
        raise ConfigError(f"{origin}: {key.dotted} must be {expected}, got {shown}")
    return float(value) if key.type is float else value


def _parse_env_value(key: Key, raw: str) -> Any:
    """Environment variables are strings; turn them into the key's type."""
    try:
        if key.type is float:
            return float(raw)
        if key.type is int:
            return int(raw)
        if key.type is bool:
            return {"true": True, "1": True, "false": False, "0": False}[raw.strip().lower()]
        if key.type is list:
            return parse_ports(raw)
    except (ValueError, KeyError):
        raise ConfigError(f"environment {key.env_var}: cannot read {raw!r} "
                          f"as {key.type.__name__}") from None
    return raw


def parse_ports(raw: str) -> list[int]:
    """'8431,8432' or '8431-8434' (libtpu's TPU_RUNTIME_METRICS_PORTS form) -> [8431, ...]."""
    ports: list[int] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi - lo >= 65536:  # not a list of ports, and not one to build in memory
                raise ValueError(f"port range {part!r} is longer than there are ports")
            ports.extend(range(lo, hi + 1))
        else:
            ports.append(int(part))
    return ports


def parse_listen_address(value: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or '[v6]:PORT' -> (host, port); host '' means all interfaces."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("is not HOST:PORT (a port of 0-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def reachable_host(host: str) -> str:
    """Where this machine reaches a server listening on ``host``: a wildcard ('', 0.0.0.0,
    ::) means its loopback, any other address itself."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    return "::1" if host == "::" else host


def _unknown_key(name: str, known: list[str], where: str) -> ConfigError:
    import difflib  # on a bad key only

    hint = difflib.get_close_matches(name, known, n=1)
    suffix = f" (did you mean '{hint[0]}'?)" if hint else ""
    return ConfigError(f"{where}: unknown key '{name}'{suffix}")


def _apply_file(config: Config, path: Path) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: invalid TOML: nested too deeply") from None
    for section, table in data.items():
        if section not in SECTIONS:
            raise _unknown_key(section, list(SECTIONS), f"config file {path}")
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: '{section}' must be a table ([{section}])")
        for name, value in table.items():
            dotted = f"{section}.{name}"
            if dotted not in KEYS:
                raise _unknown_key(dotted, list(KEYS), f"config file {path}")
            config.set(dotted, value, f"config file {path}")


def _apply_env(config: Config, env: Mapping[str, str]) -> None:
    by_var = {k.env_var: k for k in SCHEMA}
    for var, raw in env.items():
        if not var.startswith(ENV_PREFIX) or var == f"{ENV_PREFIX}CONFIG":
            continue
        key = by_var.get(var)
        if key is None and var in REPORTER_ENV:
            continue  # read by training processes, not by the agent
        if key is None:
            raise _unknown_key(var, list(by_var), "environment")
        config.set(key.dotted, _parse_env_value(key, raw), f"environment {var}")


def load_config(path: str | os.PathLike[str] | None = None,
                overrides: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> Config:
    """Build the effective configuration.

    ``path`` None means ``$TPUMON_CONFIG``, else /etc/tpumon/config.toml if it exists (a
    missing default file is normal; a missing file that was asked for is an error).
    ``overrides`` are flag values keyed by dotted name; None values mean "flag not given".
    """
    env = os.environ if env is None else env
    config = Config()
    explicit = path if path is not None else env.get(f"{ENV_PREFIX}CONFIG")
    chosen = Path(explicit) if explicit else DEFAULT_CONFIG_PATH
    if explicit or chosen.exists():
        _apply_file(config, chosen)
        config.path = chosen
    _apply_env(config, env)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            config.set(dotted, value, "command line")
    return config


def render_toml(config: Config, with_docs: bool = True) -> str:
    """The effective configuration as a TOML file that load_config reads back unchanged:
    values are written by tomli-w (any string, control characters included); the comments
    around them are made one line each."""
    lines: list[str] = []
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for key in (k for k in SCHEMA if k.section == section):
            origin = config.origins[key.dotted]
            if with_docs:
                lines.append(_comment(f"{key.doc} Default: {_toml_value(key.default)}."
                                      f" Env: {key.env_var}."))
                lines.append(_comment(f"  (now from {origin})"))
            value = config[key.dotted]
            if key.secret and value:  # set, but never printed: show where it came from
                lines.append(_comment(f"{key.name} is set ({origin}); not shown"))
                continue
            lines.append(f"{key.name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    """One value as TOML, on one line (a list inline, as in docs/configuration.md)."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    import tomli_w  # `tpumon config show` only: the agent never writes TOML

    return tomli_w.dumps({"v": value})[len("v = "):].rstrip("\n")


def _comment(text: str) -> str:
    """A TOML comment line: control characters (which a comment may not hold, and a line
    break would end it) written as escapes."""
    return "# " + _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
