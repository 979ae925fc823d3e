"""Parse memory budgets: bytes with or without a unit, a percentage of keep-all, or `min`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from onnx_remat.errors import UsageError

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

    def resolve(self, keep_all_bytes: int, minimum_bytes: int) -> int:
        """The budget in bytes, given the model's keep-all and minimum feasible memory."""
        if self.minimum:
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


def format_bytes(count: float) -> str:
    """Human-readable binary size, e.g. `12.5 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")
