"""The local sources: chip inventory and owners (/sys, /proc) and host memory (psutil)."""

import logging
import os
import subprocess
import sys
import threading
import time

from tpu_info import device as tpu_device

from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import Identity
from tpumon.agent.logs import JournalFormatter
from tpumon.sources import chips
from tpumon.sources.chips import ChipInventory, detect_chips, inventory_for, scan_chip_owners
from tpumon.sources.health import SourceTracker, SourceUnavailable
from tpumon.sources.host import HostSource
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from tpumon.state import AgentState
from tools import free_port, wait_for


def test_inventory_for_chip_types():
    v4 = inventory_for("v4", 4)
    assert (v4.chip_type, v4.devices, v4.hbm_bytes_per_device) == (
        "v4", ["0", "1", "2", "3"], 32 * 2**30)
    v3 = inventory_for("v3", 4)  # two TensorCores per chip, each with its own HBM
    assert v3.devices == [str(i) for i in range(8)] and v3.hbm_bytes_per_device == 8 * 2**30


def test_detect_chips_on_a_machine_without_tpus():
    inventory = detect_chips()
    assert inventory == ChipInventory(None, 0) or inventory.chip_type is not None


def test_owner_paths_map_to_chip_indexes(monkeypatch):
    assert scan_chip_owners(lambda: {"/dev/accel0": 100, "/dev/accel3": 101}) == {
        "0": 100, "3": 101}
    # vfio paths are IOMMU groups, not chip indexes: tpu-info's chip order decides
    fake_chips = [tpu_device.ChipInfo("0000:00:05",
                                      {0: tpu_device.CoreInfo(0, "0x0063", "/dev/vfio/12", "")}),
                  tpu_device.ChipInfo("0000:00:06",
                                      {0: tpu_device.CoreInfo(0, "0x0063", "/dev/vfio/7", "")})]
    monkeypatch.setattr(chips.tpu_device, "get_chips", lambda: fake_chips)
    assert scan_chip_owners(lambda: {"/dev/vfio/7": 55, "/dev/vfio/12": 44}) == {"1": 55, "0": 44}


def test_owner_scan_failure_is_an_empty_answer():
    def broken():
        raise PermissionError("no /proc for you")
    assert scan_chip_owners(broken) == {}


def test_real_owner_scan_finds_a_process_holding_a_device(tmp_path):
    """The walk over the real /proc (where some processes' fd tables are unreadable, like
    PID 1's in a container) finds a child holding a file open, when that file is what we
    look for; such a file is no chip."""
    device = tmp_path / "accel-like"
    device.touch()
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import time; f=open({str(device)!r}); time.sleep(30)"])
    try:
        devices = {chips.file_identity(os.stat(device)): str(device)}
        wait_for(lambda: chips.device_owners(devices).get(str(device)) == holder.pid, 10)
        assert holder.pid not in scan_chip_owners().values()
    finally:
        holder.kill()
        holder.wait()


def test_a_file_of_the_same_name_elsewhere_is_no_device(tmp_path):
    """A holder is found by the file it holds, not by its link's text: a process holding
    tmp_path/other/accel0 holds none of tmp_path/dev's files, whatever its name; the
    agent's own accel0 found through another path (a bind mount, a hard link) is."""
    dev, other = tmp_path / "dev", tmp_path / "other"
    dev.mkdir()
    other.mkdir()
    (dev / "accel0").touch()
    (other / "accel0").touch()
    os.link(dev / "accel0", other / "accel1")
    proc = tmp_path / "proc"
    for pid, target in {"50": other / "accel0", "51": other / "accel1"}.items():
        (proc / pid / "fd").mkdir(parents=True)
        os.symlink(target, proc / pid / "fd" / "3")
    scan = chips.ChipOwnerScan(str(dev), str(proc))
    assert scan() == {"0": 51}


def test_a_later_holder_never_takes_a_chip_from_the_first(tmp_path, caplog):
    """Two processes hold accel0 (a child forked with it open, or a second opener): the
    chip stays with the one that started first, and the log says so once."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "accel0").touch()
    proc = tmp_path / "proc"
    for pid, started in (("60", 900), ("61", 500), ("62", 700)):
        (proc / pid / "fd").mkdir(parents=True)
        os.symlink(dev / "accel0", proc / pid / "fd" / "3")
        (proc / pid / "stat").write_text(f"{pid} (py thon) S " + "0 " * 18 + f"{started} 0\n")
    scan = chips.ChipOwnerScan(str(dev), str(proc))
    with caplog.at_level(logging.WARNING, logger="tpumon.sources.chips"):
        assert scan() == {"0": 61} and scan() == {"0": 61}
    assert [r.getMessage() for r in caplog.records] == [
        f"{dev}/accel0 is held by pids 60, 61, 62: its chip stays with pid 61, which "
        "started first"]


def test_an_unreadable_proc_is_no_owner_and_no_error(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "accel0").touch()
    assert chips.ChipOwnerScan(str(tmp_path / "dev"), str(tmp_path / "no-proc"))() == {}


def test_an_unreadable_process_hides_no_other_owner(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "accel2").touch()
    (dev / "null").touch()
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "fd").write_text("not a directory: reading it fails")  # like EACCES
    (proc / "42" / "fd").mkdir(parents=True)
    os.symlink(dev / "accel2", proc / "42" / "fd" / "7")
    os.symlink(dev / "null", proc / "42" / "fd" / "0")
    (proc / "self").mkdir()
    assert chips.device_owners(chips.device_files(str(dev)), proc=str(proc)) == {
        f"{dev}/accel2": 42}


def test_host_source_reports_owner_rss_and_forgets_exited_pids():
    child = subprocess.Popen([sys.executable, "-c",
                              "import time; b=bytearray(64<<20); time.sleep(30)"])
    try:
        owners = {"0": os.getpid(), "1": os.getpid(), "2": child.pid}
        source = HostSource(lambda: owners)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            sample = source.poll()
            by_pid = {p.pid: p for p in sample.processes}
            if child.pid in by_pid and by_pid[child.pid].rss_bytes > 64 << 20:
                break
            time.sleep(0.1)
        assert by_pid[os.getpid()].chips == ("0", "1")
        assert by_pid[child.pid].rss_bytes > 64 << 20
        assert sample.memory_total_bytes >= sample.memory_available_bytes > 0
        assert sample.memory_used_bytes == sample.memory_total_bytes - sample.memory_available_bytes
        child.kill()
        child.wait()
        sample = source.poll()  # the owner vanished between scans: skipped, not an error
        assert [p.pid for p in sample.processes] == [os.getpid()]
    finally:
        if child.poll() is None:
            child.kill()


def test_host_source_reads_at_most_every_min_interval_unless_the_owners_change():
    owners = {"0": os.getpid()}
    source = HostSource(lambda: owners, min_interval=3600)
    first = source.poll()
    assert source.poll() is first  # within the interval: the last sample stands
    owners = {"0": os.getpid(), "1": os.getpid()}  # a job took another chip
    second = source.poll()
    assert second is not first and second.processes[0].chips == ("0", "1")
    fresh = HostSource(lambda: owners)  # min_interval 0: read every poll
    assert fresh.poll() is not fresh.poll()


def test_source_tracker_turns_failures_into_state(caplog):
    outcomes = iter([SourceUnavailable("no runtime"), SourceUnavailable("no runtime"),
                     ValueError("garbage"), "ok"])

    def poll():
        item = next(outcomes)
        if isinstance(item, Exception):
            raise item
        return item

    tracker = SourceTracker("demo", poll)
    with caplog.at_level(logging.INFO, logger="tpumon.sources"):
        assert tracker.poll() is None and tracker.poll() is None
        assert tracker.poll() is None
        assert tracker.health.error == "ValueError: garbage" and not tracker.health.up
        assert tracker.poll() == "ok"
    h = tracker.health
    assert (h.up, h.polls_total, h.errors_total, h.error) == (True, 4, 3, None)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["demo: down: no runtime", "demo: down: ValueError: garbage",
                        "demo: up again"]


def test_journal_formatter_prefixes_priority():
    """Every line of a traceback gets the prefix; a message is one line, whatever its
    arguments hold (a newline in it is written as an escape)."""
    formatter = JournalFormatter("%(name)s: %(message)s")
    record = logging.LogRecord("tpumon.x", logging.WARNING, __file__, 1, "a\nb", None, None)
    assert formatter.format(record) == "<4>tpumon.x: a\\nb"
    try:
        raise ValueError("x")
    except ValueError:
        record = logging.LogRecord("tpumon.x", logging.ERROR, __file__, 1, "failed", None,
                                   sys.exc_info())
    lines = formatter.format(record).splitlines()
    assert lines[0] == "<3>tpumon.x: failed" and len(lines) > 2
    assert all(line.startswith("<3>") for line in lines)


def test_agent_loop_polls_on_cadence_and_stops_promptly():
    inventory = inventory_for("v4", 1)
    state = AgentState(Identity(host="h"), inventory)
    runtime = TpuRuntimeSource("127.0.0.1", [free_port()], 0.2, inventory)
    agent = Agent(AgentInputs(state, runtime, OwnerScanner(dict, 60), 0.05,
                              build_registry(lambda: state.current)))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    time.sleep(0.6)
    stop.set()
    started = time.monotonic()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - started < 1
    polls = state.current.polls_total
    assert 6 <= polls <= 13, polls  # ~12 at 50 ms; no burst, no stall
    assert state.current.health[0].up is False  # nothing listens: reported, loop kept going
