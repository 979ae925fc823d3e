"""How much longer per second a run of one length waits for the CPU than a run of another, under the load now.

Measured on VGG16's training step rewritten at `mid` (574 or 456 recomputations, docs/measurements.md): its CPU time
(8.4-8.6 ms a run, one thread) is what its in-graph costs predict, but with two other busy processes on the 2 cores
its median wall time is 12.4-16.8 ms, while the original step's 3.3 ms runs mostly keep their core (median wall /
CPU time 1.00). A CPU-bound run shorter than the scheduler's time slice seldom loses its core; a longer one loses
it once or more (a busy loop's median wall / CPU time at that load: 1.00 at 1 and 3 ms, 1.50 at 8 ms). Costs scaled
to the original's whole-run median hold the waiting a run of its length meets; a schedule of another length meets
another. Under heavier load it goes the other way: with 8 runnable processes the original's 3 ms of CPU took 16 ms
a run and the rewritten step's 8.5 ms took 37 ms. `load_ratio` times busy loops of both CPU lengths in pairs, one
right after the other (in alternating order) so that both meet the same load, and gives the median over the pairs
of the ratio of their wall / CPU times: 1 on a quiet machine and where both lengths span many time slices. Lengths
closer than CLOSE are taken to wait alike: the probe's own scatter there is larger than the effect (at load average
12, five probes of lengths 0.5% apart gave 0.83-0.98 at 3 ms, 0.81-1.06 at 8 ms, 0.90-1.13 at 30 ms; the ratio of
the two lengths' medians, before pairs, gave x1.19 and x0.42 in single reports).
"""

from __future__ import annotations

import statistics
import time

PROBE_SECONDS = 0.5
"""CPU seconds the busy loops of one probe may take in all; they stop early past twice that of wall time (load)."""
CLOSE = 1.5
"""Lengths within this factor of each other wait alike as far as the probe can tell (see the module docstring)."""
MIN_LOOPS = 3
"""Pairs of loops at least: fewer fit in PROBE_SECONDS only for runs that both span many time slices."""


def load_ratio(seconds: float, reference: float) -> float:
    """How much longer per second a CPU-bound run of `seconds` takes now than one of `reference` seconds: the median
    over pairs of busy loops, one of each length, of the ratio of their wall / CPU times, as many pairs as
    PROBE_SECONDS holds; 1.0 when the lengths are within CLOSE of each other, or when MIN_LOOPS pairs would take more
    than PROBE_SECONDS. Pairs stop early past twice PROBE_SECONDS of wall time, one at least."""
    loops = int(PROBE_SECONDS / (seconds + reference)) if seconds + reference > 0 else 0
    if max(seconds, reference) < CLOSE * min(seconds, reference) or loops < MIN_LOOPS:
        return 1.0
    ratios: list[float] = []
    began = time.perf_counter()
    while len(ratios) < loops and (not ratios or time.perf_counter() - began < 2 * PROBE_SECONDS):
        ratios.append(_pair_ratio(seconds, reference, first=len(ratios) % 2 == 0))
    return statistics.median(ratios)


def _pair_ratio(seconds: float, reference: float, first: bool) -> float:
    """The slowdown of a loop of `seconds` over that of one of `reference` right before or after it (`first`: the
    loop of `seconds` runs first), so that both meet the same load and neither always starts a pair."""
    if first:
        run = _slowdown(seconds)
        return run / _slowdown(reference)
    other = _slowdown(reference)
    return _slowdown(seconds) / other


def _slowdown(seconds: float) -> float:
    """Wall time over CPU time of a busy loop that runs for `seconds` of this thread's CPU time."""
    began = time.perf_counter()
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return (time.perf_counter() - began) / seconds
