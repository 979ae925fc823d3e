"""The load ratio of a run of one length against another: busy loops timed in turns. No timed assertions: what is
checked is when it is measured and that it is a ratio of times, never how large it is."""

import math
import statistics

import pytest

from onnx_remat.passes import cost_load
from onnx_remat.passes.cost_load import load_ratio


def test_close_lengths_wait_alike(monkeypatch):
    """Lengths within CLOSE of each other: no loop runs, the ratio is 1."""
    monkeypatch.setattr(cost_load, "_slowdown", lambda seconds: pytest.fail("no loop should run"))
    assert load_ratio(0.004, 0.004) == 1.0
    assert load_ratio(0.004, 0.004 * cost_load.CLOSE * 0.99) == load_ratio(0.004 * cost_load.CLOSE * 0.99, 0.004) == 1.0


def test_runs_too_long_to_probe_are_taken_to_wait_alike(monkeypatch):
    """Lengths of which MIN_LOOPS loops each would pass PROBE_SECONDS: no loop runs, the ratio is 1."""
    monkeypatch.setattr(cost_load, "_slowdown", lambda seconds: pytest.fail("no loop should run"))
    too_long = cost_load.PROBE_SECONDS / cost_load.MIN_LOOPS
    assert load_ratio(too_long, too_long / 2) == 1.0


def test_the_ratio_is_the_median_over_pairs_of_loops(monkeypatch):
    """Loops of both lengths run in pairs, in alternating order, as many as fit in PROBE_SECONDS (fewer if they pass
    twice that of wall time), and the ratio is the median of the pairs' ratios; each loop really ran at least its
    length (its wall time over its CPU time is at least 1)."""
    timed: list[tuple[float, float]] = []
    slowdown = cost_load._slowdown

    def recorded(seconds: float) -> float:
        timed.append((seconds, slowdown(seconds)))
        return timed[-1][1]

    monkeypatch.setattr(cost_load, "_slowdown", recorded)
    ratio = load_ratio(0.02, 0.01)
    pairs = len(timed) // 2
    assert 1 <= pairs <= int(cost_load.PROBE_SECONDS / 0.03)
    assert [seconds for seconds, _ in timed] == [0.02, 0.01, 0.01, 0.02] * (pairs // 2) + [0.02, 0.01] * (pairs % 2)
    assert all(value >= 1 for _, value in timed)
    slowdowns = [dict(timed[2 * k:2 * k + 2]) for k in range(pairs)]
    assert math.isclose(ratio, statistics.median(pair[0.02] / pair[0.01] for pair in slowdowns))
