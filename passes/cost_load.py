"""How much longer per second a run of one length waits for the CPU than a run of another, under the load now.

Measured on VGG16's training step rewritten at `mid` (574 or 456 recomputations, docs/measurements.md): its CPU time
(8.4-8.6 ms a run, one thread) is what its in-graph costs predict, but with two other busy processes on the 2 cores
its median wall time is 12.4-16.8 ms, while the original step's 3.3 ms runs mostly keep their core (median wall /
CPU time 1.00). A CPU-bound run shorter than the scheduler's time slice seldom loses its core; a longer one loses
it once or more (a busy loop's median wall / CPU time at that load: 1.00 at 1 and 3 ms, 1.50 at 8 ms). Costs scaled
to the original's whole-run median hold the waiting a run of its length meets; a schedule of another length meets
another. Under heavier load it goes the other way: with 8 runnable processes the original's 3 ms of CPU took 16 ms
a run and the rewritten step's 8.5 ms took 37 ms. `load_ratio` times busy loops of both CPU lengths in turns, so
that both meet the same load, and gives the ratio of their median wall / CPU times: 1 on a quiet machine, and where
both lengths span many time slices.
"""

from __future__ import annotations

import math
import statistics
import time

PROBE_SECONDS = 0.5
"""CPU seconds the busy loops of one probe may take in all; they stop early past twice that of wall time (load)."""
MIN_LOOPS = 3
"""Loops of each length at least: fewer fit in PROBE_SECONDS only for runs that both span many time slices."""


def load_ratio(seconds: float, reference: float) -> float:
    """How much longer per second a CPU-bound run of `seconds` takes now than one of `reference` seconds: the ratio
    of their median wall / CPU times over busy loops of both lengths timed in turns, as many as PROBE_SECONDS holds
    (under load the medians of a few flip between a loop that kept its core and one that lost it: with 15 of each,
    runs within 6% of each other measured x0.42); 1.0 when the lengths are equal, or when MIN_LOOPS of each would
    take more than PROBE_SECONDS. Loops stop early past twice PROBE_SECONDS of wall time, one of each at least."""
    loops = int(PROBE_SECONDS / (seconds + reference)) if seconds + reference > 0 else 0
    if math.isclose(seconds, reference, rel_tol=1e-9) or loops < MIN_LOOPS:
        return 1.0
    runs: list[float] = []
    references: list[float] = []
    began = time.perf_counter()
    while len(runs) < loops and (not runs or time.perf_counter() - began < 2 * PROBE_SECONDS):
        runs.append(_slowdown(seconds))
        references.append(_slowdown(reference))
    return statistics.median(runs) / statistics.median(references)


def _slowdown(seconds: float) -> float:
    """Wall time over CPU time of a busy loop that runs for `seconds` of this thread's CPU time."""
    began = time.perf_counter()
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return (time.perf_counter() - began) / seconds
