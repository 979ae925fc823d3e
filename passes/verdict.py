"""Whether a device's peak is within its budget, judged within the spread of measurements in fresh processes.

The peak one fresh process measures moves with where glibc's heap happens to place the run's tensors (what it keeps
between runs, which held values take whole pages), from one process to the next: the legacy export of a small ViT
encoder rewritten at its 226 KiB minimum measured 154, 210 and 270 KiB in three processes; MobileNetV3-small's
dynamo export at its 13.59 MiB minimum 13.53-13.69 MiB. One process landing near the budget therefore says little.
So: a device is over its budget only when every process measured it over, within it when every one measured it
within, and otherwise the budget lies inside the measurements' spread, which is no failure (docs/measurements.md).
More processes are measured only when the first lands within `NEAR_SHARE` of a budget (`NEAR_BYTES` at least) or over
it, so that a model far from its budget pays for one.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

NEAR_SHARE = 0.02
"""A first measurement this share of the budget below it or closer is measured again (spreads seen: 0.3-1.7%)."""
NEAR_BYTES = 1 << 20
"""...and at least this many bytes below it: small models spread by tens of KiB, DenseNet-121's step by 1 MiB."""


class Verdict(enum.Enum):
    """A device's peak against its budget: every measurement within, every one over, or the budget between them."""

    WITHIN = "within"
    SPREAD = "within the measurement's spread"
    OVER = "OVER BUDGET"


def judge(peaks: Sequence[int], budget: int) -> Verdict:
    """The verdict on a device's peaks (one per fresh process, or the predicted one alone) against its budget."""
    if not peaks:
        raise ValueError("judging a budget needs at least one peak")
    if max(peaks) <= budget:
        return Verdict.WITHIN
    if min(peaks) > budget:
        return Verdict.OVER
    return Verdict.SPREAD


def near_budget(peak: int, budget: int | None) -> bool:
    """Whether one measured peak is too close to its budget (or over it) for one process to decide."""
    return budget is not None and peak > budget - max(NEAR_SHARE * budget, NEAR_BYTES)
