"""A job's end: noticed when its process is gone (or its chips freed), named from the last
view with the evidence, never for a job that is still running. Real processes and the real
kernel log where the machine allows."""

import calendar
from dataclasses import replace
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import wait_for
from tpumon.detect import Assessment, Verdict
from tpumon.instrument.protocol import PROTOCOL_VERSION
from tpumon.common.identity import Identity
from tpumon.diagnose.job_ends import JobEnd, JobEndTracker, JobView
from tpumon.notify.alerts import evaluate
from tpumon.notify.settings import AlertSettings
from tpumon.diagnose.processes import ProcessTracker
from tpumon.common.samples import ChipSample, HostSample, RuntimeReading
from tpumon.sources.chips import inventory_for
from tpumon.sources.kernel_log import KernelLog, OomKill
from tpumon.state import PollState
from tpumon.sources.reports import ReporterSocket, parse_report

GiB = 2**30


def reading(now: float, used: dict[str, int]) -> RuntimeReading:
    return RuntimeReading(now, {c: ChipSample(c, u, 32 * GiB, 0.9, int(c), 8431)
                                for c, u in used.items()})


def host(available: int = 200 * GiB) -> HostSample:
    return HostSample(0.0, 256 * GiB, available, 256 * GiB - available)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def reporting(pid: int, step: int):
    """The ProcessTracker's view of one reporting pid at ``step``."""
    r = ReporterSocket(Path("/nonexistent/r.sock"))
    r._record(parse_report(json.dumps({"v": PROTOCOL_VERSION, "framework": "jax", "step": step,
                                       "time": time.time(), "live": 3}).encode(), pid, 0,
                           time.time()))
    return ProcessTracker().update(r.poll())


def feed(tracker, job, used, processes=None, owners=True, assessments=None, alerts=None,
         kills=None, runtime=True, trusted=None):
    now = time.time()
    return tracker.update(now, reading(now, used) if runtime else None,
                          {c: job.pid for c in used} if owners else {}, processes or {},
                          assessments or {}, alerts or {}, host(), kills or {},
                          trusted=trusted)


def test_an_owner_that_dies_with_a_chip_full_is_an_hbm_oom():
    tracker, job = JobEndTracker(interval=1.0), sleeper()
    for used in (20 * GiB, 25 * GiB, 31.5 * GiB):
        assert feed(tracker, job, {"0": int(used), "1": 10 * GiB}) == []
    job.kill()
    job.wait()
    [end] = feed(tracker, job, {"0": 0, "1": 0}, owners=False)
    assert end.cause == "hbm_oom" and end.pid == job.pid
    assert end.evidence.startswith("chip 0 reached 98.4% of its HBM lately"), end.evidence
    assert [c.chip for c in end.view.chips] == ["0", "1"]
    assert tracker.totals == {"hbm_oom": 1} and list(tracker.recent) == [end]
    assert feed(tracker, job, {"0": 0, "1": 0}, owners=False) == []  # once


def test_a_reporting_loop_that_exits_with_memory_far_from_full_exited():
    tracker, job = JobEndTracker(), sleeper()
    assert feed(tracker, job, {"0": 8 * GiB}, reporting(job.pid, 1200)) == []
    job.kill()
    job.wait()
    [end] = feed(tracker, job, {"0": 8 * GiB}, reporting(job.pid, 1200), owners=False)
    assert end.cause == "exited" and end.view.step == 1200 and end.view.framework == "jax"
    assert end.summary() == (f"training job pid {job.pid} (jax) ended at step 1,200: exited "
                             "(memory far from full at the last poll: HBM at most 25% used, "
                             "host memory 22% used)")


def test_the_kernels_word_makes_it_a_host_oom():
    tracker, job = JobEndTracker(), sleeper()
    feed(tracker, job, {"0": 8 * GiB})
    job.kill()
    job.wait()
    kill = OomKill(job.pid, time.time(), f"Killed process {job.pid} (python3)")
    [end] = feed(tracker, job, {"0": 0}, owners=False, kills={job.pid: kill})
    assert end.cause == "host_oom" and "the kernel killed pid" in end.evidence


def test_a_runtime_restart_or_a_long_pause_is_not_an_end():
    """The pid lives and holds its chips: the runtime not answering for a while (a restart
    of libtpu's service, a hung call) or no step for minutes (a checkpoint) ends nothing."""
    tracker, job = JobEndTracker(), sleeper()
    try:
        feed(tracker, job, {"0": 20 * GiB}, reporting(job.pid, 50))
        for _ in range(5):
            assert feed(tracker, job, {"0": 20 * GiB}, runtime=False) == []
        assert feed(tracker, job, {"0": 20 * GiB}, reporting(job.pid, 50)) == []
        assert tracker.totals == {}
    finally:
        job.kill()
        job.wait()


def test_chips_freed_while_the_pid_lives_end_the_job_it_ran():
    """The simulator's process (or a launcher that runs job after job) lives on; its job
    released the chips and they read idle: that job ended."""
    tracker, job = JobEndTracker(), sleeper()
    try:
        feed(tracker, job, {"0": 20 * GiB})
        [end] = feed(tracker, job, {"0": 0}, owners=False)
        assert end.cause == "exited"
    finally:
        job.kill()
        job.wait()


def test_the_forecast_at_alert_time_is_compared_with_the_death():
    tracker, job = JobEndTracker(), sleeper()
    alert = {"time": 1_800_000_000.0, "step": 40_000, "predicted_oom_time": 1_800_020_000.0,
             "predicted_oom_step": 61_100, "predicted_oom_step_low": 60_400,
             "predicted_oom_step_high": 61_900}
    a = Assessment(Verdict.LEAK, "leak", floor_bytes=30 * GiB, transient_bytes=1.5 * GiB)
    feed(tracker, job, {"0": 30 * GiB}, reporting(job.pid, 61_234), assessments={"0": a},
         alerts={"0": alert})
    job.kill()
    job.wait()
    [end] = feed(tracker, job, {"0": 0}, reporting(job.pid, 61_234), owners=False)
    assert end.cause == "hbm_oom"
    assert end.forecast_comparison() == ("chip 0's forecast made at 08:00 UTC: OOM at step "
                                         "61,100 (60,400-61,900); died at step 61,234")
    assert end.summary().endswith("; chip 0's forecast made at 08:00 UTC: OOM at step 61,100 "
                                  "(60,400-61,900); died at step 61,234")


def test_the_end_is_held_against_the_forecast_of_the_chip_that_filled():
    """The demo's end said "chip 3 reached 98.4% of its HBM" and then quoted chip 0's
    forecast (the first alerted chip's) without saying whose: a reader checking chip 3's
    got another number. The forecast is the fullest chip's, and named."""
    tracker, job = JobEndTracker(), sleeper()
    alerts = {c: {"time": 1_800_000_000.0, "step": 5_966,
                  "predicted_oom_time": 1_800_020_000.0 + 100 * int(c),
                  "predicted_oom_step": 28_694 - 100 * int(c)} for c in "0123"}
    a = Assessment(Verdict.LEAK, "leak", floor_bytes=27 * GiB, transient_bytes=GiB)
    used = {"0": 28 * GiB, "1": 28 * GiB, "2": 28 * GiB, "3": 31.6 * GiB}
    feed(tracker, job, used, reporting(job.pid, 27_954),
         assessments={c: a for c in used}, alerts=alerts)
    job.kill()
    job.wait()
    [end] = feed(tracker, job, {c: 0 for c in used}, reporting(job.pid, 27_954), owners=False)
    assert end.evidence.startswith("chip 3 reached"), end.evidence
    assert end.forecast_comparison() == ("chip 3's forecast made at 08:00 UTC: OOM at step "
                                         "28,394; died at step 27,954")


def test_a_forecast_across_midnight_is_dated_and_a_death_without_a_step_reads_well():
    """A log line said "forecast at 22:49 UTC for 00:57 UTC; died at after 01:10 UTC"
    (the OOM read as before the forecast) and its alert's subject was "pid 10494 at
    1795894073"."""
    made = calendar.timegm((2026, 11, 29, 22, 49, 0))
    view = JobView(10494, made + 8500, forecasts={"0": {"time": made,
                                                        "predicted_oom_time": made + 7680}},
                   reading_time=made + 8460)
    end = JobEnd(made + 8500, view, "hbm_oom", "chip 0 full")
    assert end.forecast_comparison() == ("chip 0's forecast made at 22:49 UTC: OOM at 11-30 00:57 "
                                         "UTC; died after 11-30 01:10 UTC (its last sample)")
    snap = PollState(time=made + 8500, identity=Identity("h"),
                     inventory=inventory_for("v4", 4), job_ends=(end,))
    [alert] = evaluate(snap, AlertSettings()).values()
    assert alert.subject == "pid 10494 at 2026-11-30 01:10:40 UTC", alert.subject


def test_the_kernel_log_names_oom_kills_from_recorded_lines(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,1,1,-;eth0: link up\n")
    kernel = KernelLog(str(log))
    assert kernel.poll() == {}
    with open(log, "a") as f:
        f.write("6,423,1745637389,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
                "task=python3,pid=23613,uid=0\n")
        f.write("3,424,1745637414,-;Memory cgroup out of memory: Killed process 23614 "
                "(python3) total-vm:82132kB, anon-rss:72192kB\n")
        f.write(" SUBSYSTEM=memory\n")
    kills = kernel.poll()
    assert sorted(kills) == [23613, 23614]
    assert kills[23614].line.startswith("Memory cgroup out of memory: Killed process 23614")


MEMCG = Path("/sys/fs/cgroup/memory")


def _own_memcg() -> Path | None:
    """A memory cgroup (v1) this test may create under its own, or None."""
    try:
        rel = next(line.split(":", 2)[2].strip() for line in
                   Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":")[1] == "memory")
    except (OSError, StopIteration, IndexError):
        return None
    base = MEMCG / rel.lstrip("/")
    return base if os.access(base, os.W_OK) else None


@pytest.mark.skipif(os.geteuid() != 0 or _own_memcg() is None or
                    not os.access("/dev/kmsg", os.R_OK),
                    reason="needs root, a writable memory cgroup (v1) and /dev/kmsg")
def test_a_process_killed_under_a_cgroup_memory_limit_is_a_host_oom():
    """A real Python loop allocating host memory until the kernel's OOM killer ends it
    under a 64 MiB cgroup limit: the agent's view of it ends as host_oom, on the kernel's
    word from the real /dev/kmsg."""
    cgroup = _own_memcg() / f"tpumon-test-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(64 << 20))
        kernel, tracker = KernelLog(), JobEndTracker()
        kernel.poll()
        job = subprocess.Popen([sys.executable, "-c", (
            "import sys, time\nopen(sys.argv[1], 'w').write(str(__import__('os').getpid()))\n"
            "sys.stdin.readline()\nx = []\nwhile True:\n    x.append(bytearray(8 << 20))\n"),
            str(cgroup / "cgroup.procs")], stdin=subprocess.PIPE)
        feed(tracker, job, {"0": 4 * GiB}, reporting(job.pid, 10))
        job.stdin.write(b"go\n")
        job.stdin.flush()
        assert job.wait(60) == -9
        kills = wait_for(lambda: kernel.poll().get(job.pid) and kernel.kills, 10)
        [end] = feed(tracker, job, {"0": 0}, reporting(job.pid, 10), owners=False,
                     kills=kills)
        assert end.cause == "host_oom", end
        assert f"pid={job.pid}" in end.evidence or f"process {job.pid}" in end.evidence
    finally:
        cgroup.rmdir()


def test_the_hour_before_an_end_is_kept_whatever_the_retention(tmp_path):
    """The end's evidence is copied when it is seen: raw samples rolling up into minutes a
    day later (here: an hour) do not thin it, and `tpumon export --around-end` gives it."""
    from tpumon.common.samples import StoredEnd
    from tpumon.store.database import KEPT_ENDS, HistoryDB, Retention, database_path
    from tpumon.common.samples import Sample

    retention = Retention(raw_seconds=3600, minute_seconds=30 * 86400)
    db = HistoryDB(database_path(tmp_path), retention)
    t0 = 1_790_000_000.0
    with db.transaction():
        for i in range(4 * 3600 // 5):  # four hours of 5 s polls, two chips
            t = t0 + 5 * i
            db.add_samples("vm", [(c, Sample(t, i, 20 * GiB + i * 4096, 32 * GiB))
                                  for c in ("0", "1")])
    end_time = t0 + 2 * 3600  # the end, two hours in
    with db.transaction():
        kept = db.keep_job_end("vm", StoredEnd(0, "", end_time, "hbm_oom", 4242, 1440, "died"))
    db.apply_retention(t0 + 4 * 3600)  # everything older than the last hour rolled up
    evidence = list(db.end_samples(kept))
    assert len(evidence) == 2 * (3600 // 5 + 1)
    assert min(s.time for _, s in evidence) == end_time - 3600
    assert max(s.time for _, s in evidence) == end_time
    [stored] = db.job_ends()
    assert (stored.host, stored.cause, stored.pid, stored.step) == ("vm", "hbm_oom", 4242, 1440)
    later = t0 + 4 * 3600 - 600  # in the raw hour still kept
    with db.transaction():
        for n in range(KEPT_ENDS + 2):  # only the latest ends stay
            db.keep_job_end("vm", StoredEnd(0, "", later + n, "exited", n, None, "x"))
    assert len(db.job_ends()) == KEPT_ENDS and db.job_ends()[0].pid == KEPT_ENDS + 1
    assert list(db.end_samples(kept)) == []
    latest = len(list(db.end_samples(db.job_ends()[0].id)))
    assert 0 < latest < 2 * (3600 // 5)  # only what was still raw when it was seen
    db.close()
    out = tmp_path / "end.csv"
    done = subprocess.run([sys.executable, "-m", "tpumon", "export", "--state-dir",
                           str(tmp_path), "--around-end", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "the hour before: x" in done.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + latest  # header, then the last end's evidence


def test_export_around_an_end_where_none_was_kept_is_one_error_line(tmp_path):
    from tpumon.store.database import HistoryDB, Retention, database_path
    from tpumon.common.samples import Sample

    db = HistoryDB(database_path(tmp_path), Retention())
    with db.transaction():
        db.add_samples("vm", [("0", Sample(1.0, 1, 1, 2))])
    db.close()
    done = subprocess.run([sys.executable, "-m", "tpumon", "export", "--state-dir",
                           str(tmp_path), "--around-end"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"Error: {database_path(tmp_path)}: no job end kept here (the agent keeps the hour "
        "before each end it sees; docs/job-ends.md)"]


@pytest.mark.e2e
def test_tpumon_report_marks_a_kept_end_on_its_timeline(tmp_path):
    """`tpumon report --state-dir` draws each kept end on its host's panels (a dash-dot
    line labelled with the cause) and names it under the page's headline."""
    from tpumon.common.samples import StoredEnd
    from tpumon.store.database import HistoryDB, Retention, database_path
    from tpumon.common.samples import Sample

    db = HistoryDB(database_path(tmp_path), Retention())
    t0 = 1_790_000_000.0
    with db.transaction():
        for i in range(2 * 3600 // 10):
            db.add_samples("vm", [("0", Sample(t0 + 10 * i, i, 20 * GiB + i * 2**20, 32 * GiB))])
        db.keep_job_end("vm", StoredEnd(0, "", t0 + 7190, "hbm_oom", 4242, 719,
                                        "training job pid 4242 ended at step 719: hbm_oom"))
    db.close()
    done = subprocess.run([sys.executable, "-m", "tpumon", "report", "--state-dir",
                           str(tmp_path), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "tpumon-report-vm.html").read_text()
    assert ("<p><strong>Job ended</strong> 2026-09-21 16:13 UTC: training job pid 4242 ended "
            "at step 719: hbm_oom</p>") in page, page[:2000]


def test_an_owner_scan_still_naming_the_dead_holder_raises_its_end_once():
    """The owner scan is rescanned every runtime.owners_interval (30 s), so for polls
    after a holder's death it still names the dead pid: the end is raised once, and the
    dead pid is never taken up as a job again (it used to be, at every poll, and to end
    again with a new key: 14-19 pages in issue 42's audit)."""
    tracker, job = JobEndTracker(interval=1.0), sleeper()
    assert feed(tracker, job, {"0": 20 * GiB}) == []
    job.kill()
    job.wait()
    ends = [e for _ in range(10) for e in feed(tracker, job, {"0": 20 * GiB})]  # stale scan
    assert [e.pid for e in ends] == [job.pid]
    assert ends[0].view.start is not None


def test_a_reporting_process_of_an_untrusted_user_that_holds_nothing_is_no_job():
    """Anyone may report: a reporting process is a job of its own only when its uid is
    trusted; holding a chip makes any process one."""
    tracker, job = JobEndTracker(), sleeper()
    stranger = reporting(job.pid, 5)  # uid 0 in the report; trusted below: someone else
    assert feed(tracker, job, {"0": 8 * GiB}, stranger, owners=False, trusted={1234}) == []
    job.kill()
    job.wait()
    assert feed(tracker, job, {"0": 8 * GiB}, stranger, owners=False, trusted={1234}) == []
    holder = sleeper()
    assert feed(tracker, holder, {"0": 8 * GiB}, trusted={1234}) == []
    holder.kill()
    holder.wait()
    [end] = feed(tracker, holder, {"0": 8 * GiB}, owners=False, trusted={1234})
    assert end.pid == holder.pid


def test_the_last_words_reach_every_sink_escaped_for_it():
    """An XLA OOM said by the process names the end (hbm_oom with the program's need and its
    largest allocation) where memory looked far from full; the words are the process's:
    a mention, an escape sequence and a newline in them act in no sink."""
    from tpumon.instrument.protocol import LAST_WORDS_HEADER
    from tpumon.sources.last_words import parse_message
    from tpumon.notify.alerts import Alert
    from tpumon.notify.outbox import Event
    from tpumon.notify.pagerduty import PagerDutyChannel
    from tpumon.notify.slack import SlackChannel
    from tpumon.common.untrusted_text import for_log, for_terminal

    text = (Path(__file__).parent / "fixtures" / "last_words" / "easydel_166_compile.txt"
            ).read_text()
    words = parse_message(LAST_WORDS_HEADER + json.dumps({
        "kind": "exception", "type": "XlaRuntimeError <!channel>", "message": text,
        "frame": {"file": "/job/\x1b]0;x\x07mo\ndel.py", "line": 212}}).encode())
    tracker, job = JobEndTracker(), sleeper()
    processes = reporting(job.pid, 1200)
    now = time.time()
    tracker.update(now, reading(now, {"0": 8 * GiB}), {"0": job.pid}, processes, {}, {},
                   host(), {})
    job.kill()
    job.wait()
    [end] = tracker.update(now + 1, reading(now + 1, {"0": 8 * GiB}), {}, processes, {}, {},
                           host(), {}, last_words={job.pid: words})
    assert end.cause == "hbm_oom"
    assert "the program needed 63.80 GiB of 30.75 GiB of hbm; largest: f32[32,4096,4096] " \
        "2.00 GiB at attention_module.py:1059 (dot_general) (XlaRuntimeError <!channel> at " \
        in end.summary()
    assert end.stored().summary == end.summary()  # `tpumon report`, export --around-end
    doc = end.to_json()
    assert doc["last_words"]["oom"]["allocations"][0]["source"] == "attention_module.py:1059"
    assert "\x1b" not in json.dumps(doc) and "\x07" not in json.dumps(doc)
    alert = Alert("TPUMonJobEnded", "critical", "key", "vm", "", "", "", f"pid {end.pid}",
                  end.summary())
    event = Event(1, "slack", "trigger", alert, now, now, 0)
    slack = SlackChannel("http://x", ("critical",)).requests([event])
    body = slack[0][1]
    assert "<!channel>" not in json.dumps(body) and "&lt;!channel&gt;" in body["text"]
    page = PagerDutyChannel("http://x", "k" * 32, ("critical",)).requests([event])
    summary = page[0][1]["payload"]["summary"]
    assert len(summary) <= 1024 and not any(ord(c) < 32 for c in summary)
    assert "\n" not in for_log(end.summary()) and "\x1b" not in for_terminal(end.summary())


def test_a_peak_no_poll_saw_is_told_as_the_estimate_it_is():
    """A chip whose floor plus in-step swing came within NEAR_FULL of capacity, while no poll
    saw it above 90 %, ended in an HBM OOM; the evidence says the 98 % is the estimate, for
    the exported trace shows no sample that high (a newcomer read the two as two stories)."""
    from tpumon.diagnose.job_ends import ChipAtEnd, judge

    total = 32 * GiB
    estimated = ChipAtEnd("2", int(0.85 * total), total, "leak", floor_bytes=0.86 * total,
                          peak_bytes=int(0.90 * total), transient_bytes=0.12 * total)
    cause, evidence = judge(JobView(7, 0.0, chips=(estimated,)), None, 1.0)
    assert cause == "hbm_oom"
    assert evidence.startswith("chip 2's floor plus its in-step swing came to 98.0% of its HBM "
                               "(polls saw 90.0% at most lately, 85.0% at the last)")
    seen = ChipAtEnd("2", int(0.85 * total), total, "leak", floor_bytes=0.80 * total,
                     peak_bytes=int(0.99 * total), transient_bytes=0.1 * total)
    assert judge(JobView(7, 0.0, chips=(seen,)), None, 1.0)[1].startswith(
        "chip 2 reached 99.0% of its HBM lately (85.0% at the last poll)")


def test_a_silent_end_waits_one_poll_for_the_words_still_on_their_way():
    """A fatal signal's traceback reaches the agent as the dead process's connection
    closes, which a poll may read after it found the pid gone (CI saw SIGABRT told as "no
    last words"). An end whose reporter listened but said nothing yet is raised one poll
    later, with what came meanwhile and the time it was noticed; said words raise it at once."""
    from tpumon.instrument.protocol import FATAL_HEADER, LAST_WORDS_HEADER
    from tpumon.sources.last_words import merge, parse_message

    armed = parse_message(LAST_WORDS_HEADER + b'{"kind": "armed", "fatal": true}')
    fatal = merge(armed, parse_message(FATAL_HEADER + b"Fatal Python error: Aborted\n\n"
                                       b'Current thread 0x1 (most recent call first):\n'
                                       b'  File "/job/train.py", line 9 in main\n'))
    raised = merge(armed, parse_message(LAST_WORDS_HEADER + b'{"kind": "exception", '
                                        b'"type": "ValueError", "message": "x"}'))
    jobs = {way: sleeper() for way in ("fatal", "never", "raised")}
    tracker, now = JobEndTracker(), time.time()
    tracker.update(now, reading(now, {"0": 8 * GiB, "1": 8 * GiB, "2": 8 * GiB}),
                   {str(i): j.pid for i, j in enumerate(jobs.values())}, {}, {}, {}, host(), {})
    for job in jobs.values():
        job.kill()
        job.wait()
    first = {jobs["fatal"].pid: armed, jobs["never"].pid: armed, jobs["raised"].pid: raised}
    [end] = tracker.update(now + 1, reading(now + 1, {}), {}, {}, {}, {}, host(), {},
                           last_words=first)
    assert end.pid == jobs["raised"].pid and end.last_words == raised
    later = {jobs["fatal"].pid: fatal, jobs["never"].pid: armed}
    ends = {e.pid: e for e in tracker.update(now + 2, reading(now + 2, {}), {}, {}, {}, {},
                                             host(), {}, last_words=later)}
    assert set(ends) == {jobs["fatal"].pid, jobs["never"].pid}
    assert "killed by SIGABRT at train.py:9 in main" in ends[jobs["fatal"].pid].summary()
    assert "no last words" in ends[jobs["never"].pid].summary()
    assert {e.time for e in ends.values()} == {now + 1}  # when the end was noticed
    assert tracker.totals == {"exited": 3}
    assert tracker.update(now + 3, reading(now + 3, {}), {}, {}, {}, {}, host(), {},
                          last_words=later) == []  # once


def test_a_live_process_that_frees_its_chips_ends_once_and_is_not_held():
    """A reporting process that frees its chips and lives on (a trusted uid's: still
    watched) has no last words on their way: its end is raised at once, and its later
    death raises no second one (a first version held it, and watched it again meanwhile)."""
    from tpumon.instrument.protocol import LAST_WORDS_HEADER
    from tpumon.sources.last_words import parse_message

    tracker, job = JobEndTracker(), sleeper()
    processes, now = reporting(job.pid, 10), time.time()
    armed = {job.pid: parse_message(LAST_WORDS_HEADER + b'{"kind": "armed", "fatal": true}')}

    def poll(t: float, used: int, owners: dict) -> list:
        return tracker.update(t, reading(t, {"0": used}), owners, processes, {}, {}, host(),
                              {}, last_words=armed)

    assert poll(now, 20 * GiB, {"0": job.pid}) == []
    [end] = poll(now + 1, 0, {})
    assert end.pid == job.pid and end.time == now + 1
    assert [poll(now + 2 + i, 0, {}) for i in range(3)] == [[], [], []]
    job.kill()
    job.wait()
    assert poll(now + 6, 0, {}) == [] and poll(now + 7, 0, {}) == []
    assert tracker.totals == {"exited": 1}


def test_a_chip_whose_job_died_shows_no_forecast_for_it_until_it_is_read_again():
    """After the demo's job ran out of memory, status and the summary page still said
    "leak ... OOM in 26 min" for its chips, which no longer answered. The chip keeps its
    last verdict, told as what it was, and no forecast; once the chip is read again (a new
    job), the detector speaks for it."""
    from tpumon.diagnose.job_ends import ChipAtEnd
    from tpumon.web.status import status_document

    now = 1_800_000_000.0
    a = Assessment(Verdict.LEAK, "floor grows 467.0 KiB/step; OOM in 26 min",
                   floor_bytes=30 * GiB, slope_bytes_per_second=1e6,
                   slope_bytes_per_step=467 * 1024, predicted_oom_time=now + 1560,
                   predicted_oom_step=29_209, window_start=now - 7200, window_seconds=7200)
    view = JobView(4242, now - 5, step=27_959,
                   chips=(ChipAtEnd("0", 32 * GiB, 32 * GiB, "leak", 30 * GiB, 32 * GiB,
                                    GiB, now + 1560, 29_209),))
    end = JobEnd(now, view, "hbm_oom", "chip 0 full")
    gone = PollState(time=now, identity=Identity("h"), inventory=inventory_for("v4", 4),
                     assessments={"0": a}, job_ends=(end,))
    [chip] = [c for c in status_document(gone)["chips"] if c["chip"] == "0"]
    assert chip["verdict"] == "leak" and chip["time_to_oom_seconds"] is None
    assert chip["predicted_oom_time"] is None and chip["growth_bytes_per_hour"] is None
    assert chip["reason"] == ("job ended (hbm_oom) at step 27,959; before it: floor grows "
                              "467.0 KiB/step; OOM in 26 min")
    back = PollState(time=now, identity=Identity("h"), inventory=inventory_for("v4", 4),
                     runtime=reading(now, {"0": 2 * GiB}), assessments={"0": a},
                     job_ends=(end,))
    [chip] = [c for c in status_document(back)["chips"] if c["chip"] == "0"]
    assert chip["reason"] == a.reason and chip["time_to_oom_seconds"] is not None
    from tpumon.web.http import landing_page

    page = landing_page(gone)
    assert "leak: job ended (hbm_oom) at step 27,959; before it:" in page
    # /metrics as status: the forecast of a job that is gone kept TPUMonOOMForecast (a
    # critical page) firing beside TPUMonJobDiedOOM
    from prometheus_client import CollectorRegistry, generate_latest
    from tpumon.metrics.collectors import DetectorCollector

    def scraped(snap: PollState) -> str:
        registry = CollectorRegistry()
        registry.register(DetectorCollector(lambda: snap))
        return generate_latest(registry).decode()

    dead, alive = scraped(gone), scraped(back)
    for name in ("tpumon_oom_predicted_timestamp_seconds", "tpumon_oom_predicted_step",
                 "tpumon_hbm_growth_bytes_per_step", "tpumon_hbm_growth_bytes_per_second"):
        assert f"{name}{{" not in dead and f"{name}{{" in alive, name
    assert re.search(r'tpumon_leak_verdict{[^}]*verdict="leak"[^}]*} 1.0', dead)
    assert "tpumon_hbm_floor_bytes{" in dead
    # ... and says the job ended, so the rules leave the chip alone (deploy/prometheus)
    assert re.search(r'tpumon_chip_job_ended{[^}]*chip="0"[^}]*} 1.0', dead)
    assert re.search(r'tpumon_chip_job_ended{[^}]*chip="0"[^}]*} 0.0', alive)
    # a new job on the chip, missed by one poll (a runtime timeout): the old job's end is
    # not its end (a review found its alerts reset at every such hiccup for an hour)
    later = replace(a, job_start=now + 600)
    missed = PollState(time=now + 900, identity=Identity("h"), inventory=inventory_for("v4", 4),
                       assessments={"0": later}, job_ends=(end,))
    assert missed.ended_job("0") is None
    [chip] = [c for c in status_document(missed)["chips"] if c["chip"] == "0"]
    assert chip["reason"] == a.reason and chip["predicted_oom_time"] is not None
    assert re.search(r'tpumon_chip_job_ended{[^}]*chip="0"[^}]*} 0.0', scraped(missed))
