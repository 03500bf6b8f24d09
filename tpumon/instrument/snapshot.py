"""Live-tensor snapshots: what a training process holds on its devices, grouped by shape,
dtype and device, with where the tensors were created when that is known.

A reporter takes one at a step boundary when the agent asks (``live_torch_xla`` and
``live_jax`` build them); the agent diffs two (``tpumon.sources.tensor_diff``) to name the
tensors a leak is made of. The wire form is JSON of bounded size (``to_json``): the
largest groups are kept, the rest only counted. ``from_json`` is strict because the
agent reads it from another process: anything malformed is a ``ValueError``, never
another exception, and nothing unbounded gets through.

Standard library only: this module is imported inside the training process.
"""

from __future__ import annotations

import io
import json
import linecache
import os
import re
import sys
import sysconfig
import time
import tokenize
from dataclasses import dataclass, field
from typing import Any

from tpumon.instrument.protocol import TRACK_SITES_ENV

#: Bumped on any change to the wire form; from_json accepts only this one.
FORMAT_VERSION = 1
#: Limits from_json enforces (and to_json keeps to): the agent keeps snapshots in memory.
MAX_INPUT_BYTES = 1 << 20
MAX_GROUPS = 4096
MAX_SITES = 64            # per group
MAX_DIMS = 64            # torch's own limit
MAX_DIM = 1 << 48
MAX_COUNT = 1 << 48
MAX_BYTES = 1 << 62
MAX_STEP = 1 << 62
MAX_SITE_CHARS = 200
MAX_DEVICE_CHARS = 96
MAX_NAME_CHARS = 32       # framework and dtype
MAX_TIME = 1e11           # wall-clock seconds (year ~5138)
MAX_DURATION = 1e6

_NAME = re.compile(r"[a-z0-9_]{1,%d}\Z" % MAX_NAME_CHARS)
_TOP_KEYS = frozenset({"v", "framework", "step", "time", "duration_s", "total_count",
                       "total_bytes", "tracking", "truncated_groups", "groups"})
_GROUP_KEYS = frozenset({"shape", "dtype", "device", "count", "bytes", "sites"})


@dataclass
class TensorGroup:
    """Live tensors of one shape, dtype and device (or sharding).

    ``device`` is "" for the process's default device, else a short description (another
    device, or a sharding). ``sites`` maps a creation site ("train.py:88 (loss = ...)")
    to how many of the group's tensors were created there; it is empty when unknown and
    may cover fewer than ``count`` tensors (created before tracking, or cut for size).
    """

    shape: tuple[int, ...]
    dtype: str
    device: str
    count: int
    bytes: int
    sites: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[tuple[int, ...], str, str]:
        """What a diff matches groups on."""
        return self.shape, self.dtype, self.device

    def label(self) -> str:
        """XLA's notation: ``f32[]``, ``bf16[4096,14336]``, ``f32[8]@xla:1``."""
        text = f"{short_dtype(self.dtype)}[{','.join(map(str, self.shape))}]"
        return f"{text}@{self.device}" if self.device else text


@dataclass
class Snapshot:
    """One process's live tensors at one step (``groups`` may be a truncated list: the
    totals cover every tensor, ``truncated_groups`` counts the groups left out)."""

    framework: str
    step: int
    time: float
    duration_s: float
    groups: list[TensorGroup]
    total_count: int
    total_bytes: int
    tracking: bool
    truncated_groups: int = 0

    def to_json(self, max_bytes: int = 60000) -> bytes:
        """At most ``max_bytes`` of JSON: the largest groups (by bytes, then count) first,
        then as many of their sites (most tensors first) as still fit. Raises ValueError
        only when not even the totals fit."""
        groups = sorted(self.groups, key=lambda g: (-g.bytes, -g.count, g.label()))
        truncated = self.truncated_groups + max(len(groups) - MAX_GROUPS, 0)
        kept, dropped = _fit_groups(self, groups[:MAX_GROUPS], max_bytes, truncated)
        return _encode(self, kept, truncated + dropped)

    @classmethod
    def from_json(cls, data: bytes) -> Snapshot:
        """The snapshot in ``data``; ValueError (with a short reason) if it is anything but a
        well-formed one within the limits above."""
        try:
            return _decode(data)
        except _Invalid as e:
            raise ValueError(f"bad snapshot: {e}") from None
        except (ValueError, TypeError, RecursionError, OverflowError, MemoryError):
            raise ValueError("bad snapshot: not valid JSON") from None


_NUMERIC = re.compile(r"(float|int|uint|complex)(\d+)(_\w+)?\Z")
_SPECIAL = {"bool": "pred", "half": "f16", "float": "f32", "double": "f64",
            "bfloat16": "bf16", "long": "s64", "int": "s32", "short": "s16",
            "cfloat": "c64", "cdouble": "c128"}


def short_dtype(name: str) -> str:
    """XLA's short name for a torch or NumPy/JAX dtype name: float32 -> f32, bfloat16 ->
    bf16, int32 -> s32, uint8 -> u8, bool -> pred, float8_e4m3fn -> f8e4m3fn; a name it
    does not know comes back as it is (minus a ``torch.`` prefix)."""
    name = name.removeprefix("torch.")
    if name in _SPECIAL:
        return _SPECIAL[name]
    m = _NUMERIC.match(name)
    if not m:
        return name
    kind, bits, rest = m.group(1), m.group(2), (m.group(3) or "").lstrip("_")
    return {"float": "f", "int": "s", "uint": "u", "complex": "c"}[kind] + bits + rest


# -- encoding -------------------------------------------------------------------------

def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _group_json(g: TensorGroup, sites: list[tuple[str, int]]) -> str:
    body = _dumps({"shape": list(g.shape), "dtype": g.dtype, "device": g.device,
                   "count": g.count, "bytes": g.bytes})
    return f'{body[:-1]},"sites":{{{",".join(_site_json(s, n) for s, n in sites)}}}}}'


def _site_json(site: str, n: int) -> str:
    return f"{_dumps(site)}:{n}"


def _header(s: Snapshot, truncated: int) -> str:
    """The JSON object up to the groups' opening bracket."""
    head = _dumps({"v": FORMAT_VERSION, "framework": s.framework, "step": s.step,
                   "time": s.time, "duration_s": s.duration_s, "total_count": s.total_count,
                   "total_bytes": s.total_bytes, "tracking": s.tracking,
                   "truncated_groups": truncated})
    return head[:-1] + ',"groups":['


def _fit_groups(s: Snapshot, groups: list[TensorGroup], max_bytes: int,
                truncated: int) -> tuple[list[tuple[TensorGroup, list[tuple[str, int]]]], int]:
    """Groups (largest first) with the sites that fit, and how many groups did not. The
    size is counted exactly: the output is the concatenation of these very pieces."""
    # the header is sized for the worst truncation count, so it can only come out shorter
    budget = max_bytes - len(_header(s, truncated + len(groups))) - 2
    if budget < 0:
        raise ValueError(f"max_bytes={max_bytes} is too small for a snapshot")
    kept: list[tuple[TensorGroup, list[tuple[str, int]]]] = []
    for g in groups:
        size = len(_group_json(g, [])) + (1 if kept else 0)
        if size > budget:
            break
        budget -= size
        kept.append((g, []))
    for g, sites in kept:  # sites, largest groups first, most tensors first
        for site, n in sorted(g.sites.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SITES]:
            size = len(_site_json(site, n)) + (1 if sites else 0)
            if size > budget:
                return kept, len(groups) - len(kept)
            budget -= size
            sites.append((site, n))
    return kept, len(groups) - len(kept)


def _encode(s: Snapshot, kept: list[tuple[TensorGroup, list[tuple[str, int]]]],
            truncated: int) -> bytes:
    body = ",".join(_group_json(g, sites) for g, sites in kept)
    return f"{_header(s, truncated)}{body}]}}".encode()


# -- strict decoding --------------------------------------------------------------------

class _Invalid(Exception):
    """A reason a snapshot is rejected (turned into ValueError at the boundary)."""


def _reject_constant(name: str) -> None:
    raise _Invalid(f"{name} is not a number")


def _decode(data: bytes) -> Snapshot:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _Invalid("not bytes")
    if len(data) > MAX_INPUT_BYTES:
        raise _Invalid(f"over {MAX_INPUT_BYTES} bytes")
    doc = json.loads(bytes(data).decode("utf-8"), parse_constant=_reject_constant)
    _keys(doc, _TOP_KEYS, "snapshot")
    if _int(doc["v"], "v", 1 << 16) != FORMAT_VERSION:
        raise _Invalid(f"format version {doc['v']}, not {FORMAT_VERSION}")
    groups = doc["groups"]
    if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
        raise _Invalid(f"groups: not a list of at most {MAX_GROUPS}")
    snap = Snapshot(framework=_name(doc["framework"], "framework"),
                    step=_int(doc["step"], "step", MAX_STEP),
                    time=_float(doc["time"], "time", MAX_TIME),
                    duration_s=_float(doc["duration_s"], "duration_s", MAX_DURATION),
                    groups=[_group(g) for g in groups],
                    total_count=_int(doc["total_count"], "total_count", MAX_COUNT),
                    total_bytes=_int(doc["total_bytes"], "total_bytes", MAX_BYTES),
                    tracking=_bool(doc["tracking"], "tracking"),
                    truncated_groups=_int(doc["truncated_groups"], "truncated_groups", MAX_COUNT))
    _consistent(snap)
    return snap


def _consistent(snap: Snapshot) -> None:
    if len({g.key for g in snap.groups}) != len(snap.groups):
        raise _Invalid("the same group twice")
    if sum(g.count for g in snap.groups) > snap.total_count:
        raise _Invalid("groups hold more tensors than total_count")
    if sum(g.bytes for g in snap.groups) > snap.total_bytes:
        raise _Invalid("groups hold more bytes than total_bytes")


def _group(doc: Any) -> TensorGroup:
    _keys(doc, _GROUP_KEYS, "group")
    shape = doc["shape"]
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise _Invalid(f"shape: not a list of at most {MAX_DIMS} dims")
    count = _int(doc["count"], "count", MAX_COUNT)
    sites = doc["sites"]
    if not isinstance(sites, dict) or len(sites) > MAX_SITES:
        raise _Invalid(f"sites: not an object of at most {MAX_SITES}")
    group = TensorGroup(shape=tuple(_int(d, "dim", MAX_DIM) for d in shape),
                        dtype=_name(doc["dtype"], "dtype"),
                        device=_text(doc["device"], "device", MAX_DEVICE_CHARS, empty=True),
                        count=count, bytes=_int(doc["bytes"], "bytes", MAX_BYTES),
                        sites={_text(k, "site", MAX_SITE_CHARS): _int(v, "site count", MAX_COUNT)
                               for k, v in sites.items()})
    if sum(group.sites.values()) > count:
        raise _Invalid("sites hold more tensors than the group")
    return group


def _keys(doc: Any, expected: frozenset[str], what: str) -> None:
    if not isinstance(doc, dict):
        raise _Invalid(f"{what}: not an object")
    if doc.keys() != expected:
        missing, extra = sorted(expected - doc.keys()), sorted(doc.keys() - expected)
        raise _Invalid(f"{what}: missing {missing[:3]}" if missing else
                       f"{what}: unknown keys {[k[:20] for k in extra[:3]]}")


def _int(value: Any, what: str, limit: int) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise _Invalid(f"{what}: not an integer in [0, {limit}]")
    return value


def _float(value: Any, what: str, limit: float) -> float:
    if type(value) not in (int, float) or not 0 <= value <= limit:  # NaN fails both
        raise _Invalid(f"{what}: not a number in [0, {limit:g}]")
    return float(value)


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise _Invalid(f"{what}: not true/false")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise _Invalid(f"{what}: not a short lower-case name")
    return value


def _text(value: Any, what: str, limit: int, empty: bool = False) -> str:
    if (not isinstance(value, str) or len(value) > limit or not (value or empty)
            or not value.isprintable()):
        raise _Invalid(f"{what}: not printable text of 1-{limit} characters")
    return value


def clean_text(text: str, limit: int) -> str:
    """For producers: ``text`` as from_json accepts it (printable, at most ``limit``
    characters; a cut is marked with "...")."""
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


#: What producers count: (shape, dtype name, device, site or None) -> [count, bytes].
Counts = dict[tuple[tuple[int, ...], str, str, "str | None"], list[int]]


def make_snapshot(framework: str, step: int, started: float, tracking: bool,
                  counts: Counts) -> Snapshot:
    """For producers: a Snapshot from ``{(shape, dtype, device, site or None): [count,
    bytes]}``, stamped now; ``started`` is the ``time.perf_counter()`` the walk began at.
    Whatever ``from_json`` would refuse is made acceptable here (a dtype name like
    ``key<fry>`` becomes ``key_fry_``) or, for a shape beyond the limits, counted in the
    totals and as a truncated group, so that one odd tensor cannot void a snapshot."""
    groups: dict[tuple[tuple[int, ...], str, str], TensorGroup] = {}
    unlisted: set[tuple[Any, ...]] = set()
    extra_count = extra_bytes = 0
    for (shape, dtype, device, site), (count, nbytes) in counts.items():
        if len(shape) > MAX_DIMS or any(not 0 <= d <= MAX_DIM for d in shape):
            unlisted.add((shape, dtype, device))
            extra_count, extra_bytes = extra_count + count, extra_bytes + nbytes
            continue
        key = (shape, _clean_name(dtype), device)
        g = groups.get(key)
        if g is None:
            g = groups[key] = TensorGroup(*key, 0, 0)
        g.count += count
        g.bytes += nbytes
        if site is not None:
            g.sites[site] = g.sites.get(site, 0) + count
    listed = list(groups.values())
    return Snapshot(framework=framework, step=min(max(int(step), 0), MAX_STEP),
                    time=time.time(), duration_s=max(time.perf_counter() - started, 0.0),
                    groups=listed, total_count=sum(g.count for g in listed) + extra_count,
                    total_bytes=sum(g.bytes for g in listed) + extra_bytes,
                    tracking=tracking, truncated_groups=len(unlisted))


def _clean_name(name: str) -> str:
    name = re.sub(r"[^a-z0-9_]", "_", name.lower())[:MAX_NAME_CHARS]
    return name or "unknown"


class SiteNamer:
    """Names creation sites "train.py:88 (loss = model(x).mean())" and tells framework
    code from user code, with caches so that naming costs a dict lookup once warm.

    Internal code is that of ``packages`` (the framework's), of tpumon and of the standard
    library; a site is the innermost frame outside them. A file under the working
    directory is named by its relative path, any other by its base name (kept short).
    """

    #: Caches are cleared at this size (generated code can bring new file names forever).
    MAX_CACHED = 20000
    SOURCE_CHARS = 60

    def __init__(self, packages: tuple[str, ...]) -> None:
        import tpumon
        dirs = [_package_dir(sys.modules.get(name)) for name in packages]
        dirs.append(_package_dir(tpumon))
        self._prefixes = tuple(d for d in dirs if d)
        self._stdlib = tuple({os.path.join(sysconfig.get_paths()[k], "")
                              for k in ("stdlib", "platstdlib")})
        self._cwd: str | None
        try:
            self._cwd = os.path.join(os.getcwd(), "")
        except OSError:
            self._cwd = None
        self.verdicts: dict[str, bool] = {}  # file name -> internal (read by hot loops)
        self._names: dict[tuple[str, int], str] = {}

    def internal(self, filename: str) -> bool:
        """Whether code from ``filename`` is the framework's, tpumon's or Python's own."""
        known = self.verdicts.get(filename)
        if known is None:
            if len(self.verdicts) > self.MAX_CACHED:
                self.verdicts.clear()
            known = self.verdicts[filename] = self._classify(filename)
        return known

    def name(self, filename: str, lineno: int) -> str:
        """The site text for a line (cached per file and line)."""
        key = (filename, lineno)
        text = self._names.get(key)
        if text is None:
            if len(self._names) > self.MAX_CACHED:
                self._names.clear()
            text = self._names[key] = self._format(filename, lineno)
        return text

    def _classify(self, filename: str) -> bool:
        if filename.startswith(("<frozen ", "<eval_with_key")):
            return True
        if filename.startswith(self._prefixes):
            return True
        for lib in self._stdlib:
            if filename.startswith(lib):
                return "-packages" not in filename[len(lib):]
        return False

    def _format(self, filename: str, lineno: int) -> str:
        if self._cwd and filename.startswith(self._cwd):
            path = filename[len(self._cwd):]
        else:
            path = os.path.basename(filename) or filename
        source = _without_comment(linecache.getline(filename, lineno).strip())
        if len(source) > self.SOURCE_CHARS:
            source = source[:self.SOURCE_CHARS - 3] + "..."
        text = f"{path}:{lineno} ({source})" if source else f"{path}:{lineno}"
        return clean_text(text, MAX_SITE_CHARS)


def _without_comment(line: str) -> str:
    """The line without a trailing comment (a "#" inside a string stays)."""
    if "#" not in line:
        return line
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[:token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a line of a longer statement
        pass
    return line


def _package_dir(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    return os.path.join(os.path.dirname(os.path.abspath(path)), "") if path else None


def track_sites_setting(value: bool | None) -> bool:
    """A reporter's ``track_sites`` argument, or when None, ``$TPUMON_TRACK_SITES``
    ("1", "true", "yes", "on": on; anything else: off)."""
    if value is not None:
        return bool(value)
    setting = os.environ.get(TRACK_SITES_ENV, "").strip().lower()
    return setting in ("1", "true", "yes", "on")
