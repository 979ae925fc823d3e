"""The baselines' figures and lazily built events (numpy over their computations) against the liveness builder and
the independent simulator: the same events, peaks and costs, on tiny graphs, several devices and real models."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from hypothesis import given, settings
from test_multidevice import problem as multi_problem
from test_solver import make_problem, tiny_problems, training_chain

from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import ScheduleError
from onnx_remat.core.problem import Problem
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve.baselines import (
    BASELINES,
    baselines_of,
    chen_stages,
    on_device,
    placed,
    schedule_from_stages,
)
from onnx_remat.passes.solve.staged import staged_run
from onnx_remat.pipeline import costed_problem, prepare

FIXTURES = Path(__file__).parents[1] / "models" / "fixtures"


def assert_as_built_and_simulated(problem: Problem) -> None:
    """Every baseline of `problem` has the events `schedule_from_stages` builds (placed on its device) and the peaks
    and cost the simulator measures of them, to the last bit."""
    baselines = baselines_of(problem)
    assert len(baselines) == len(BASELINES) * problem.num_devices
    for baseline, stages in zip(baselines, [s for _ in problem.devices for s in BASELINES.values()], strict=True):
        reference = placed(schedule_from_stages(problem, stages(on_device(problem, baseline.device))), baseline.device)
        assert baseline.schedule == reference, baseline.name
        simulation = simulate(problem, reference)
        assert (baseline.peak_bytes, baseline.total_cost) == (simulation.peak_bytes, simulation.total_cost)
        assert baseline.fits(simulation.peak_bytes)
        assert not baseline.fits(tuple(peak - 1 for peak in simulation.peak_bytes))


@settings(max_examples=60, deadline=None)
@given(tiny_problems(max_ops=12))
def test_baselines_are_the_built_schedules_with_their_simulated_figures(problem: Problem):
    assert_as_built_and_simulated(problem)


def test_baselines_on_several_devices_are_placed_on_each():
    problem = multi_problem([(0, 1), (1, 2), (0, 3), (2, 3), (3, 4)], [10, 20, 30, 40, 50],
                            [[1.5, 2.25, 3, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5]], [100, 100], outputs=(2, 4),
                            workspace=(1, 2, 3, 4, 5), resident=(7, 11))
    assert [baseline.name for baseline in baselines_of(problem)] == [
        f"{name}@{device}" for device in problem.devices for name in BASELINES]
    assert_as_built_and_simulated(problem)


@pytest.mark.parametrize("fixture", ["unet_small", "resnet18_small"])
def test_baselines_of_real_training_steps(fixture):
    """Measured-looking float costs, workspaces, several graph outputs and hundreds of recomputations."""
    prepared = prepare(onnx.load(str(FIXTURES / f"{fixture}.onnx")), "train")
    problem = costed_problem(prepared, get_devices(None)).problem
    assert_as_built_and_simulated(problem)
    frontier = next(baseline for baseline in baselines_of(problem) if baseline.name == "frontier-only")
    assert frontier.schedule.recompute_count() > problem.num_ops


@pytest.mark.parametrize("length", [1, 2, 3, 5])
def test_chen_segments_of_any_length_run_as_built(length):
    problem = training_chain(9)
    stages = chen_stages(problem, length)
    run = staged_run(problem, stages)
    reference = schedule_from_stages(problem, stages)
    simulation = simulate(problem, reference)
    assert run.schedule(0) == reference
    assert (run.peak_bytes(problem, 0), run.compute_cost(problem, 0)) == (simulation.peak_bytes[0],
                                                                          simulation.total_cost)


def test_a_computation_before_its_input_is_refused():
    problem = make_problem(3, [(0, 1), (1, 2)], [1, 1, 1], [1, 1, 1])
    with pytest.raises(ScheduleError, match="operator 1 needs operator 0"):
        staged_run(problem, [[1], [0], [2]])
