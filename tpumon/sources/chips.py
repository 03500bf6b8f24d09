"""Which TPU chips this VM has (tpu_info.device) and which processes own them.

Reads /sys and /proc only: the agent never opens a TPU device, because only one process
can own a chip and it must be the training job.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Callable

from tpu_info import device as tpu_device

log = logging.getLogger("tpumon.sources.chips")

# Chip names as tpu_info.device.TpuChip spells them, for chips we simulate or configure.
CHIP_TYPES = {chip.value.name: chip for chip in tpu_device.TpuChip}


@dataclass(frozen=True, slots=True)
class ChipInventory:
    """The chips the runtime should report: type, how many, HBM per device (spec value).

    ``chip_type`` is None off TPU VMs (e.g. under the simulator before it says otherwise);
    then the expected chips are whatever the runtime has reported so far.
    """

    chip_type: str | None
    count: int
    devices_per_chip: int = 1
    hbm_bytes_per_device: int | None = None

    @property
    def devices(self) -> list[str]:
        """Names of the HBM-owning devices the runtime reports, one per device id."""
        return [str(i) for i in range(self.count * self.devices_per_chip)]


def inventory_for(chip_type: str, count: int) -> ChipInventory:
    """The inventory of ``count`` chips of a named type ('v4', 'v5e', ...)."""
    info = CHIP_TYPES[chip_type].value
    per_device = info.hbm_gib * 2**30 // info.devices_per_chip
    return ChipInventory(info.name, count, info.devices_per_chip, per_device)


def detect_chips() -> ChipInventory:
    """Chip type and count from PCI ids in /sys; an empty inventory where there are none."""
    try:
        chip, count = tpu_device.get_local_chips()
    except (OSError, AssertionError, ValueError) as exc:
        log.warning("cannot read TPU chips from /sys/bus/pci: %s", exc)
        return ChipInventory(None, 0)
    if chip is None:
        return ChipInventory(None, 0)
    return inventory_for(chip.value.name, count)


def _vfio_chip_index() -> dict[str, int]:
    """/dev/vfio/<iommu group> -> chip index, in tpu-info's own chip order."""
    return {core.vfio_path: index
            for index, chip in enumerate(tpu_device.get_chips())
            for core in chip.cores.values()}


TPU_DEVICE = re.compile(r"/dev/(accel\d+|vfio/\d+)")


def device_owners(pattern: re.Pattern[str] = TPU_DEVICE, proc: str = "/proc") -> dict[str, int]:
    """Device path -> PID of a process holding it open, from /proc/PID/fd links.

    tpu-info's get_chip_owners does the same walk but gives up on the first process whose
    fd table it may not read (PID 1 in a container, or any process under AppArmor), so
    one unreadable process hid every owner. Here such a process is skipped.
    """
    found: dict[str, int] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with os.scandir(f"{entry.path}/fd") as fds:
                for fd in fds:
                    try:
                        target = os.readlink(fd.path)
                    except OSError:  # that file was closed meanwhile: the others count
                        continue
                    if pattern.fullmatch(target):
                        found[target] = int(entry.name)
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def scan_chip_owners(owners: Callable[[], dict[str, int]] = device_owners) -> dict[str, int]:
    """Chip index (as a string) -> PID of the process holding its device file open.

    Only processes whose /proc/PID/fd we may read are seen: as root, all of them; as
    another user, only that user's. An unreadable /proc is an empty answer, not an error.
    """
    try:
        by_path = owners()
        vfio = _vfio_chip_index() if any("/vfio/" in p for p in by_path) else {}
    except (OSError, RuntimeError) as exc:
        log.debug("chip owner scan failed: %s", exc)
        return {}
    result: dict[str, int] = {}
    for path, pid in by_path.items():
        accel = re.fullmatch(r"/dev/accel(\d+)", path)
        index = int(accel.group(1)) if accel else vfio.get(path)
        if index is not None:
            result[str(index)] = pid
    return result

