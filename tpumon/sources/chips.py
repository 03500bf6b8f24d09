"""Which TPU chips this VM has (tpu_info.device) and which processes own them.

Reads /sys and /proc only: the agent never opens a TPU device, because only one process
can own a chip and it must be the training job.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import stat
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

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


#: Where the chips' device files are: accelN (one per chip) and vfio/N (an IOMMU group).
DEVICE_DIR = "/dev"

#: What makes an open file one of the agent's devices (see :func:`file_identity`).
FileId = tuple[int, ...]


def file_identity(st: os.stat_result) -> FileId:
    """A file's identity, whatever path or mount namespace it was opened through: for a
    character device its device number (``st_rdev``), which an unprivileged user cannot
    forge (mknod of a device needs CAP_MKNOD in the host's user namespace, and a tmpfs
    file named accel0 is a regular file); for anything else (a test's stand-in device) the
    file itself, (``st_dev``, ``st_ino``). The link's text is no identity: inside
    ``unshare -Urm`` any user can mount a tmpfs on /dev and open a file named accel0, and
    /proc/PID/fd then reads /dev/accel0."""
    if stat.S_ISCHR(st.st_mode):
        return (st.st_rdev,)
    return (st.st_dev, st.st_ino)


def device_files(directory: str = DEVICE_DIR) -> dict[FileId, str]:
    """The chips' device files as the agent itself sees them: identity -> path. Empty off
    a TPU VM, where no process can hold a chip (and no /proc walk is needed)."""
    found: dict[FileId, str] = {}
    for path in sorted(glob.glob(os.path.join(directory, "accel[0-9]*")) +
                       glob.glob(os.path.join(directory, "vfio", "[0-9]*"))):
        try:
            found.setdefault(file_identity(os.stat(path)), path)
        except OSError:  # removed meanwhile
            continue
    return found


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22): with
    the pid, a process's identity for its whole life (a pid is reused, this pair is not).
    None when it has gone or cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            text = f.read()
        return int(text[text.rindex(b")") + 2:].split()[19])  # the name may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def device_holders(devices: Mapping[FileId, str],
                   proc: str = "/proc") -> dict[str, list[int]]:
    """Device path -> every PID holding that very file open, from stat() of each
    /proc/PID/fd/N (the open file itself, not the text of its link).

    tpu-info's get_chip_owners reads link texts, and gives up on the first process whose
    fd table it may not read (PID 1 in a container, or any process under AppArmor), so
    one unreadable process hid every owner. Here such a process is skipped.
    """
    found: dict[str, list[int]] = {}
    if not devices:
        return found
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with os.scandir(f"{entry.path}/fd") as fds:
                for fd in fds:
                    try:
                        path = devices.get(file_identity(os.stat(fd.path)))
                    except OSError:  # that file was closed meanwhile: the others count
                        continue
                    if path is not None and int(entry.name) not in found.get(path, ()):
                        found.setdefault(path, []).append(int(entry.name))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def first_holder(pids: Sequence[int], proc: str = "/proc") -> int:
    """Of the processes holding one device, the one that started first: a child forked
    with the device open, or a later process that opened it too, never takes a chip from
    the holder that had it (ties, and unreadable start times, by pid)."""
    return min(pids, key=lambda pid: (start_time(pid, proc) or math.inf, pid))


def device_owners(devices: Mapping[FileId, str] | None = None,
                  proc: str = "/proc") -> dict[str, int]:
    """Device path -> PID of the process holding it open (the first started, where
    several do; :func:`first_holder`). ``devices``: the agent's own device files
    (:func:`device_files` of /dev when None)."""
    holders = device_holders(device_files() if devices is None else devices, proc)
    return {path: first_holder(pids, proc) for path, pids in holders.items()}


class ChipOwnerScan:
    """:func:`scan_chip_owners` of the device files in ``directory``, saying (once per
    change) when a chip is held by more than one process, and which one it was given to."""

    def __init__(self, directory: str = DEVICE_DIR, proc: str = "/proc") -> None:
        self._directory = directory
        self._proc = proc
        self._shared: dict[str, list[int]] = {}

    def __call__(self) -> dict[str, int]:
        return scan_chip_owners(self._owners)  # which catches a failed walk

    def _owners(self) -> dict[str, int]:
        """Device path -> its first holder's PID (:func:`device_owners`), logged."""
        holders = device_holders(device_files(self._directory), self._proc)
        shared = {path: sorted(pids) for path, pids in holders.items() if len(pids) > 1}
        owners = {path: first_holder(pids, self._proc) for path, pids in holders.items()}
        for path, pids in sorted(shared.items()):
            if self._shared.get(path) != pids:
                log.warning("%s is held by pids %s: its chip stays with pid %d, which "
                            "started first", path, ", ".join(map(str, pids)), owners[path])
        self._shared = shared
        return owners


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
        accel = re.fullmatch(r"accel(\d+)", os.path.basename(path))
        index = int(accel.group(1)) if accel else vfio.get(path)
        if index is not None:
            result[str(index)] = pid
    return result
