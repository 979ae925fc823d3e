"""Parse memory budgets: bytes with or without a unit, a percentage of keep-all, or `min`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnx_remat.core.errors import InfeasibleBudgetError, UsageError

if TYPE_CHECKING:
    from onnx_remat.core.problem import Problem

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*|%)\s*$")


@dataclass(frozen=True)
class Budget:
    """A budget as the user gave it: absolute bytes, a fraction of keep-all, or the minimum."""

    absolute_bytes: int | None = None
    fraction: float | None = None
    minimum: bool = False

    def resolve(self, keep_all_bytes: int, minimum_bytes: int | None = None) -> int:
        """The budget in bytes, given the model's keep-all and (for `min`) minimum feasible memory."""
        if self.minimum:
            if minimum_bytes is None:
                raise ValueError("a budget of min resolves only against a known minimum")
            return minimum_bytes
        if self.fraction is not None:
            return int(keep_all_bytes * self.fraction)
        assert self.absolute_bytes is not None
        return self.absolute_bytes

    def __str__(self) -> str:
        if self.minimum:
            return "min"
        if self.fraction is not None:
            return f"{self.fraction * 100:g}%"
        return format_bytes(self.absolute_bytes or 0)


def parse_budget(text: str) -> Budget:
    """Parse `512MiB`, `1.5GB`, `1073741824`, `25%` or `min`."""
    if text.strip().lower() == "min":
        return Budget(minimum=True)
    if text.strip().startswith("-"):
        raise UsageError(f"budget {text!r} is negative: give a size above zero (512MiB, 25%) or min")
    match = _PATTERN.match(text)
    if not match:
        raise UsageError(
            f"cannot read budget {text!r}: give bytes with an optional unit (512MiB, 1.5GB, 1073741824), "
            "a percentage of keep-all (25%), or min"
        )
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%":
        if not number > 0:
            raise UsageError(f"budget {text!r} must be a positive percentage of keep-all")
        return Budget(fraction=number / 100)
    if unit not in _UNITS:
        raise UsageError(f"unknown unit {match.group(2)!r} in budget {text!r}: use B, KB, MB, GB, KiB, MiB or GiB")
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise UsageError(f"budget {text!r} must be more than zero bytes")
    return Budget(absolute_bytes=value)


def format_bytes(count: float, digits: int = 1) -> str:
    """Human-readable binary size with `digits` decimals, e.g. `12.5 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.{digits}f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def below_minimum(
    problem: Problem, device: int, budget: int, minimum: int, headroom: float = 0.0
) -> InfeasibleBudgetError:
    """The one refusal of a budget below a device's minimum: the minimum in bytes and in percent of keep-all, and what
    to raise; the device named when there are several. `headroom`: the share taken off `budget` before it fell short."""
    keep_all = problem.keep_all_bytes(device)
    amount = f"{format_bytes(minimum)} ({minimum} bytes, {100 * minimum / keep_all:.1f}% of keep-all)"
    asked, least = format_bytes(budget), "that"
    if headroom:
        asked = f"{asked} less {100 * headroom:g}% headroom, {format_bytes(budget - int(headroom * budget))},"
        least = f"{format_bytes(math.ceil(minimum / (1 - headroom)))} or lower the headroom"
    if problem.num_devices == 1:
        message = f"budget {asked} is below the minimum feasible budget {amount}: raise --budget to at least {least}"
    else:
        name = problem.devices[device]
        message = (f"device {name}: budget {asked} is below its minimum feasible budget {amount} with the other "
                   f"devices at their budgets: raise --budget {name}= to at least {least}")
    return InfeasibleBudgetError(message, minimum)
