"""Stop a backend as soon as its incumbent meets a bound proven before it ran (the memory-cut bound).

On training graphs the memory-cut bound often equals the optimum (on 16 of the 18 problems of the peers benchmark,
seeded training chains and U-Nets, the best schedule known meets it; measured), so once the backend finds a
schedule that cheap the schedule is proven optimal and the rest of its search, closing its own weaker bound, is
wasted: HiGHS found the optimum of a 41-operator chain in 2 s and then spent 9 s proving it.
"""

from __future__ import annotations

import threading

from onnx_remat.passes.solve.backend import MilpProgress


def meets(cost: float, bound: float, gap: float) -> bool:
    """Whether a schedule costing `cost` is within the relative `gap` of `bound`, so proven optimal by it."""
    return cost - bound <= gap * cost


class StopAtBound:
    """A backend progress callback that sets `stop` once the incumbent, in seconds (model units times `unit`),
    meets `bound` seconds; `reached` says whether it did. Progress is passed on to `report` (if any)."""

    def __init__(self, bound: float, unit: float, gap: float, stop: threading.Event, report: MilpProgress | None):
        self.bound, self.unit, self.gap, self.stop, self.report = bound, unit, gap, stop, report
        self.reached = False

    def __call__(self, seconds: float, incumbent: float | None, bound: float | None) -> None:
        if self.report is not None:
            self.report(seconds, incumbent, bound)
        if incumbent is not None and not self.reached and meets(incumbent * self.unit, self.bound, self.gap):
            self.reached = True
            self.stop.set()
