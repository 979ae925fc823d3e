"""Argument types shared by the subcommands' parsers."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from collections.abc import Iterable
from pathlib import Path

from onnx_remat.errors import UsageError

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


NEGATIVE_VALUE = re.compile(r"-[\d.]")


def join_negative_values(argv: list[str]) -> list[str]:
    """`--budget -5%` as `--budget=-5%`: argparse takes a value starting with '-' for an option and says only
    "expected one argument"; joined, the value reaches its own check and that check's message."""
    joined: list[str] = []
    for token in argv:
        if joined and NEGATIVE_VALUE.match(token) and joined[-1].startswith("--") and "=" not in joined[-1]:
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def check_not_mistyped_command(first: str, commands: Iterable[str]) -> None:
    """Refuse a first argument that is no file but close to a command's name (`swep`), which would otherwise be
    read as the input model."""
    if Path(first).exists() or first.startswith("-"):
        return
    close = difflib.get_close_matches(first, list(commands), n=1, cutoff=0.6)
    if close:
        raise UsageError(f"no command or file {first!r}: did you mean `onnx-remat {close[0]} ...`?")
