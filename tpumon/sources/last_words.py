"""What a training process said as it ended (tpumon.instrument.last_words), read by the agent.

The reporter sends an uncaught exception (type, message, the innermost frame of the
user's code, the traceback), the interpreter's exit, and the traceback faulthandler wrote
on a fatal signal. Every byte of it comes from another process: sizes are capped, control
characters other than newline and tab are stripped here, and each sink escapes what it
shows (tpumon.common.untrusted_text). Nothing here raises on any input: a message that is not
last words is ``None``.

XLA's out-of-memory errors are parsed into fields (:class:`OutOfMemory`), from the
wordings of XLA, PJRT and libtpu (fixtures in tests/fixtures/last_words, each with the
public thread it was taken from):

- compile time: "Ran out of memory in memory space hbm. Used 63.80G of 30.75G hbm. ...
  Program hbm requirement 63.80G: ... Largest program allocations in hbm: 1. Size: 2.00G
  Operator: op_name=... source_file=... source_line=... Shape: f32[32,4096,4096]{...}
  ... Allocation type: HLO temp";
- run time: "Attempting to allocate 306.51M. That was not possible. There are 1.03G free.",
  "Attempting to reserve 3.95G at the bottom of memory. That was not possible. There are
  1.92G free", "Could not allocate 10485760 bytes in memory 0x0x0_HBM0; 4374528 bytes
  allocatable, 14942208 bytes available", "Failed to allocate request for 256.00MiB
  (268435456B)", and the CPU and PJRT client's "Out of memory allocating 4398046511104
  bytes." (JAX and torch_xla 2.9 on CPU, checked here).

A wording not known keeps its raw text (bounded) and is still an end's last words.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from tpumon.instrument.protocol import FATAL_HEADER, LAST_WORDS_HEADER
from tpumon.common.units import format_bytes

TEXT_CHARS = 16384  # an exception's message kept (the OOM report's table included)
TRACEBACK_CHARS = 8192  # the traceback kept, its innermost end
LINE_CHARS = 240  # what a one-line summary shows of a message
#: what the status document shows of them (an hour's ends, up to 64, each at most ~6 KiB);
#: the parsed fields carry the rest
SHOWN_MESSAGE_CHARS, SHOWN_TRACEBACK_CHARS = 4096, 2048
ALLOCATIONS_KEPT = 8
KINDS = ("armed", "exception", "thread_exception", "exit", "fatal")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_SIZE = r"(-?[0-9]+(?:\.[0-9]+)?)\s?([KMGTP]?)(?:i?B)?"
_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
            "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def clean(text: Any, limit: int) -> str:
    """Untrusted text as kept: a string, at most ``limit`` characters, without control
    characters other than newline and tab."""
    return _CONTROL.sub("", text if isinstance(text, str) else "")[:limit]


@dataclass(frozen=True)
class Allocation:
    """One row of XLA's "Largest program allocations" table."""

    size_bytes: int | None
    shape: str | None = None       # "f32[32,4096,4096]", its layout dropped
    dtype: str | None = None       # "f32"
    op_name: str | None = None     # the last part of XLA's op_name: "dot_general"
    source: str | None = None      # "attention_module.py:1059"
    allocation_type: str | None = None  # "HLO temp", "program input", ...

    def describe(self) -> str:
        """'f32[32768,32768] 4.00 GiB at model.py:212 (dot_general)'."""
        text = " ".join(p for p in (self.shape, format_bytes(self.size_bytes)) if p)
        if self.source:
            text += f" at {self.source}"
        return text + (f" ({self.op_name})" if self.op_name else "")


@dataclass(frozen=True)
class OutOfMemory:
    """The fields of an XLA/PJRT/libtpu out-of-memory error; None where it does not say."""

    when: str                        # "compile" or "runtime"
    memory_space: str | None = None  # "hbm", "vmem", "host"
    requested_bytes: int | None = None
    free_bytes: int | None = None
    used_bytes: int | None = None    # "Used 63.80G of 30.75G hbm": what the program needed
    capacity_bytes: int | None = None
    program_bytes: int | None = None  # "Program hbm requirement"
    allocations: tuple[Allocation, ...] = ()

    def describe(self) -> str:
        """'the program needed 63.80 GiB of 30.75 GiB of hbm; largest: f32[...] 2.00 GiB at
        attention_module.py:1059 (dot_general)', or 'out of memory allocating 4.00 TiB'."""
        space = f" of {self.memory_space}" if self.memory_space else ""
        needed = self.used_bytes if self.used_bytes is not None else self.program_bytes
        if needed is not None and self.capacity_bytes is not None:
            text = f"the program needed {format_bytes(needed)} of " \
                   f"{format_bytes(self.capacity_bytes)}{space}"
        elif needed is not None:
            text = f"the program needed {format_bytes(needed)}{space}"
        elif self.requested_bytes is not None:
            text = f"out of memory{space} allocating {format_bytes(self.requested_bytes)}"
            if self.free_bytes is not None:
                text += f" with {format_bytes(self.free_bytes)} free"
        else:
            text = f"out of memory{space}"
        if self.allocations:
            text += f"; largest: {self.allocations[0].describe()}"
        return text


@dataclass(frozen=True)
class Frame:
    file: str
    line: int | None
    function: str | None = None
    code: str | None = None

    def describe(self) -> str:
        """'model.py:212 in train_step': the file's name, not its directories."""
        where = self.file.rsplit("/", 1)[-1] + (f":{self.line}" if self.line else "")
        return where + (f" in {self.function}" if self.function else "")


@dataclass(frozen=True)
class LastWords:
    """What one process said as it ended, as far as the agent heard it."""

    armed: bool = False         # the reporter listened for its end (a reporter of this version)
    fatal_armed: bool = False   # ... and held a faulthandler pipe for fatal signals
    kind: str | None = None     # "exception", "thread_exception", "fatal"; None: none heard
    type: str | None = None     # "jax.errors.JaxRuntimeError", or the signal: "SIGABRT"
    message: str = ""
    frame: Frame | None = None
    thread: str | None = None
    traceback: str = ""
    exited: bool = False        # the interpreter ran its exit handlers
    status: int | None = None   # its exit status, where known
    oom: OutOfMemory | None = None

    @property
    def said(self) -> bool:
        """Whether anything beyond "I am listening" was heard."""
        return self.kind is not None or self.exited

    def text(self) -> str:
        """Everything it said, for known issues to match on."""
        return "\n".join(p for p in (self.type or "", self.message, self.traceback) if p)

    def describe(self) -> str:
        """One line: "raised jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: ... at
        train.py:12 in main", "killed by SIGABRT at native.py:3", "exited normally"."""
        at = f" at {self.frame.describe()}" if self.frame else ""
        if self.kind == "fatal":
            return f"killed by {self.type or 'a fatal signal'}{at} (faulthandler's traceback)"
        if self.kind in ("exception", "thread_exception"):
            first = self.message.strip().splitlines()[0] if self.message.strip() else ""
            if len(first) > LINE_CHARS:
                first = first[:LINE_CHARS - 1] + "\u2026"
            where = f" in thread {self.thread}" if self.kind == "thread_exception" and \
                self.thread else ""
            said = f"{self.type}: {first}" if first else f"{self.type}"
            return f"raised {said}{where}{at}"
        if self.exited:
            return "exited through Python's exit handlers" + (
                f" (status {self.status})" if self.status is not None else "")
        return ("no last words: no exception, exit or fatal signal was heard "
                "(SIGKILL, os._exit, or a signal Python does not catch)")

    def to_json(self) -> dict[str, Any]:
        """For /api/status: every field, the message's start and the traceback's
        innermost end shortened (SHOWN_*), and the one-line summary."""
        doc = asdict(self)
        doc["message"] = self.message[:SHOWN_MESSAGE_CHARS]
        doc["traceback"] = self.traceback[-SHOWN_TRACEBACK_CHARS:]
        doc["summary"] = self.describe()
        return doc


def merge(before: LastWords | None, words: LastWords) -> LastWords:
    """A process's last words so far with a new message: an exception is kept over an
    exit that follows it (the exit adds its status), and a fatal signal over both. A
    reporter starting ("armed") begins afresh: a pid reused by a new process must not
    inherit the words of the one before."""
    if before is None or not words.said:
        return words
    if words.kind is None:  # "armed", or "exit"
        return replace(before, armed=before.armed or words.armed,
                       fatal_armed=before.fatal_armed or words.fatal_armed,
                       exited=before.exited or words.exited,
                       status=words.status if words.status is not None else before.status)
    if before.kind == "fatal" and words.kind != "fatal":
        return before
    return replace(words, armed=before.armed or words.armed,
                   fatal_armed=before.fatal_armed or words.fatal_armed,
                   exited=before.exited, status=before.status)


def parse_message(data: bytes) -> LastWords | None:
    """A last-words message (its header, then JSON; or a fatal signal's traceback as the
    inlet read it from faulthandler's pipe); None when it is not one."""
    try:
        if data.startswith(FATAL_HEADER):
            text = data[len(FATAL_HEADER):].decode(errors="replace")
            return parse_fatal(text) if text.strip() else None
        if not data.startswith(LAST_WORDS_HEADER):
            return None
        doc = json.loads(data[len(LAST_WORDS_HEADER):])
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
        return None
    kind = doc["kind"]
    if kind == "armed":
        return LastWords(armed=True, fatal_armed=doc.get("fatal") is True)
    if kind == "exit":
        status = doc.get("status")
        return LastWords(armed=True, exited=True, status=status if type(status) is int and
                         0 <= status < 256 else None)
    message = clean(doc.get("message"), TEXT_CHARS)
    thread = clean(doc.get("thread"), 64) or None
    return LastWords(armed=True, kind="exception" if kind == "exception" else "thread_exception",
                     type=clean(doc.get("type"), 128) or "an exception", message=message,
                     frame=_frame(doc.get("frame")), thread=thread,
                     traceback=clean(doc.get("traceback"), 2 * TRACEBACK_CHARS)[-TRACEBACK_CHARS:],
                     oom=parse_oom(message))


def _frame(doc: Any) -> Frame | None:
    if not isinstance(doc, dict) or not clean(doc.get("file"), 512):
        return None
    line = doc.get("line")
    return Frame(clean(doc["file"], 512), line if type(line) is int and line > 0 else None,
                 clean(doc.get("function"), 128) or None, clean(doc.get("code"), 200) or None)


_FAULT_FRAME = re.compile(r'^\s+File "([^"\n]{1,512})", line (\d+) in (\S{1,128})', re.M)


def parse_fatal(text: str) -> LastWords:
    """faulthandler's report of a fatal signal: "Fatal Python error: Aborted", then each
    thread's stack, the current thread's marked, most recent call first."""
    text = clean(text, TEXT_CHARS)
    head = re.search(r"Fatal Python error: ([^\n]{1,100})", text)
    error = head.group(1).strip() if head else None
    signal = _SIGNALS.get(error or "", error)
    current = text.find("Current thread")
    frames = _FAULT_FRAME.findall(text[current:] if current >= 0 else text)
    chosen = next((f for f in frames if _users(f[0])), frames[0] if frames else None)
    frame = Frame(chosen[0], int(chosen[1]), chosen[2]) if chosen else None
    return LastWords(armed=True, fatal_armed=True, kind="fatal", type=signal,
                     message=error or "", frame=frame, traceback=text[-TRACEBACK_CHARS:])


def _users(path: str) -> bool:
    return "/site-packages/" not in path and "/dist-packages/" not in path and \
        "/lib/python3" not in path and not path.startswith("<")


# ---- XLA's out-of-memory wordings --------------------------------------------------------

_OOM_HINT = re.compile(r"RESOURCE_EXHAUSTED|Resource exhausted|[Oo]ut of memory|"
                       r"Ran out of memory|That was not possible|Could not allocate")
_COMPILE = re.compile(rf"Ran out of memory in memory space (\w+)\.(?:\s*Used {_SIZE} of "
                      rf"{_SIZE} (\w+))?")
_PROGRAM = re.compile(rf"Program (\w+) requirement {_SIZE}")
_CAPACITY = re.compile(rf"(\w+) capacity {_SIZE}", re.I)
_ATTEMPT = re.compile(rf"Attempting to (?:allocate|reserve) {_SIZE}(?: at the bottom of "
                      rf"memory)?\. That was not possible\.(?: There are {_SIZE} free)?")
_COULD_NOT = re.compile(r"Could not allocate (\d+) bytes in memory (\S+?);?\s+(\d+) bytes "
                        r"allocatable, (\d+) bytes available")
_ALLOCATING = re.compile(r"Out of memory (?:while trying to allocate|allocating) (\d+) bytes|"
                         r"Failed to allocate request for \S+ \((\d+)B\)")
_ROW = re.compile(rf"^\s*\d+\. Size: {_SIZE}", re.M)


def size(number: str, unit: str) -> int:
    """XLA's human-readable size ("63.80G", "4.0K", "0B"): binary units."""
    return round(float(number) * _UNITS[unit])


def parse_oom(text: str) -> OutOfMemory | None:
    """The fields of an out-of-memory error in ``text``; None when it is not one."""
    if not text or not _OOM_HINT.search(text):
        return None
    compile_time = _COMPILE.search(text)
    if compile_time:
        space = compile_time.group(1).lower()
        used = capacity = None
        if compile_time.group(2) is not None:
            used = size(compile_time.group(2), compile_time.group(3))
            capacity = size(compile_time.group(4), compile_time.group(5))
        return OutOfMemory("compile", space, used_bytes=used, capacity_bytes=capacity,
                           program_bytes=_program(text), allocations=_allocations(text))
    attempt = _ATTEMPT.search(text)
    if attempt:
        hbm = _CAPACITY.search(text)
        return OutOfMemory(
            "runtime", _space(text, hbm.group(1) if hbm else None),
            requested_bytes=size(attempt.group(1), attempt.group(2)),
            free_bytes=size(attempt.group(3), attempt.group(4)) if attempt.group(3) else None,
            capacity_bytes=size(hbm.group(2), hbm.group(3)) if hbm else None,
            program_bytes=_program(text), allocations=_allocations(text))
    could_not = _COULD_NOT.search(text)
    if could_not:
        return OutOfMemory("runtime", _space(could_not.group(2)),
                           requested_bytes=int(could_not.group(1)),
                           free_bytes=int(could_not.group(4)))
    allocating = _ALLOCATING.search(text)
    if allocating:
        return OutOfMemory("runtime", _space(text),
                           requested_bytes=int(allocating.group(1) or allocating.group(2)))
    if re.search(r"RESOURCE_EXHAUSTED|Resource exhausted", text) and \
            re.search(r"memory|HBM|hbm|allocat", text):
        return OutOfMemory("runtime", _space(text))
    return None


def _program(text: str) -> int | None:
    found = _PROGRAM.search(text)
    return size(found.group(2), found.group(3)) if found else None


def _space(text: str, named: str | None = None) -> str | None:
    """The memory space a runtime error names: HBM, VMEM or host."""
    for candidate in (named or "", text):
        lowered = candidate.lower()
        for space in ("hbm", "vmem"):
            if space in lowered:
                return space
    return None


def _allocations(text: str) -> tuple[Allocation, ...]:
    """The table "Largest program allocations in hbm: 1. Size: ... Operator: ... Shape:
    ... Allocation type: ...", its first rows."""
    rows = list(_ROW.finditer(text))
    found = []
    for i, row in enumerate(rows[:ALLOCATIONS_KEPT]):
        body = text[row.end():rows[i + 1].start() if i + 1 < len(rows) else len(text)]
        shape = re.search(r"Shape: (\w+)\[([0-9,]*)\]", body)
        op = re.search(r'op_name="([^"]*)"', body)
        source = re.search(r'source_file="([^"]*)"\s+source_line=(\d+)', body)
        kind = re.search(r"Allocation type: ([^\n]+)", body)
        found.append(Allocation(
            size(row.group(1), row.group(2)),
            f"{shape.group(1)}[{shape.group(2)}]" if shape else None,
            shape.group(1) if shape else None,
            _short_op(op.group(1)) if op else None,
            f"{source.group(1).rsplit('/', 1)[-1]}:{source.group(2)}" if source else None,
            kind.group(1).strip()[:64] if kind else None))
    return tuple(found)


def _short_op(op_name: str) -> str | None:
    """The op of XLA's op_name path: 'jit(step)/.../dot_general[dimension_numbers=...]'
    -> 'dot_general'."""
    head = op_name.split("[", 1)[0].rstrip("/")
    return head.rsplit("/", 1)[-1][:64] or None
