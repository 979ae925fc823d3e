"""Argument types shared by the subcommands' parsers."""

from __future__ import annotations

import argparse
import math

LONGEST_SECONDS = 7 * 24 * 3600.0
"""A week: longer limits overflow the solvers' and timers' clocks."""


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds above zero and at most a week."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= LONGEST_SECONDS):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and at most {LONGEST_SECONDS:g}")
    return value
