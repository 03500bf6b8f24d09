"""Kubernetes labels from the kubelet's pod-resources API: the device-id mapping, the
labels on the exposition, and the real agent against a real gRPC server built from
tpumon's api.proto subset on a unix socket (as the kubelet serves it)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily

from tools import AgentProcess, require_tool, wait_for
from tpumon.metrics.pod_labels import with_pod_labels
from tpumon.podresources import api_pb2 as pb
from tpumon.sources.chips import ChipInventory, inventory_for
from tpumon.sources.health import SourceTracker
from tpumon.sources.pod_resources import (ChipPod, PodResourcesSource, chip_names,
                                          open_pod_resources)
from tpumon.agent.bootstrap import pod_resources_settings
from tpumon.common.config import load_config

V4 = inventory_for("v4", 4)


class Kubelet:
    """The kubelet's PodResourcesLister on a unix socket, answering from ``pods``:
    {(namespace, pod): {container: [device ids]}}; ``allocatable`` None: UNIMPLEMENTED."""

    def __init__(self, path: Path, allocatable: list[str] | None = None) -> None:
        self.path = path
        self.pods: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.allocatable = allocatable
        self.lists = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, pb.ListPodResourcesRequest.FromString,
                pb.ListPodResourcesResponse.SerializeToString),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._allocatable, pb.AllocatableResourcesRequest.FromString,
                pb.AllocatableResourcesResponse.SerializeToString),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),))
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def set_pods(self, pods: dict[tuple[str, str], dict[str, list[str]]]) -> None:
        with self._lock:
            self.pods = pods

    def _list(self, request: pb.ListPodResourcesRequest, context) -> pb.ListPodResourcesResponse:
        with self._lock:
            self.lists += 1
            return pb.ListPodResourcesResponse(pod_resources=[
                pb.PodResources(name=pod, namespace=ns, containers=[
                    pb.ContainerResources(name=c, devices=[
                        pb.ContainerDevices(resource_name="google.com/tpu", device_ids=ids),
                        pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["0"])])
                    for c, ids in containers.items()])
                for (ns, pod), containers in self.pods.items()])

    def _allocatable(self, request, context) -> pb.AllocatableResourcesResponse:
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "feature gate off")
        return pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name="google.com/tpu", device_ids=self.allocatable)])

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture
def kubelet(tmp_path):
    started: list[Kubelet] = []

    def start(allocatable: list[str] | None = None) -> Kubelet:
        k = Kubelet(tmp_path / "kubelet.sock", allocatable)
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()


@pytest.mark.parametrize("device_id", ["2", "accel2", "/dev/accel2"])
def test_device_ids_name_the_chip_by_its_index(device_id):
    assert chip_names(device_id, V4, vfio_index=dict) == ["2"]


def test_vfio_ids_map_through_the_iommu_group_order_and_unknown_ids_map_nowhere():
    vfio = {"/dev/vfio/17": 0, "/dev/vfio/9": 1}
    assert chip_names("vfio/9", V4, lambda: vfio) == ["1"]
    assert chip_names("/dev/vfio/17", V4, lambda: vfio) == ["0"]
    assert chip_names("vfio/3", V4, lambda: vfio) == []  # a group /sys does not have
    assert chip_names("4", V4, dict) == []  # this VM has chips 0-3
    assert chip_names("GPU-1592a165", V4, dict) == []
    assert chip_names("7", ChipInventory(None, 0), dict) == ["7"]  # chips unknown: trusted


def test_a_chip_of_two_devices_labels_both():
    v3 = inventory_for("v3", 4)
    assert v3.devices_per_chip == 2
    assert chip_names("1", v3, dict) == ["2", "3"]


def test_labels_join_only_samples_of_known_chips_and_leave_other_families_alone():
    used = GaugeMetricFamily("tpumon_hbm_used_bytes", "x", labels=["host", "chip"])
    used.add_metric(["h", "0"], 1.0)
    used.add_metric(["h", "1"], 2.0)
    other = GaugeMetricFamily("tpumon_polls", "x", labels=["host"])
    other.add_metric(["h"], 3.0)
    labels = {"0": ChipPod("accel0", "train-0", "ml", "trainer").labels(),
              "1": ChipPod("accel1").labels()}
    out = with_pod_labels(used, labels)
    assert [s.labels for s in out.samples] == [
        {"host": "h", "chip": "0", "accelerator_id": "accel0", "pod": "train-0",
         "namespace": "ml", "container": "trainer"},
        {"host": "h", "chip": "1", "accelerator_id": "accel1"}]
    assert with_pod_labels(other, labels) is other


def test_the_source_asks_the_kubelet_and_skips_other_resources(kubelet, tmp_path):
    k = kubelet(allocatable=["0", "1", "2", "3", "9"])
    k.set_pods({("ml", "train-0"): {"trainer": ["0", "1"], "sidecar": []}})
    answer = PodResourcesSource(str(k.path), V4, 2.0, vfio_index=dict).poll()
    assert answer.chips == {"0": ChipPod("0", "train-0", "ml", "trainer"),
                            "1": ChipPod("1", "train-0", "ml", "trainer"),
                            "2": ChipPod("2"), "3": ChipPod("3")}
    assert answer.unmapped_ids == ("9",)


def test_an_older_kubelet_without_allocatable_still_labels_the_held_chips(kubelet):
    k = kubelet(allocatable=None)
    k.set_pods({("ml", "train-0"): {"trainer": ["3"]}})
    source = PodResourcesSource(str(k.path), V4, 2.0, vfio_index=dict)
    assert source.poll().chips == {"3": ChipPod("3", "train-0", "ml", "trainer")}
    assert source.poll().chips == {"3": ChipPod("3", "train-0", "ml", "trainer")}


def test_a_missing_socket_is_a_down_state_and_the_tracker_asks_at_its_own_cadence(kubelet):
    k = kubelet(allocatable=["0"])
    source = PodResourcesSource(str(k.path), V4, 2.0, vfio_index=dict)
    tracker = SourceTracker("pod_resources", source.poll, min_interval=0.3)
    assert tracker.poll() is not None and tracker.health.up
    assert tracker.poll() is not None and k.lists == 1  # within the interval: not asked
    k.stop()
    k.path.unlink(missing_ok=True)  # (grpc removes it on stop)
    time.sleep(0.35)
    assert tracker.poll() is None
    assert not tracker.health.up and "no kubelet pod-resources socket" in tracker.health.error
    assert (tracker.health.polls_total, tracker.health.errors_total) == (2, 1)


def test_auto_makes_no_source_without_the_socket_and_simulate_needs_it_set(tmp_path):
    absent = str(tmp_path / "none.sock")
    config = load_config(None, env={"TPUMON_KUBERNETES_POD_RESOURCES_SOCKET": absent})
    assert open_pod_resources(pod_resources_settings(config), False, V4) is None
    on = load_config(None, env={"TPUMON_KUBERNETES_POD_RESOURCES_SOCKET": absent,
                                "TPUMON_KUBERNETES_POD_RESOURCES": "on"})
    tracker = open_pod_resources(pod_resources_settings(on), False, V4)
    assert tracker is not None and tracker.poll() is None and not tracker.health.up
    assert open_pod_resources(pod_resources_settings(load_config(None, env={})), True,
                              V4) is None


def _scrape_hbm(agent: AgentProcess) -> dict[str, dict[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(agent.get("/metrics")):
        if family.name == "tpumon_hbm_used_bytes":
            return {s.labels["chip"]: s.labels for s in family.samples}
    return {}


@pytest.mark.e2e
def test_the_agent_labels_chips_with_their_pods_and_follows_changes(kubelet, tmp_path):
    k = kubelet(allocatable=["0", "1", "2", "3"])
    k.set_pods({("ml", "train-0"): {"trainer": ["0", "1"]}})
    agent = AgentProcess(tmp_path, None, env={
        "TPUMON_KUBERNETES_POD_RESOURCES_SOCKET": str(k.path),
        "TPUMON_KUBERNETES_POD_RESOURCES_INTERVAL": "1"})
    try:
        chips = wait_for(lambda: (c := _scrape_hbm(agent)) and "pod" in c.get("0", {}) and c,
                         timeout=30)
        assert {n: chips["0"][n] for n in ("accelerator_id", "pod", "namespace", "container")} \
            == {"accelerator_id": "0", "pod": "train-0", "namespace": "ml",
                "container": "trainer"}
        assert chips["2"]["accelerator_id"] == "2" and "pod" not in chips["2"]
        assert agent.value("tpumon_source_up", source="pod_resources") == 1
        k.set_pods({("ml", "train-1"): {"trainer": ["2"]}})  # the job moved
        wait_for(lambda: _scrape_hbm(agent).get("2", {}).get("pod") == "train-1", timeout=30)
        assert "pod" not in _scrape_hbm(agent)["0"]
        # the kubelet goes away (a restart): a reported state, the last labels stand
        k.stop()
        k.path.unlink(missing_ok=True)  # (grpc removes it on stop)
        wait_for(lambda: agent.value("tpumon_source_up", source="pod_resources") == 0,
                 timeout=30)
        assert _scrape_hbm(agent)["2"]["pod"] == "train-1"
        assert agent.proc.poll() is None
    finally:
        assert agent.stop() == 0


def test_labels_reach_the_exposition_and_are_absent_off_kubernetes():
    from prometheus_client.parser import text_string_to_metric_families

    from tpumon.metrics.collectors import build_registry
    from tpumon.common.identity import Identity
    from tpumon.common.samples import ChipSample, RuntimeReading
    from tpumon.sources.pod_resources import PodAssignment
    from tpumon.state import PollState

    reading = RuntimeReading(time=1.0, chips={"0": ChipSample("0", 5, 10, None, 0, 8431)})

    def used_labels(pods: PodAssignment | None) -> dict[str, str]:
        snap = PollState(1.0, Identity("h"), V4, runtime=reading, chip_pods=pods)
        text = generate_latest(build_registry(lambda: snap)).decode()
        checked = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text,
                                 text=True, capture_output=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        family = next(f for f in text_string_to_metric_families(text)
                      if f.name == "tpumon_hbm_used_bytes")
        return family.samples[0].labels

    labelled = used_labels(PodAssignment({"0": ChipPod("accel0", "p", "n", "c")}))
    assert {k: labelled[k] for k in ("chip", "accelerator_id", "pod", "namespace",
                                     "container")} == {
        "chip": "0", "accelerator_id": "accel0", "pod": "p", "namespace": "n",
        "container": "c"}
    assert set(used_labels(None)) == {"host", "worker", "accelerator_type", "slice", "chip"}


def test_the_daemonset_mounts_the_configured_socket_read_only():
    import yaml

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    root = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
    config = yaml.safe_load((root / "configmap.yaml").read_text())["data"]["config.toml"]
    socket = tomllib.loads(config)["kubernetes"]["pod_resources_socket"]
    docs = [d for d in yaml.safe_load_all((root / "daemonset.yaml").read_text()) if d]
    spec = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    [mount] = [m for m in spec["containers"][0]["volumeMounts"]
               if socket.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == mount["mountPath"]  # the node's own directory
