"""The budget verdict within the spread of fresh processes' measurements, and how `onnx-remat run` states it."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_remat.cli.commands.run import summary_lines
from onnx_remat.passes.run_devices import DeviceRun
from onnx_remat.passes.verdict import NEAR_BYTES, Verdict, judge, near_budget

KIB = 1024
MIB = 1 << 20


@pytest.mark.parametrize(
    ("peaks", "budget", "verdict"),
    [
        ((154 * KIB, 210 * KIB, 270 * KIB), 226 * KIB, Verdict.SPREAD),  # the ViT encoder's three processes
        ((250 * KIB, 258 * KIB, 266 * KIB), 226 * KIB, Verdict.OVER),
        ((154 * KIB, 210 * KIB, 226 * KIB), 226 * KIB, Verdict.WITHIN),  # at the budget is within it
        ((227 * KIB,), 226 * KIB, Verdict.OVER),  # one process (--memory-processes 1, or a predicted peak)
        ((100 * KIB,), 226 * KIB, Verdict.WITHIN),
    ],
)
def test_a_device_is_over_only_when_every_process_measured_it_over(peaks, budget, verdict):
    assert judge(peaks, budget) is verdict


def test_judging_nothing_is_refused():
    with pytest.raises(ValueError, match="at least one peak"):
        judge((), 1)


@pytest.mark.parametrize(
    ("peak", "budget", "near"),
    [
        (13 * MIB, 100 * MIB, False),  # far below: one process decides
        (98 * MIB, 100 * MIB + 1, False),  # just over 2% below
        (99 * MIB, 100 * MIB, True),  # within 2%
        (101 * MIB, 100 * MIB, True),  # over
        (200 * KIB, 226 * KIB, True),  # a small budget: within 1 MiB
        (10 * MIB - NEAR_BYTES - 1, 10 * MIB, False),
        (5 * MIB, None, False),  # no budget, nothing to decide
    ],
)
def test_a_peak_near_its_budget_or_over_it_asks_for_more_processes(peak, budget, near):
    assert near_budget(peak, budget) is near


def device_run(samples: dict[str, tuple[int, ...]] | None, budgets: dict[str, int | None]) -> DeviceRun:
    """A run of devices `budgets` names, predicted at 100 KiB each, measured `samples` (None: not measured)."""
    names = list(budgets)
    return DeviceRun(
        outputs={"y": np.zeros(1)}, seconds=0.01, device_seconds=dict.fromkeys(names, 0.004), handoff_seconds=0.002,
        predicted_peak_bytes=dict.fromkeys(names, 100 * KIB), budgets=budgets, segments=dict.fromkeys(names, 1),
        copies=0, measured_peak_samples=samples,
    )


def test_the_run_goes_by_the_verdicts_and_states_median_and_range():
    run = device_run({"cpu": (154 * KIB, 210 * KIB, 270 * KIB), "gpu": (5 * MIB, 6 * MIB, 7 * MIB),
                      "npu": (1 * MIB,)}, {"cpu": 226 * KIB, "gpu": 4 * MIB, "npu": None})
    assert run.measured_peak_bytes == {"cpu": 210 * KIB, "gpu": 6 * MIB, "npu": 1 * MIB}
    assert run.verdicts == {"cpu": Verdict.SPREAD, "gpu": Verdict.OVER}
    assert not run.within_budgets
    lines = summary_lines("m.onnx", run, 3)
    assert ("cpu: 1 segments, 4.000 ms, predicted peak 100.00 KiB, measured peak 210.00 KiB (154.00 KiB to 270.00 KiB "
            "over 3 fresh processes) (budget 226.00 KiB, within the measurement's spread)") in lines[1]
    assert "measured peak 6.00 MiB (5.00 MiB to 7.00 MiB over 3 fresh processes) (budget 4.00 MiB, OVER BUDGET)" in \
        lines[2]
    assert lines[3].endswith("measured peak 1.00 MiB (1 fresh process) (no budget)")


def test_without_measurements_the_predicted_peak_is_judged():
    run = device_run(None, {"cpu": 99 * KIB})
    assert run.measured_peak_bytes is None and run.peak_bytes == {"cpu": 100 * KIB}
    assert run.verdicts == {"cpu": Verdict.OVER} and not run.within_budgets
    assert "measured" not in summary_lines("m.onnx", run, 3)[1]
    assert device_run({"cpu": (98 * KIB, 101 * KIB)}, {"cpu": 99 * KIB}).within_budgets
