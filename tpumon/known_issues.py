"""Framework releases with a known leak: what to say when a process on one of them leaks.

Kept as data, one entry per issue, so that adding one is a row, not code: the framework
(as the reporter names it), the releases affected (a half-open version range), the cause
the agent must have diagnosed for the entry to apply (tpumon.detect.counts' codes), and the
words a person needs: what happens, the fix, and where it is discussed. Matched on the
version each report carries (``fv``), so a job is told about its own release only.
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

    def affects(self, framework: str, version: str | None, cause: str | None) -> bool:
        if framework != self.framework or cause != self.cause or version is None:
            return False
        release = parse_version(version)
        if release is None:
            return False
        low = parse_version(self.introduced) if self.introduced else None
        high = parse_version(self.fixed) if self.fixed else None
        return (low is None or release >= low) and (high is None or release < high)

    def text(self) -> str:
        return f"known issue in {self.framework} {self._range()}: {self.symptom}; {self.fix} " \
               f"({self.link})"

    def _range(self) -> str:
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
)


def parse_version(version: str) -> tuple[int, ...] | None:
    """The leading numeric release of a version string ("2.9.0+git1a2b" -> (2, 9, 0));
    None when it has none."""
    found = re.match(r"(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def known_issue(framework: str, version: str | None, cause: str | None) -> KnownIssue | None:
    """The first known issue that explains ``cause`` in this framework release, if any."""
    return next((k for k in KNOWN_ISSUES if k.affects(framework, version, cause)), None)
