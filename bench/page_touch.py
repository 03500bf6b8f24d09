"""What a memory page costs the first time a process touches it after sleeping (issue 25).

The agent sleeps for most of each second and then runs a poll; what that poll costs
depends less on its instructions than on how many distinct pages it touches, when the
machine charges for each page touched after an idle spell (on a VM: a TLB miss walked
through the guest's and the host's page tables, with caches gone cold). This measures it
directly: one byte in each of ``--pages`` pages of an anonymous buffer, read back to back
and then after sleeping ``--gap`` seconds before each pass (thread CPU time, median of
``--passes``), with the buffer on 4 KiB pages and advised for transparent huge pages
(what ``PYTHONMALLOC=malloc GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` give the agent's heap:
docs/configuration.md). With ``--pid``, also the pages a
running process touches a second, by mapping (its referenced bits cleared, then read back
after one second; needs the right to write /proc/PID/clear_refs, i.e. root or the owner).
"""

from __future__ import annotations

import argparse
import collections
import mmap
import re
import statistics
import time
from pathlib import Path

PAGE = 4096


def buffer(pages: int, huge: bool) -> mmap.mmap:
    """An anonymous private buffer (a shared one is shmem, which THP leaves alone here)."""
    m = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    for offset in range(0, pages * PAGE, PAGE):
        m[offset] = 1
    return m


def touch(m: mmap.mmap, pages: int) -> int:
    total = 0
    for offset in range(0, pages * PAGE, PAGE):
        total += m[offset]
    return total


def pass_times(m: mmap.mmap, pages: int, gap: float, passes: int) -> float:
    """Median thread CPU seconds of a pass, sleeping ``gap`` before each."""
    times = []
    for _ in range(passes):
        if gap:
            time.sleep(gap)
        started = time.thread_time()
        touch(m, pages)
        times.append(time.thread_time() - started)
    return statistics.median(times)


def huge_bytes() -> int:
    rollup = Path("/proc/self/smaps_rollup").read_text()
    found = re.search(r"AnonHugePages:\s+(\d+)", rollup)
    return int(found.group(1)) * 1024 if found else 0


def pages_touched(pid: int, seconds: float, rounds: int) -> collections.Counter:
    """4 KiB pages referenced per ``seconds`` by mapping (a huge page counts as 512)."""
    totals: collections.Counter = collections.Counter()
    for _ in range(rounds):
        Path(f"/proc/{pid}/clear_refs").write_text("1")
        time.sleep(seconds)
        name = "?"
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                name = parts[5].rsplit("/", 1)[-1] if len(parts) > 5 else "[anonymous]"
            elif line.startswith("Referenced:"):
                totals[name] += int(line.split()[1]) * 1024 // PAGE
    return collections.Counter({k: v // rounds for k, v in totals.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2048)
    parser.add_argument("--gaps", default="0,0.1,1", help="seconds slept before each pass")
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--pid", type=int, help="also count a running process's pages")
    args = parser.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    plain, huge = buffer(args.pages, False), buffer(args.pages, True)
    print(f"# {args.pages} pages ({args.pages * PAGE >> 20} MiB), one byte each; the advised "
          f"buffer holds {huge_bytes() >> 20} MiB of transparent huge pages")
    print("| slept before each pass | 4 KiB pages: a pass | a page | huge pages: a pass | ratio |")
    print("|---|---|---|---|---|")
    for gap in gaps:
        small = pass_times(plain, args.pages, gap, args.passes)
        large = pass_times(huge, args.pages, gap, args.passes)
        print(f"| {gap:g} s | {small * 1e3:.3f} ms | {small / args.pages * 1e6:.2f} us "
              f"| {large * 1e3:.3f} ms | {small / large:.1f}x |")
    if args.pid:
        counts = pages_touched(args.pid, 1.0, 8)
        print(f"\n# process {args.pid}: 4 KiB pages touched a second, {sum(counts.values())} "
              "in all (a huge page counts as 512)")
        for name, n in counts.most_common(10):
            print(f"{n:8d}  {name}")


if __name__ == "__main__":
    main()
