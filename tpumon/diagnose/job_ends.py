"""A training job's end, noticed as it happens, with its likely cause and the evidence.

The runs tpumon watches often die with no message: the process is simply gone. The agent
keeps, for each process that holds chips (their owner, from /proc) or reports its steps,
the last view it had of it (step, step rate, each chip's HBM, the detector's verdict and
forecast, host memory). A job has ended when its pid no longer exists, or when it no longer
holds its chips and their runtime stopped answering or fell idle (a runtime that restarts,
or a checkpoint that pauses the steps, leaves the pid holding the chips: no end). The cause
is named from that last view, never more certain than it allows:

- ``host_oom``: the kernel's log says it killed the pid for memory;
- ``hbm_oom``: a chip was within a few percent of its HBM at the last poll, its floor was,
  or the detector's forecast put the OOM within a few polls of it;
- ``exited``: memory was far from full (a clean exit or an error, which the agent cannot
  tell apart: it is not the process's parent);
- ``unknown``: anything between.

When the detector had raised a leak with a forecast on one of the job's chips, the end says
how the forecast compared: "chip 2's forecast made at 02:14 UTC: OOM at step 61,100
(43,969-89,192); died at step 61,234".

A process whose reporter heard its end has last words (tpumon.sources.last_words): an XLA
out-of-memory error makes the cause ``hbm_oom`` whatever the last poll saw, with the
program's need and its largest allocation; any other exception, or a fatal signal, is
told with its type, message and the innermost frame of the user's code; a reporter that
heard nothing (SIGKILL, ``os._exit``) says so, and the kernel's word stands. A known
issue of the process's framework release that matches what it said is named with its fix.

A fatal signal's traceback reaches the agent only as the dead process's connection closes
(faulthandler writes it into a pipe the agent reads then), which the poll may read after it
found the pid gone. So the end of a process that is gone, whose reporter was listening but
had said nothing yet, is raised one poll later, with what was heard by then, and with the
time it was noticed. (A live process that freed its chips has no words on their way.)
"""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping

from tpumon.detect import Assessment
from tpumon.diagnose.known_issues import KnownIssue, known_issue_said
from tpumon.sources.last_words import LastWords
from tpumon.diagnose.processes import ProcessState
from tpumon.common.samples import HostSample, RuntimeReading
from tpumon.sources.chips import start_time
from tpumon.sources.kernel_log import OomKill
from tpumon.sources.reports import pid_alive
from tpumon.common.samples import StoredEnd
from tpumon.common.units import clock

CAUSES = ("hbm_oom", "host_oom", "exited", "unknown")
NEAR_FULL = 0.95        # of a chip's HBM at the last poll: an OOM is the likely end
FAR_FROM_FULL = 0.80    # below this everywhere (HBM and host): a plain exit
HOST_NEAR_FULL = 0.97   # of host memory in use, without the kernel's word: "unknown"
FORECAST_POLLS = 3      # a forecast OOM this many polls after the last one: hbm_oom
PEAK_POLLS = 32         # polls over which a chip's recent peak is kept
IDLE = 0.01             # of a chip's HBM: freed
RECENT_SECONDS = 3600.0  # ends kept for status, metrics and notifications
ENDED_KEPT = 4096       # processes (pid, start time) remembered as ended, never raised again


def estimated_peak_ratio(floor: float | None, transient: float | None,
                         total: float | None) -> float:
    """A chip's in-step peak as a share of its HBM, estimated as its floor plus the
    detector's in-step swing (a poll rarely lands on a step's peak); 0 when unknown. A job's
    end (here) and a trace's end (``tpumon analyze``) are judged on it alike."""
    return ((floor or 0.0) + (transient or 0.0)) / total if total else 0.0


#: How a trace whose last job ran out of memory is told (``analyze``, ``report``), as the
#: agent tells a chip whose job ended ("job ended (hbm_oom) ...; before it: ...")
TRACE_ENDED_AT_OOM = "the trace ends at an OOM"


def stopped_at_oom(a: Assessment, alerted: bool, full_sample_at: float | None = None) -> bool:
    """Whether a chip's samples, ending here, ended at an OOM, as the agent judges a job's
    end: after a leak alert on the chip (a trace that merely stops is no job's end: a
    healthy chip at 92 % with a wide swing read "ends at an OOM"), a sample all but full
    (at ``full_sample_at``, after the alert) in the chip's last job, or its floor plus the
    in-step swing within NEAR_FULL of capacity at the detector's last fit."""
    if not alerted:
        return False
    if full_sample_at is not None and (a.job_start is None or full_sample_at >= a.job_start):
        return True
    return estimated_peak_ratio(a.floor_bytes, a.transient_bytes, a.total_bytes) >= NEAR_FULL


@dataclass(frozen=True)
class ChipAtEnd:
    """One of the job's chips at the last poll before the end."""

    chip: str
    used_bytes: int
    total_bytes: int
    verdict: str
    floor_bytes: float | None = None
    peak_bytes: int = 0  # the most used in the last PEAK_POLLS polls (in-step peaks)
    transient_bytes: float | None = None  # the detector's in-step swing above the floor
    predicted_oom_time: float | None = None
    predicted_oom_step: float | None = None

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def seen_ratio(self) -> float:
        """The highest the chip was seen to reach lately (a poll's reading)."""
        seen = max(self.peak_bytes, self.used_bytes)
        return seen / self.total_bytes if self.total_bytes else 0.0

    @property
    def peak_ratio(self) -> float:
        """The highest the chip was seen to reach lately, or its floor plus the detector's
        in-step swing when that is higher (a poll rarely lands on a step's peak)."""
        return max(self.seen_ratio, estimated_peak_ratio(self.floor_bytes,
                                                         self.transient_bytes,
                                                         self.total_bytes))

    def describe_peak(self) -> str:
        """The peak as seen, or as estimated (a trace of the same polls shows no sample
        that high: the two must not read as two stories)."""
        if self.peak_ratio <= self.seen_ratio:
            return (f"chip {self.chip} reached {self.peak_ratio:.1%} of its HBM lately "
                    f"({self.used_ratio:.1%} at the last poll)")
        return (f"chip {self.chip}'s floor plus its in-step swing came to "
                f"{self.peak_ratio:.1%} of its HBM (polls saw {self.seen_ratio:.1%} at most "
                f"lately, {self.used_ratio:.1%} at the last)")


@dataclass(frozen=True)
class JobView:
    """The last view of a live job: what an end is judged on."""

    pid: int
    time: float
    framework: str | None = None
    step: int | None = None
    steps_per_second: float | None = None
    chips: tuple[ChipAtEnd, ...] = ()
    host_available_bytes: int | None = None
    host_total_bytes: int | None = None
    #: chip -> the detector's first leak alert on it (with the OOM forecast made then)
    forecasts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The runtime's clock at the chips' last reading: the detector's forecasts are on it
    #: (a simulated runtime's clock runs ahead of the wall clock).
    reading_time: float | None = None
    owned: bool = False  # its chips' device files were its own (not only named in reports)
    #: When the process started (/proc/PID/stat, clock ticks after boot): with the pid,
    #: the identity of its one end. None where it could not be read.
    start: int | None = None
    uid: int | None = None  # its owner, from its reports or /proc
    framework_version: str | None = None  # from its reports: known issues are matched on it

    def forecast(self) -> tuple[str | None, Mapping[str, Any] | None]:
        """The chip whose forecast an end is held against, and that forecast: of the chips
        with one, the one whose memory came nearest to capacity (it ran out first)."""
        forecast = [c for c, f in self.forecasts.items() if f.get("predicted_oom_time")]
        if not forecast:
            return None, None
        peaks = {c.chip: c.peak_ratio for c in self.chips}
        chip = max(forecast, key=lambda c: peaks.get(c, -1.0))  # ties: the first
        return chip, self.forecasts[chip]


@dataclass(frozen=True)
class JobEnd:
    """A job that ended: when it was noticed, its last view, the cause and why."""

    time: float
    view: JobView
    cause: str
    evidence: str
    last_words: LastWords | None = None  # what the process said as it ended, if heard

    @property
    def pid(self) -> int:
        return self.view.pid

    def forecast_comparison(self) -> str | None:
        """"chip 3's forecast made at 02:14 UTC: OOM at step 61,100 (43,969-89,192); died at
        step 61,234", when the detector had forecast an OOM for one of the job's chips: the
        chip that came nearest to its capacity, the one the evidence names (the first
        alerted chip's forecast was quoted beside another chip's evidence)."""
        chip, f = self.view.forecast()
        if f is None:
            return None
        made = f["time"]
        at = f"chip {chip}'s forecast made at {clock(made, made)}"
        step = f.get("predicted_oom_step")
        # times beside the forecast's own carry their date where they leave its day
        target = f"step {step:,.0f}" if step is not None else clock(f["predicted_oom_time"], made)
        low, high = f.get("predicted_oom_step_low"), f.get("predicted_oom_step_high")
        if step is not None and low is not None and high is not None and high > low:
            target += f" ({low:,.0f}-{high:,.0f})"
        last = self.view.reading_time or self.time  # on the forecast's clock
        died = (f"at step {self.view.step:,}" if self.view.step is not None else
                f"after {clock(last, made)} (its last sample)")
        return f"{at}: OOM at {target}; died {died}"

    def known_issue(self) -> KnownIssue | None:
        """A known issue of the process's framework release that its last words match."""
        words = self.last_words
        if words is None or not words.said or self.view.framework is None:
            return None
        return known_issue_said(self.view.framework, self.view.framework_version,
                                words.text())

    def summary(self) -> str:
        """One line for the log, status and notifications."""
        who = f"pid {self.pid}" + (f" ({self.view.framework})" if self.view.framework else "")
        at = f" at step {self.view.step:,}" if self.view.step is not None else ""
        text = f"training job {who} ended{at}: {self.cause} ({self.evidence})"
        compared = self.forecast_comparison()
        if compared:
            text += f"; {compared}"
        known = self.known_issue()
        return f"{text}; {known.text()}" if known else text

    def stored(self) -> StoredEnd:
        """As the history store keeps it, dated on the samples' clock (the evidence kept
        with it is the hour of samples before that)."""
        when = self.view.reading_time if self.view.reading_time is not None else self.time
        return StoredEnd(0, "", when, self.cause, self.pid, self.view.step, self.summary())

    def to_json(self) -> dict[str, Any]:
        v = self.view
        known = self.known_issue()
        return {"time": self.time, "pid": self.pid, "cause": self.cause,
                "evidence": self.evidence, "summary": self.summary(),
                "last_words": self.last_words.to_json() if self.last_words else None,
                "known_issue": known.text() if known else None,
                "framework": v.framework, "step": v.step, "steps_per_second": v.steps_per_second,
                "last_seen": v.time, "host_available_bytes": v.host_available_bytes,
                "forecast": self.forecast_comparison(),
                "chips": [{"chip": c.chip, "used_bytes": c.used_bytes,
                           "free_bytes": c.total_bytes - c.used_bytes, "verdict": c.verdict,
                           "predicted_oom_time": c.predicted_oom_time,
                           "predicted_oom_step": c.predicted_oom_step} for c in v.chips]}


@dataclass
class JobEndTracker:
    """Feed :meth:`update` each poll; it returns the ends noticed in that poll."""

    interval: float = 5.0
    recent: deque[JobEnd] = field(default_factory=lambda: deque(maxlen=64))
    totals: Counter[str] = field(default_factory=Counter)
    _views: dict[int, JobView] = field(default_factory=dict)
    _peaks: dict[str, deque[int]] = field(default_factory=dict)  # chip -> recent used
    #: (pid, start time) of every end raised lately: an end is raised once, whatever a
    #: later view says (a stale owner scan naming the dead pid, a flapping holder).
    _done: dict[tuple[int, int | None], None] = field(default_factory=dict)
    #: pid -> (when its end was noticed, its last view): ends held for one poll, for the
    #: last words still on their way (a fatal signal's)
    _held: dict[int, tuple[float, JobView]] = field(default_factory=dict)

    def update(self, now: float, runtime: RuntimeReading | None, owners: Mapping[str, int],
               processes: Mapping[int, ProcessState], assessments: Mapping[str, Assessment],
               alerts: Mapping[str, Mapping[str, Any] | None], host: HostSample | None,
               kills: Mapping[int, OomKill], attributed: Mapping[str, int] | None = None,
               trusted: Collection[int] | None = None,
               last_words: Mapping[int, LastWords] | None = None) -> list[JobEnd]:
        """``owners``: chip -> pid holding its device (from /proc); ``attributed``: chip ->
        the reporting pid that drives it (adds evidence, never holds a job alive);
        ``trusted``: the uids whose reporting processes are jobs without holding a chip
        (None: every uid's); ``last_words``: pid -> what its reporter heard it say."""
        holders = _holders(owners, processes, trusted)
        for chip, reading in (runtime.chips if runtime is not None else {}).items():
            self._peaks.setdefault(chip, deque(maxlen=PEAK_POLLS)).append(reading.hbm_used_bytes)
        words = last_words or {}
        ends = self.flush(kills, words)
        for pid in [p for p in self._views if self._ended(p, holders, runtime, processes)]:
            view = _latest_step(self._views.pop(pid), processes)
            heard = words.get(pid)
            if heard is not None and heard.armed and not heard.said and not pid_alive(pid):
                self._held[pid] = (now, view)  # its last words may be on their way
                self._done[(pid, view.start)] = None  # never watched again meanwhile
            else:
                ends.append(self._end(now, view, kills, heard))
        for pid in [p for p in self._views if p not in holders]:
            del self._views[pid]  # alive, holding nothing any more: not an end we can see
        driven = _chips_by_pid(attributed or {})
        for pid, chips in holders.items():
            before = self._views.get(pid)
            start = before.start if before is not None else start_time(pid)
            if before is None and not self._new_job(pid, start):
                continue
            self._views[pid] = self._view(now, pid, sorted({*chips, *driven.get(pid, ())}),
                                          bool(chips), runtime, processes, assessments,
                                          alerts, host, start)
        while self.recent and now - self.recent[0].time > RECENT_SECONDS:
            self.recent.popleft()
        return ends

    @property
    def holding(self) -> bool:
        """Whether an end waits for the next poll (its last words on their way)."""
        return bool(self._held)

    def flush(self, kills: Mapping[int, OomKill],
              last_words: Mapping[int, LastWords] | None = None) -> list[JobEnd]:
        """The ends held for last words still on their way, raised now with what was heard
        by then, at the time each was noticed: the agent stops, and no next poll will raise
        them (they were lost)."""
        words = last_words or {}
        ends = [self._end(noticed, view, kills, words.get(pid))
                for pid, (noticed, view) in self._held.items()]
        self._held.clear()
        return ends

    def _ended(self, pid: int, holders: Mapping[int, list[str]], runtime: RuntimeReading | None,
               processes: Mapping[int, ProcessState]) -> bool:
        state = processes.get(pid)
        if (state is not None and state.report.exited) or not pid_alive(pid):
            return True
        view = self._views[pid]
        if holders.get(pid) or not view.owned:
            return False  # holds its chips still, or only death can tell
        answered = runtime.chips if runtime is not None else {}
        return all(c.chip not in answered or _idle(answered[c.chip]) for c in view.chips)

    def _new_job(self, pid: int, start: int | None) -> bool:
        """Whether to start watching a process (``start``: its start time, None when
        unreadable): a pid that is gone (a stale owner scan, a report read after the
        death) is no job, and a process whose end was raised is never watched again."""
        return (start is not None or pid_alive(pid)) and (pid, start) not in self._done

    def _end(self, now: float, view: JobView, kills: Mapping[int, OomKill],
             words: LastWords | None = None) -> JobEnd:
        self._done[(view.pid, view.start)] = None
        while len(self._done) > ENDED_KEPT:
            del self._done[next(iter(self._done))]
        cause, evidence = judge(view, kills.get(view.pid), self.interval, words)
        end = JobEnd(now, view, cause, evidence, words)
        self.recent.append(end)
        self.totals[cause] += 1
        return end

    def _view(self, now: float, pid: int, chips: list[str], owned: bool,
              runtime: RuntimeReading | None, processes: Mapping[int, ProcessState],
              assessments: Mapping[str, Assessment],
              alerts: Mapping[str, Mapping[str, Any] | None], host: HostSample | None,
              start: int | None) -> JobView:
        """This poll's view, keeping the last chip readings when the runtime did not
        answer (a hung runtime is not a freed chip); ``owned``: the process holds its
        chips' device files itself."""
        before = self._views.get(pid)
        report = processes[pid].report if pid in processes else None
        answered = runtime.chips if runtime is not None else {}
        seen = tuple(_chip(c, answered[c], assessments.get(c), max(self._peaks[c]))
                     for c in chips if c in answered and answered[c].hbm_total_bytes)
        reading_time = runtime.time if seen and runtime is not None else None
        if not seen and before is not None:
            seen, reading_time = before.chips, before.reading_time
        forecasts: dict[str, Mapping[str, Any]] = {
            c: alert for c in chips if (alert := alerts.get(c))}
        if before is not None:
            forecasts = {**forecasts, **before.forecasts}  # the first alert of each chip
        return JobView(
            pid=pid, time=now if seen or before is None else before.time,
            framework=report.framework if report else None,
            step=report.step if report else None,
            steps_per_second=report.steps_per_second if report else None,
            chips=seen, forecasts=forecasts,
            reading_time=reading_time,
            host_available_bytes=host.memory_available_bytes if host else None,
            host_total_bytes=host.memory_total_bytes if host else None, owned=owned,
            start=start, uid=report.uid if report else before.uid if before else _uid(pid),
            framework_version=report.framework_version if report else None)


def _latest_step(view: JobView, processes: Mapping[int, ProcessState]) -> JobView:
    """The view with the process's last report: it may have reported a step or two more
    between the last poll and its death (the reports of this poll were read before)."""
    state = processes.get(view.pid)
    if state is None:
        return view
    return replace(view, step=state.report.step,
                   steps_per_second=state.report.steps_per_second or view.steps_per_second)


def _holders(owners: Mapping[str, int], processes: Mapping[int, ProcessState],
             trusted: Collection[int] | None = None) -> dict[int, list[str]]:
    """Each live job's pid and the chips it holds: a process holding chips, or a
    reporting process of a ``trusted`` uid that holds none. Anyone may report, so a
    stranger's short-lived reporters would otherwise each end a job and page."""
    out = _chips_by_pid(owners)
    for pid, state in processes.items():
        if not state.report.exited and (trusted is None or state.report.uid in trusted):
            out.setdefault(pid, [])
    return out


def _uid(pid: int) -> int | None:
    """The owner of a live process (its /proc directory's), None when it has gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _chips_by_pid(chips: Mapping[str, int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for chip, pid in chips.items():
        out.setdefault(pid, []).append(chip)
    return out


def _idle(reading: Any) -> bool:
    """A chip that holds (next to) nothing: what a freed chip reads."""
    return reading.hbm_used_bytes <= IDLE * (reading.hbm_total_bytes or 0)


def _chip(chip: str, reading: Any, a: Assessment | None, peak: int) -> ChipAtEnd:
    return ChipAtEnd(chip, reading.hbm_used_bytes, reading.hbm_total_bytes or 0,
                     a.verdict.value if a else "unknown", a.floor_bytes if a else None,
                     peak, a.transient_bytes if a else None,
                     a.predicted_oom_time if a else None, a.predicted_oom_step if a else None)


def judge(view: JobView, kill: OomKill | None, interval: float,
          words: LastWords | None = None) -> tuple[str, str]:
    """The likely cause of the end, and the evidence in words: the kernel's word first,
    then what the process said (an XLA OOM), then the last view of its memory."""
    cause, evidence = _judge_memory(view, kill, interval)
    if words is None or not words.armed:
        return cause, evidence  # a reporter of an earlier version, or none
    if not words.said:
        return cause, f"{evidence}; {words.describe()}"
    if words.oom is not None and kill is None:
        said = words.oom.describe()
        raised = f"{words.type}" + (f" at {words.frame.describe()}" if words.frame else "")
        seen = f"; {evidence}" if cause == "hbm_oom" else ""
        return "hbm_oom", f"{said} ({raised}){seen}"
    return cause, f"{evidence}; {words.describe()}"


def _judge_memory(view: JobView, kill: OomKill | None, interval: float) -> tuple[str, str]:
    """The cause and evidence from the kernel's log and the last view of memory."""
    if kill is not None:
        return "host_oom", f"the kernel killed pid {view.pid} for memory: {kill.line}"
    hbm = _hbm_evidence(view, interval)
    if hbm is not None:
        return "hbm_oom", hbm
    host_used = _host_used(view)
    if host_used is not None and host_used >= HOST_NEAR_FULL:
        return "unknown", (f"host memory {host_used:.1%} used at the last poll, but no kernel "
                           "OOM record for the pid (is /dev/kmsg readable by the agent?)")
    top = max((c.peak_ratio for c in view.chips), default=None)
    if (top is None or top < FAR_FROM_FULL) and (host_used is None or host_used < FAR_FROM_FULL):
        where = f"HBM at most {top:.0%} used" if top is not None else "no chips held"
        host = f", host memory {host_used:.0%} used" if host_used is not None else ""
        return "exited", f"memory far from full at the last poll: {where}{host}"
    return "unknown", (f"HBM up to {top or 0:.0%} used lately: neither full nor far from it")


def _hbm_evidence(view: JobView, interval: float) -> str | None:
    """Why the end looks like an HBM OOM, or None: a chip near full lately (its in-step
    peak, estimated), or its forecast OOM within a few polls of the last one."""
    full = max(view.chips, key=lambda c: c.peak_ratio, default=None)
    if full is not None and full.peak_ratio >= NEAR_FULL:
        return full.describe_peak()
    last = view.reading_time if view.reading_time is not None else view.time
    for c in view.chips:
        if c.predicted_oom_time is not None and \
                c.predicted_oom_time - last <= FORECAST_POLLS * interval:
            return (f"chip {c.chip}'s forecast OOM was {_when(c.predicted_oom_time - last)} "
                    "the last poll")
    return None


def _host_used(view: JobView) -> float | None:
    if view.host_available_bytes is None or not view.host_total_bytes:
        return None
    return 1.0 - view.host_available_bytes / view.host_total_bytes


def _when(seconds: float) -> str:
    return f"{seconds:.0f} s after" if seconds >= 0 else f"{-seconds:.0f} s before"


__all__ = ["CAUSES", "ChipAtEnd", "JobEnd", "JobEndTracker", "JobView", "judge"]
