"""The command line both training loops take."""

import argparse


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--leak", action="store_true", help="keep every step's loss")
    parser.add_argument("--recompile", action="store_true", help="a new shape every 10 steps")
    return parser.parse_args()
