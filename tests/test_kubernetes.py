"""deploy/kubernetes/ and the Dockerfile: valid against the Kubernetes schemas, and in
agreement with the agent they deploy (its configuration keys, flags, port, HTTP routes,
secret names and socket), so that a change on either side that breaks the deployment
fails here rather than on a TPU node.

Built-in kinds are checked by kubernetes-validate, offline, in strict mode (an unknown
field is an error), against Kubernetes 1.30 and the newest release it ships. The PodMonitor
(Prometheus Operator) and PodMonitoring (Google Cloud Managed Prometheus) CRDs are not in
its schemas: they are checked against small schemas written below from the CRDs' own
openAPIV3Schema (prometheus-operator example/prometheus-operator-crd/
monitoring.coreos.com_podmonitors.yaml, prometheus-engine charts/operator/crds/
monitoring.googleapis.com_podmonitorings.yaml), covering the fields used here, with
unknown fields rejected. Docker is not run: the Dockerfile is checked statically, and its
build step (a wheel from exactly the files the build context holds) is run for real.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from tools import TPUMON, clean_env, wait_for
from tpumon import __version__
from tpumon.agent.bootstrap import notification_channels
from tpumon.cli import main as tpumon_cli
from tpumon.cli.agent import command as agent_command
from tpumon.common.config import DEFAULT_PORT, KEYS, SCHEMA, load_config, parse_listen_address
from tpumon.web.http import _app as http_app
from tpumon.instrument.protocol import socket_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy/kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
RULES = ROOT / "deploy/prometheus/tpumon.rules.yml"
CRD_KINDS = {"PodMonitor", "PodMonitoring"}
NOT_RESOURCES = {"kustomization.yaml"}
EXAMPLES = {"training-pod-example.yaml"}
SCRAPE = {"podmonitor.yaml", "podmonitoring-gmp.yaml"}  # need their CRD: applied on their own
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
NODE_NAME = "gke-tpu-cluster-v4-pool-1a2b3c4d-x7k2"  # what spec.nodeName gives, for tests


# --- loading -------------------------------------------------------------------------

def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name not in NOT_RESOURCES)


@functools.lru_cache(maxsize=None)
def _parsed(path: Path, mtime: float) -> tuple[dict, ...]:
    return tuple(d for d in yaml.safe_load_all(path.read_text()) if d)


def documents(path: Path) -> list[dict]:
    """The manifests of a file; parsed once (tests that change one work on a deep copy)."""
    return list(_parsed(path, path.stat().st_mtime))


def all_documents() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in manifest_files() for d in documents(p)]


def one(kind: str, file: str | None = None) -> dict:
    found = [d for name, d in all_documents()
             if d["kind"] == kind and (file is None or name == file)]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def daemonset() -> dict:
    return one("DaemonSet")


def pod_spec() -> dict:
    return daemonset()["spec"]["template"]["spec"]


def agent_container() -> dict:
    containers = pod_spec()["containers"]
    assert len(containers) == 1
    return containers[0]


def training_pod_spec() -> dict:
    return one("Job", "training-pod-example.yaml")["spec"]["template"]["spec"]


def config_text() -> str:
    return one("ConfigMap")["data"]["config.toml"]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(config_text())
    return path


def volume_for_path(container: dict, spec: dict, path: str) -> tuple[dict, dict]:
    """The volume and mount a path in the container lives on (the deepest mount)."""
    mounts = [m for m in container["volumeMounts"]
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is on no volume (the root filesystem is read-only)"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return next(v for v in spec["volumes"] if v["name"] == mount["name"]), mount


def walk(node: object, path: tuple = ()):
    """(path, text) for every key and string value in a manifest."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (key,), str(key)
            yield from walk(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, path + (i,))
    elif isinstance(node, str):
        yield path, node


def resolved_env(container: dict) -> dict[str, str]:
    """The container's environment as the kubelet would give it on a node."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "spec.nodeName", f"{var['name']}: no test value for {field}"
            env[var["name"]] = NODE_NAME
    return env


# --- schemas -------------------------------------------------------------------------

DURATION = (r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
            r"(([0-9]+)ms)?)$")
LABEL_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}
METADATA = {
    "type": "object", "additionalProperties": False, "required": ["name", "namespace"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
}


def crd_schema(api_version: str, kind: str, spec: dict) -> dict:
    """A custom resource: exactly apiVersion, kind, metadata and the given spec."""
    return {"type": "object", "additionalProperties": False,
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind},
                           "metadata": METADATA, "spec": spec}}


# monitoring.coreos.com/v1 PodMonitor: spec.selector is required; the endpoint fields
# used here, with the CRD's own duration pattern.
POD_MONITOR = crd_schema("monitoring.coreos.com/v1", "PodMonitor", {
    "type": "object", "additionalProperties": False, "required": ["selector"],
    "properties": {
        "jobLabel": {"type": "string"},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "selector": LABEL_SELECTOR,
        "namespaceSelector": {
            "type": "object", "additionalProperties": False,
            "properties": {"any": {"type": "boolean"},
                           "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "port": {"type": "string"},
                "path": {"type": "string"},
                "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                "interval": {"type": "string", "pattern": DURATION},
                "scrapeTimeout": {"type": "string", "pattern": DURATION},
                "honorLabels": {"type": "boolean"},
            }}},
    },
})

# monitoring.googleapis.com/v1 PodMonitoring: spec.selector and spec.endpoints are
# required, and every endpoint needs port and interval.
POD_MONITORING = crd_schema("monitoring.googleapis.com/v1", "PodMonitoring", {
    "type": "object", "additionalProperties": False,
    "required": ["selector", "endpoints"],
    "properties": {
        "selector": LABEL_SELECTOR,
        "filterRunning": {"type": "boolean"},
        "targetLabels": {"type": "object"},
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["port", "interval"],
            "properties": {
                "port": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "path": {"type": "string"},
                "scheme": {"type": "string"},
                "interval": {"type": "string", "pattern": DURATION},
                "timeout": {"type": "string", "pattern": DURATION},
            }}},
    },
})
CRD_SCHEMAS = {"PodMonitor": POD_MONITOR, "PodMonitoring": POD_MONITORING}


def validate(doc: dict, version: str) -> None:
    if doc["kind"] in CRD_SCHEMAS:
        jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,doc", all_documents(),
                         ids=[f"{n}:{d['kind']}" for n, d in all_documents()])
def test_every_manifest_is_valid_in_strict_mode(name: str, doc: dict, version: str):
    validate(doc, version)  # raises on an unknown field, a wrong type, a missing field


@pytest.mark.parametrize("kind,path,bad", [
    ("DaemonSet", ("spec", "template", "spec", "containers", 0, "securityContext"),
     {"readOnlyRootFileSystem": True}),                       # a typo in a field name
    ("DaemonSet", ("spec", "template", "spec", "containers", 0, "resources", "limits"),
     {"memory": ["256Mi"]}),                                   # a wrong type
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0), {"intervall": "15s"}),
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0), {"interval": "15 seconds"}),
    ("PodMonitoring", ("spec", "endpoints", 0), {"scrapeTimeout": "10s"}),
])
def test_validation_catches_mistakes(kind: str, path: tuple, bad: dict):
    doc = copy.deepcopy(one(kind))
    node = doc
    for key in path:
        node = node[key]
    node.update(bad)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, K8S_VERSIONS[0])


def test_crd_schemas_require_what_the_crds_require():
    monitor = copy.deepcopy(one("PodMonitor"))
    del monitor["spec"]["selector"]
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, K8S_VERSIONS[0])
    monitoring = copy.deepcopy(one("PodMonitoring"))
    del monitoring["spec"]["endpoints"][0]["interval"]
    with pytest.raises(jsonschema.ValidationError):
        validate(monitoring, K8S_VERSIONS[0])


def test_kustomization_applies_every_plain_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert all((K8S / r).is_file() for r in listed)
    expected = {p.name for p in manifest_files()} - SCRAPE - EXAMPLES
    assert listed == expected
    assert {d["kind"] for n, d in all_documents() if n in SCRAPE} == CRD_KINDS


def test_kustomize_builds_the_manifests():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (its kustomize checks the kustomization)")
    result = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    built = [d for d in yaml.safe_load_all(result.stdout) if d]
    expected = [d for n, d in all_documents() if n not in SCRAPE | EXAMPLES]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == \
        sorted((d["kind"], d["metadata"]["name"]) for d in expected)


# --- the DaemonSet: where it runs, what it may do ------------------------------------

def test_the_agent_never_requests_a_tpu_nor_touches_a_device():
    spec = pod_spec()
    for container in spec["containers"] + spec.get("initContainers", []):
        for kind in ("requests", "limits"):
            assert not any("tpu" in r for r in container.get("resources", {}).get(kind, {}))
        assert "volumeDevices" not in container
        assert not container.get("securityContext", {}).get("privileged", False)
    assert not any(v.get("hostPath", {}).get("path", "").startswith("/dev")
                   for v in spec["volumes"])
    mentions = [path for path, value in walk(daemonset()) if "google.com/tpu" in value]
    assert mentions == [("spec", "template", "spec", "tolerations", 0, "key")]


def test_the_agent_runs_on_tpu_nodes_and_tolerates_their_taint():
    spec = pod_spec()
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "cloud.google.com/gke-tpu-accelerator", "operator": "Exists"}]}]
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]


def test_host_namespaces_and_security_context():
    spec = pod_spec()
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["hostPID"] is True
    assert spec.get("hostIPC", False) is False
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = agent_container()["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert sorted(context["capabilities"]["add"]) == ["DAC_READ_SEARCH", "SYS_PTRACE"]
    assert context.get("appArmorProfile", {}).get("type") != "Unconfined"
    namespace = one("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {d["metadata"].get("namespace") for n, d in all_documents()
            if n not in EXAMPLES and d["kind"] not in ("Namespace", "PriorityClass")} == \
        {namespace["metadata"]["name"]}


def test_guaranteed_qos_priority_that_never_preempts_and_a_clean_stop():
    spec = pod_spec()
    resources = agent_container()["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    assert set(resources["limits"]) == {"cpu", "memory"}
    priority = one("PriorityClass")
    assert spec["priorityClassName"] == priority["metadata"]["name"]
    assert priority["preemptionPolicy"] == "Never"
    assert priority["value"] <= 1_000_000_000  # user-definable range
    assert 10 <= spec["terminationGracePeriodSeconds"] <= 60
    strategy = daemonset()["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxSurge"] == 0  # the node's port is held by the old pod


def test_image_is_the_package_version_and_keeps_its_entrypoint():
    container = agent_container()
    assert container["image"] == f"tpumon:{__version__}"
    assert "command" not in container  # the image's ENTRYPOINT, tpumon agent, runs


# --- the DaemonSet agrees with the agent ---------------------------------------------

def test_the_configmap_passes_tpumon_config_check(config_file: Path):
    result = subprocess.run([*TPUMON, "config", "check", str(config_file)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{config_file}: ok"


def test_container_args_are_agent_options_naming_the_mounted_config():
    args = agent_container()["args"]
    ctx = agent_command.make_context("agent", list(args))  # raises on an unknown option
    config_path = ctx.params["config_path"]
    volume, mount = volume_for_path(agent_container(), pod_spec(), config_path)
    assert volume["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    assert Path(config_path).relative_to(mount["mountPath"]).as_posix() in one("ConfigMap")["data"]


def test_every_environment_variable_is_a_real_setting(config_file: Path):
    env = resolved_env(agent_container())
    known = {k.env_var for k in SCHEMA}
    tpumon_vars = {name for name in env if name.startswith("TPUMON_")}
    assert tpumon_vars and tpumon_vars <= known
    config = load_config(config_file, env=env)  # raises on a bad key or value
    assert config["identity.hostname"] == NODE_NAME
    assert config.origins["identity.hostname"] == "environment TPUMON_IDENTITY_HOSTNAME"
    assert all(config.origins[k].startswith("config file") for k in (
        "exporter.listen_address", "runtime.ports", "store.state_dir", "reporter.socket"))


def test_container_port_is_where_the_agent_listens(config_file: Path):
    config = load_config(config_file, env=resolved_env(agent_container()))
    host, port = parse_listen_address(config["exporter.listen_address"])
    assert host in ("", "0.0.0.0")  # probes and scrapes come to the pod (node) IP
    (container_port,) = agent_container()["ports"]
    assert container_port["name"] == "metrics"
    assert container_port["containerPort"] == port == DEFAULT_PORT
    assert container_port["hostPort"] == port  # hostNetwork: the node's port
    assert [p for p in dockerfile_instructions("EXPOSE")] == [str(port)]


def test_probes_ask_a_path_the_agent_serves():
    app = http_app(CollectorRegistry(), lambda: pytest.fail("probes must not need a snapshot"))
    container = agent_container()
    probes = [container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    for probe in probes:
        assert probe["httpGet"]["port"] == "metrics"
        statuses = []
        body = b"".join(app({"PATH_INFO": probe["httpGet"]["path"], "REQUEST_METHOD": "GET"},
                            lambda status, headers, *, into=statuses: into.append(status)))
        assert statuses == ["200 OK"], (probe["httpGet"]["path"], body)


def test_the_writable_paths_are_volumes_and_persist_on_the_host(config_file: Path):
    config = load_config(config_file, env=resolved_env(agent_container()))
    container, spec = agent_container(), pod_spec()
    for path, host_path in ((config["store.state_dir"], "/var/lib/tpumon"),
                            (str(Path(config["reporter.socket"]).parent), "/run/tpumon")):
        volume, mount = volume_for_path(container, spec, path)
        assert volume["hostPath"] == {"path": host_path, "type": "DirectoryOrCreate"}
        assert mount["mountPath"] == path and not mount.get("readOnly", False)
    volume, _ = volume_for_path(container, spec, "/tmp/sqlite-temp")  # SQLite's temp files
    assert "emptyDir" in volume


def test_the_optional_secret_gives_the_files_the_agent_reads(tmp_path: Path,
                                                        config_file: Path):
    env = resolved_env(agent_container())
    volume, mount = volume_for_path(agent_container(), pod_spec(), env["CREDENTIALS_DIRECTORY"])
    assert mount["mountPath"] == env["CREDENTIALS_DIRECTORY"] and mount["readOnly"]
    assert volume["secret"]["optional"] is True
    files = {item["path"] for item in volume["secret"]["items"]}
    assert files == {"slack-webhook-url", "pagerduty-routing-key"}
    config = load_config(config_file, env=env)

    # No Secret (or an empty one): the volume is empty and the agent starts without
    # notifications, where a *_file key naming a missing file would stop it.
    env["CREDENTIALS_DIRECTORY"] = str(tmp_path)
    assert notification_channels(config, env) == []
    # The Secret with both keys: Slack and PagerDuty.
    (tmp_path / "slack-webhook-url").write_text("https://hooks.slack.com/services/T/B/X\n")
    (tmp_path / "pagerduty-routing-key").write_text("R0UT1NGKEY\n")
    assert sorted(c.name for c in notification_channels(config, env)) == ["pagerduty", "slack"]


@pytest.mark.e2e
def test_the_agent_runs_as_the_daemonset_runs_it(tmp_path: Path, config_file: Path):
    """The container's args and environment with the ConfigMap's file; only the host
    paths and the port move into tmp_path. Ready on the probe path, the node name as host
    label, and stopped by SIGTERM well inside the grace period."""
    container = agent_container()
    config_path = agent_command.make_context("agent", list(container["args"])).params["config_path"]
    args = [str(config_file) if a == config_path else a for a in container["args"]]
    credentials = tmp_path / "secrets"
    credentials.mkdir()
    env = clean_env()
    env.update(resolved_env(container))
    env.update(CREDENTIALS_DIRECTORY=str(credentials),
               TPUMON_STORE_STATE_DIR=str(tmp_path / "state"),
               TPUMON_REPORTER_SOCKET=str(tmp_path / "run" / "reporter.sock"),
               TPUMON_EXPORTER_LISTEN_ADDRESS="127.0.0.1:0",
               TPUMON_IDENTITY_METADATA="off")
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*TPUMON, "agent", *args], stderr=log, env=env)
    try:
        url = wait_for(lambda: re.search(r"serving metrics on http://(\S+)/metrics",
                                         log_path.read_text()), timeout=30).group(1)
        probe = container["readinessProbe"]["httpGet"]["path"]
        with urllib.request.urlopen(f"http://{url}{probe}", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert f'host="{NODE_NAME}"' in metrics
        assert (tmp_path / "run" / "reporter.sock").is_socket()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=pod_spec()["terminationGracePeriodSeconds"]) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log_text = log_path.read_text()
    assert "Error" not in log_text and "Traceback" not in log_text, log_text


# --- scraping ------------------------------------------------------------------------

def pod_labels() -> dict[str, str]:
    return daemonset()["spec"]["template"]["metadata"]["labels"]


def test_selectors_match_the_agent_pods():
    labels = pod_labels()
    for selector in (daemonset()["spec"]["selector"]["matchLabels"],
                     one("Service")["spec"]["selector"],
                     one("PodMonitor")["spec"]["selector"]["matchLabels"],
                     one("PodMonitoring")["spec"]["selector"]["matchLabels"]):
        assert selector and selector.items() <= labels.items()
    namespace = daemonset()["metadata"]["namespace"]
    assert one("PodMonitor")["spec"]["namespaceSelector"]["matchNames"] == [namespace]
    assert one("PodMonitoring")["metadata"]["namespace"] == namespace


def test_scrapes_use_the_metrics_port_every_15s():
    service = one("Service")
    assert service["spec"]["clusterIP"] == "None"
    (port,) = service["spec"]["ports"]
    assert port["name"] == port["targetPort"] == "metrics" and port["port"] == DEFAULT_PORT
    (pm,) = one("PodMonitor")["spec"]["podMetricsEndpoints"]
    (gmp,) = one("PodMonitoring")["spec"]["endpoints"]
    for endpoint in (pm, gmp):
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
        assert endpoint["interval"] == "15s"
    assert agent_container()["ports"][0]["name"] == "metrics"


def test_the_job_label_is_the_one_the_alert_rules_expect():
    rules = RULES.read_text()
    assert 'up{job="tpumon"}' in rules
    # Prometheus Operator: job = the value of the pod label named by jobLabel.
    assert pod_labels()[one("PodMonitor")["spec"]["jobLabel"]] == "tpumon"
    # Managed Prometheus: job = the PodMonitoring's name.
    assert one("PodMonitoring")["metadata"]["name"] == "tpumon"


# --- training pods share the socket --------------------------------------------------

def test_training_pods_reach_the_agent_socket(config_file: Path, monkeypatch):
    config = load_config(config_file, env=resolved_env(agent_container()))
    spec = training_pod_spec()
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    monkeypatch.setenv("TPUMON_REPORTER_SOCKET", env["TPUMON_REPORTER_SOCKET"])
    assert socket_path() == config["reporter.socket"]  # where tpumon.instrument sends
    volume, mount = volume_for_path(container, spec, config["reporter.socket"])
    agent_volume, agent_mount = volume_for_path(agent_container(), pod_spec(),
                                                config["reporter.socket"])
    assert volume["hostPath"] == agent_volume["hostPath"]
    assert mount["mountPath"] == agent_mount["mountPath"]
    assert mount["readOnly"] is True  # sending to a socket needs no write to the directory
    # libtpu in the job serves on the node's loopback, on ports the agent polls.
    assert spec["hostNetwork"] is True
    job_ports = {int(p) for p in env["TPU_RUNTIME_METRICS_PORTS"].split(",")}
    assert job_ports <= set(config["runtime.ports"])
    assert config["runtime.address"] == "localhost"
    assert container["resources"]["limits"]["google.com/tpu"] > 0  # the job owns the chips


# --- Dockerfile ----------------------------------------------------------------------

def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuations joined, global
    ARG defaults substituted into FROM."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction, rest = instruction.upper(), " ".join(rest.split())
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
            continue
        if instruction == "FROM":
            rest = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest)
            stages.append([])
        stages[-1].append((instruction, rest))
    return stages


def dockerfile_instructions(name: str, stage: int = -1) -> list[str]:
    return [rest for instruction, rest in dockerfile_stages()[stage] if instruction == name]


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as Docker reads it: '*' within one path element, '**' across
    elements, matched against a path or any of its parents."""
    out, i, pattern = "", 0, pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def docker_ignores(path: str) -> bool:
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in dockerignore_patterns():
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern[1:] if negated else pattern)
        if any(regex.match(c) for c in candidates):
            ignored = not negated
    return ignored


def build_context() -> list[str]:
    """Every file of the repository that `docker build .` sends (Docker's rules, including
    directories re-included by a '!' pattern)."""
    negations = [p[1:].strip("/") for p in dockerignore_patterns() if p.startswith("!")]
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = Path(dirpath).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirnames[:] = [d for d in dirnames if not docker_ignores(prefix + d)
                       or any(n == prefix + d or n.startswith(prefix + d + "/")
                              for n in negations)]
        files += [prefix + f for f in filenames if not docker_ignores(prefix + f)]
    return sorted(files)


def test_dockerfile_builds_in_two_stages_from_python_slim():
    stages = dockerfile_stages()
    assert len(stages) == 2
    assert stages[0][0] == ("FROM", "python:3.11-slim AS build")
    assert stages[1][0] == ("FROM", "python:3.11-slim")  # the venv's python is the base's
    build_runs = " ".join(dockerfile_instructions("RUN", 0))
    assert "pip wheel --no-deps" in build_runs and "python -m venv /opt/tpumon" in build_runs
    assert dockerfile_instructions("COPY", 1) == ["--from=build /opt/tpumon /opt/tpumon"]


def test_dockerfile_runs_the_agent_unprivileged_by_default():
    (user,) = dockerfile_instructions("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    (entrypoint,) = dockerfile_instructions("ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == ["tpumon", "agent"]  # exec form
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "tpumon" in scripts
    env = " ".join(dockerfile_instructions("ENV"))
    assert "PATH=/opt/tpumon/bin:$PATH" in env
    assert not any(re.search(r"\[|pytest|pip install -e", run)
                   for stage in range(2) for run in dockerfile_instructions("RUN", stage))


def test_dockerignore_keeps_the_context_to_the_package():
    context = build_context()
    for path in ("pyproject.toml", "README.md", "tpumon/__init__.py", "tpumon/cli/agent.py",
                 "tpumon/web/http.py"):
        assert path in context
    for path in (".venv/bin/python", ".venv-frameworks/x", ".git/HEAD", "tests/test_cli.py",
                 ".demo-state/history.db", "tpumon/__pycache__/agent.cpython-311.pyc",
                 "tpumon.egg-info/PKG-INFO", "Dockerfile", "deploy/kubernetes/daemonset.yaml"):
        assert docker_ignores(path), path
    assert not any(p.startswith((".git/", ".venv", "tests/", ".demo-state")) for p in context)


def test_every_copy_source_is_in_the_build_context():
    context = build_context()
    for stage in range(2):
        for copy_args in dockerfile_instructions("COPY", stage):
            if copy_args.startswith("--from="):
                continue
            *sources, _ = copy_args.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                prefix = source.rstrip("/")
                assert any(p == prefix or p.startswith(prefix + "/") for p in context), source


@pytest.mark.e2e
def test_the_build_step_makes_a_wheel_without_test_dependencies(tmp_path: Path):
    """The build stage's `pip wheel --no-deps .` on a copy of the build context."""
    src = tmp_path / "context"
    for rel in build_context():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                             "--disable-pip-version-check", "--wheel-dir", str(out), str(src)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("tpumon-*.whl")
    assert wheel.name.startswith(f"tpumon-{__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    assert "tpumon/cli/agent.py" in names and "tpumon/web/http.py" in names
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)
    assert re.search(r"^tpumon = tpumon\.cli:main$", entry_points, re.M)
    runtime = [line for line in metadata.splitlines()
               if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert runtime and not any(re.search(r"pytest|hypothesis|scipy|kubernetes-validate|promql",
                                         line, re.I) for line in runtime)


def test_configuration_keys_named_in_the_manifests_and_readme_exist():
    """A renamed key must not leave stale instructions behind in comments or the README."""
    text = "\n".join(p.read_text() for p in [*manifest_files(), K8S / "README.md"])
    sections = "|".join(sorted({k.section for k in SCHEMA}))
    named = {m.group(0) for m in re.finditer(rf"(?<![\w./-])(?:{sections})\.[a-z_]+\b", text)
             if not re.search(r"\.(py|ya?ml|toml|md|sock|db)$", m.group(0))}
    assert named and named <= set(KEYS), named - set(KEYS)


def test_tpumon_cli_knows_the_commands_the_readme_gives():
    readme = (K8S / "README.md").read_text()
    commands = set(re.findall(r"-- tpumon ([a-z]+)", readme))
    assert commands
    runner = CliRunner()
    for command in sorted(commands):
        result = runner.invoke(tpumon_cli, [command, "--help"])
        assert result.exit_code == 0, command
