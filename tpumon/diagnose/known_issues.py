"""Framework releases with a known leak: what to say when a process on one of them leaks.

Kept as data, one entry per issue, so that adding one is a row, not code: the framework
(as the reporter names it), the releases affected (a half-open version range), the cause
the agent must have diagnosed for the entry to apply (tpumon.diagnose.counts' codes), and the
words a person needs: what happens, the fix, and where it is discussed. Matched on the
version each report carries (``fv``), so a job is told about its own release only.

An entry with ``said`` (a regular expression) is matched on a process's last words
instead (tpumon.sources.last_words: the exception or fatal signal it ended with), when its job
ends: its ``cause`` is then ``"last_words"``, never a diagnosed cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownIssue:
    framework: str
    introduced: str | None  # first release affected; None: every release before ``fixed``
    fixed: str | None       # first release with the fix; None: not fixed yet
    cause: str              # the diagnosed cause it explains
    symptom: str
    fix: str
    link: str
    said: str | None = None  # matched on the last words instead of the cause (see above)

    def affects(self, framework: str, version: str | None, cause: str | None) -> bool:
        if framework != self.framework or cause != self.cause:
            return False
        return self.in_release(version)

    def in_release(self, version: str | None) -> bool:
        """Whether ``version`` lies in the releases affected (any, when none are named;
        an unknown version only then)."""
        if self.introduced is None and self.fixed is None:
            return True
        release = parse_version(version) if version is not None else None
        if release is None:
            return False
        low = parse_version(self.introduced) if self.introduced else None
        high = parse_version(self.fixed) if self.fixed else None
        return (low is None or release >= low) and (high is None or release < high)

    def matches(self, framework: str, version: str | None, text: str) -> bool:
        """Whether a process of this release that ended saying ``text`` has this issue."""
        return self.said is not None and framework == self.framework and \
            self.in_release(version) and re.search(self.said, text) is not None

    def text(self) -> str:
        return f"known issue in {self.framework} {self._range()}: {self.symptom}; {self.fix} " \
               f"({self.link})"

    def _range(self) -> str:
        if not self.fixed and not self.introduced:
            return "(every release)"
        if self.fixed and self.introduced:
            return f"{self.introduced} to before {self.fixed}"
        return f"before {self.fixed}" if self.fixed else f"{self.introduced} and later"


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        framework="torch_xla", introduced=None, fixed="2.7", cause="retained_tensors",
        symptom="MarkShardingFunction shards its input in place, which keeps gradient arrays "
                "resident long after the backward pass (OOM on large models)",
        fix="upgrade to torch_xla 2.7 or later (out of place there), or pass a clone: "
            "MarkShardingFunction.apply(t.clone(), mesh, spec) inside forward/backward",
        link="https://github.com/pytorch/xla/issues/8809"),
    KnownIssue(
        framework="torch_xla", introduced=None, fixed="2.7", cause="last_words",
        said=r"RESOURCE_EXHAUSTED|Resource exhausted|[Oo]ut of memory|Ran out of memory",
        symptom="an out-of-memory error on a release where MarkShardingFunction shards in "
                "place and keeps gradient arrays resident after the backward pass",
        fix="if the model uses MarkShardingFunction, upgrade to torch_xla 2.7 or later, or "
            "pass a clone: MarkShardingFunction.apply(t.clone(), mesh, spec)",
        link="https://github.com/pytorch/xla/issues/8809"),
    KnownIssue(
        framework="torch_xla", introduced=None, fixed=None, cause="last_words",
        said=r"Expected XLA tensor\. Got: torch\.\w+|Input tensor is not an XLA tensor",
        symptom="a tensor still on the CPU reached an XLA operation, e.g. xs.mark_sharding "
                "on a model's parameters before the model was moved to the XLA device",
        fix="move the model (and its inputs) to the XLA device first, "
            "model.to(torch_xla.device()), then mark the sharding",
        link="https://github.com/pytorch/xla/issues/8532"),
    KnownIssue(
        framework="torch_xla", introduced=None, fixed=None, cause="last_words",
        said=r"Existing (?:sharding )?annotation,?.{0,80}must be cleared",
        symptom="xs.mark_sharding on a tensor already sharded another way (a sharding is "
                "not replaced, only a replicated one is)",
        fix="clear it first, xs.clear_sharding(t), then mark the new sharding; or mark a "
            "clone",
        link="https://github.com/pytorch/xla/pull/5513"),
)


def parse_version(version: str) -> tuple[int, ...] | None:
    """The leading numeric release of a version string ("2.9.0+git1a2b" -> (2, 9, 0));
    None when it has none."""
    found = re.match(r"(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def known_issue(framework: str, version: str | None, cause: str | None) -> KnownIssue | None:
    """The first known issue that explains ``cause`` in this framework release, if any."""
    return next((k for k in KNOWN_ISSUES if k.affects(framework, version, cause)), None)


def known_issue_said(framework: str, version: str | None, text: str) -> KnownIssue | None:
    """The first known issue of this framework release that a process's last words
    (``text``: its exception's type, message and traceback) match, if any."""
    return next((k for k in KNOWN_ISSUES if k.matches(framework, version, text)), None)
