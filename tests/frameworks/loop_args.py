"""The command line the training loops take."""

import argparse
import itertools
import time
from typing import Iterator


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--leak", action="store_true", help="keep a device tensor every step")
    parser.add_argument("--host-leak", action="store_true",
                        help="keep a host-side array every step (RSS grows, HBM does not)")
    parser.add_argument("--recompile", action="store_true", help="a new shape every 10 steps")
    parser.add_argument("--mark-function", action="store_true",
                        help="SPMD loop: MarkShardingFunction on parameters and activations")
    parser.add_argument("--min-seconds", type=float, default=0.0,
                        help="go on past --steps until this long has passed: the reporter "
                             "sends at most 20 reports a second, a fast loop needs the time")
    return parser.parse_args()


def steps(args: argparse.Namespace) -> Iterator[int]:
    """1, 2, ... up to --steps, and on until --min-seconds have passed."""
    start = time.monotonic()
    for step in itertools.count(1):
        if step > args.steps and time.monotonic() - start >= args.min_seconds:
            return
        yield step
