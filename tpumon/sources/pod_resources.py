"""Which pod and container each TPU chip is allocated to, from the kubelet's pod-resources API.

On GKE the TPU device plugin hands chips (resource ``google.com/tpu``) to containers, and
the kubelet tells who holds which device over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``, service ``v1.PodResourcesLister``).
With it, every per-chip series carries ``accelerator_id``, ``pod``, ``namespace`` and
``container``, the labels the device plugin's own metrics and kube-state-metrics carry, so
the three join (docs/metrics.md, "Kubernetes labels").

Device ids to chips: the kubelet gives the device plugin's own ids, which are not
published for the TPU plugin. Every spelling a plugin could reasonably use for a chip is
read: ``0``, ``accel0``, ``/dev/accel0`` (the chip index, as ``/dev/accelN``) and
``vfio/0``, ``/dev/vfio/0`` (an IOMMU group: the chip tpu-info orders there, as the
chip-owner scan does). An id that is none of these is counted (``unmapped_ids``) and
labels nothing, rather than being guessed onto a chip. ``accelerator_id`` is the device id
as the kubelet gives it, which is what the device plugin labels its metrics with.

Pods change rarely: the agent asks every ``kubernetes.pod_resources_interval`` seconds,
not every poll (:class:`~tpumon.sources.health.SourceTracker`'s ``min_interval``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from google.protobuf.message import Message

from tpumon.podresources import api_pb2 as pb
from tpumon.sources.chips import ChipInventory, _vfio_chip_index
from tpumon.sources.grpc_unary import CallFailed, Endpoint, UnaryClient
from tpumon.sources.health import SourceTracker, SourceUnavailable

log = logging.getLogger("tpumon.sources.pod_resources")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
TPU_RESOURCE = "google.com/tpu"
LIST_METHOD = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD = "/v1.PodResourcesLister/GetAllocatableResources"
POD_LABELS = ("accelerator_id", "pod", "namespace", "container")
MAX_REPLY_BYTES = 16 * 2**20  # a node with hundreds of pods answers in well under 1 MiB

_INDEX_ID = re.compile(r"(?:/dev/)?(?:accel)?(\d+)")
_VFIO_ID = re.compile(r"(?:/dev/)?vfio/(\d+)")
Reply = TypeVar("Reply", bound=Message)


@dataclass(frozen=True, slots=True)
class ChipPod:
    """A chip's Kubernetes labels: its device id, and the container it is allocated to
    (empty strings for a chip no container holds)."""

    accelerator_id: str
    pod: str = ""
    namespace: str = ""
    container: str = ""

    def labels(self) -> dict[str, str]:
        """The non-empty labels (Prometheus reads an empty label as an absent one)."""
        return {name: value for name in POD_LABELS if (value := getattr(self, name))}


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """One poll's answer: chip name -> its labels, and the device ids no chip matched."""

    chips: Mapping[str, ChipPod]
    unmapped_ids: tuple[str, ...] = ()


def vfio_chip_index() -> dict[str, int]:
    """/dev/vfio/<group> -> chip index in tpu-info's order; {} where /sys has no chips."""
    try:
        return _vfio_chip_index()
    except (OSError, RuntimeError, AssertionError, ValueError) as exc:
        log.debug("no vfio chip index: %s", exc)
        return {}


def chip_names(device_id: str, inventory: ChipInventory,
               vfio_index: Callable[[], Mapping[str, int]] = vfio_chip_index) -> list[str]:
    """The tpumon chip names (HBM device names) a device-plugin id stands for; [] when the
    id is none of the spellings in the module docstring or names a chip this VM lacks."""
    index: int | None = None
    if match := _INDEX_ID.fullmatch(device_id):
        index = int(match.group(1))
    elif match := _VFIO_ID.fullmatch(device_id):
        index = vfio_index().get(f"/dev/vfio/{match.group(1)}")
    if index is None or (inventory.count and index >= inventory.count):
        return []
    per_chip = inventory.devices_per_chip
    return [str(index * per_chip + k) for k in range(per_chip)]


class PodResourcesSource:
    """Asks the kubelet which container holds each TPU chip; a missing socket or an
    unanswering kubelet raises :class:`SourceUnavailable` (a reported state)."""

    def __init__(self, socket_path: str, inventory: ChipInventory, timeout: float,
                 resource_name: str = TPU_RESOURCE,
                 vfio_index: Callable[[], Mapping[str, int]] = vfio_chip_index) -> None:
        self.socket_path = socket_path
        self._inventory = inventory
        self._timeout = timeout
        self._resource = resource_name
        self._vfio_index = vfio_index
        self._client: UnaryClient | None = None
        self._allocatable_unimplemented = False
        self._unmapped: tuple[str, ...] = ()

    def poll(self) -> PodAssignment:
        if not os.path.exists(self.socket_path):
            self.close()  # the kubelet's next socket is a new file: dial it afresh
            raise SourceUnavailable(f"no kubelet pod-resources socket at {self.socket_path}")
        listed = self._call(LIST_METHOD, pb.ListPodResourcesRequest(),
                            pb.ListPodResourcesResponse)
        if listed is None:
            raise SourceUnavailable(f"kubelet pod-resources at {self.socket_path}: List "
                                    "not implemented")
        answer = self._assign(listed, self._allocatable_ids())
        if answer.unmapped_ids != self._unmapped:
            self._unmapped = answer.unmapped_ids
            if answer.unmapped_ids:
                log.warning("%s device id(s) %s name no chip of this VM: their pods' labels "
                            "are not exported (docs/metrics.md, Kubernetes labels)",
                            self._resource, ", ".join(answer.unmapped_ids))
        return answer

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _call(self, method: str, request: Message, reply: type[Reply]) -> Reply | None:
        """The kubelet's reply; None when it does not implement the method."""
        if self._client is None:
            self._client = UnaryClient(max_reply_bytes=MAX_REPLY_BYTES)
        try:
            return self._client.call(Endpoint(path=self.socket_path), method, request, reply,
                                     self._timeout)
        except CallFailed as exc:
            if exc.status == "UNIMPLEMENTED":
                return None
            raise SourceUnavailable(f"kubelet pod-resources at {self.socket_path}: "
                                    f"{exc.status}") from exc

    def _allocatable_ids(self) -> list[str]:
        """Every TPU device id of the node (GetAllocatableResources, kubelet >= 1.23), so
        that a chip no pod holds still carries its accelerator_id; [] from an older one."""
        if self._allocatable_unimplemented:
            return []
        answer = self._call(ALLOCATABLE_METHOD, pb.AllocatableResourcesRequest(),
                            pb.AllocatableResourcesResponse)
        if answer is None:  # an older kubelet, or its feature gate off: asked once
            self._allocatable_unimplemented = True
            return []
        return [i for d in answer.devices if d.resource_name == self._resource
                for i in d.device_ids]

    def _assign(self, listed: pb.ListPodResourcesResponse,
                allocatable: list[str]) -> PodAssignment:
        chips: dict[str, ChipPod] = {}
        unmapped: list[str] = []

        def place(device_id: str, pod: str = "", namespace: str = "",
                  container: str = "") -> None:
            names = chip_names(device_id, self._inventory, self._vfio_index)
            if not names and device_id not in unmapped:
                unmapped.append(device_id)
            for name in names:
                chips[name] = ChipPod(device_id, pod, namespace, container)

        for device_id in allocatable:
            place(device_id)
        for p in listed.pod_resources:
            for c in p.containers:
                for d in c.devices:
                    if d.resource_name == self._resource:
                        for device_id in d.device_ids:
                            place(device_id, p.name, p.namespace, c.name)
        return PodAssignment(chips, tuple(unmapped))


@dataclass(frozen=True)
class PodResourcesSettings:
    """``kubernetes.pod_resources`` (on, off, auto), its socket (and whether it was set, not
    defaulted), ``kubernetes.pod_resources_interval``, ``runtime.timeout`` and
    ``kubernetes.tpu_resource``: built from the configuration where the agent is assembled."""

    mode: str
    socket: str
    socket_set: bool
    interval: float
    timeout: float
    tpu_resource: str


def open_pod_resources(settings: PodResourcesSettings, simulate: bool,
                       inventory: ChipInventory) -> SourceTracker[PodAssignment] | None:
    """The pod-resources source ('auto': only where the kubelet's socket exists at start-up,
    so that a VM outside Kubernetes has no source forever down), polled every
    ``settings.interval``; None when off. Under --simulate only a socket set explicitly
    counts (a simulation is not a node)."""
    mode, path = settings.mode, settings.socket
    if simulate and not settings.socket_set:
        return None
    if mode == "off" or (mode == "auto" and not os.path.exists(path)):
        return None
    log.info("chips' pods from the kubelet's pod-resources API at %s, every %g s", path,
             settings.interval)
    source = PodResourcesSource(path, inventory, settings.timeout, settings.tpu_resource)
    return SourceTracker("pod_resources", source.poll, min_interval=settings.interval)
