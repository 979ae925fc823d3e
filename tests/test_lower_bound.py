"""The memory-cut lower bound never exceeds an optimum: the brute force on one device, HiGHS on two."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_multidevice import problem as two_device
from test_multidevice import two_device_problems
from test_solver import between_minimum_and_keep_all, brute_force, tiny_problems, training_chain, unet, with_budget

from onnx_remat import models
from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import InfeasibleBudgetError
from onnx_remat.core.problem import Problem
from onnx_remat.passes.cost_analytic import Roofline
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import keep_all
from onnx_remat.passes.solve.lower_bound import cut_lower_bound
from onnx_remat.passes.solve.min_budget import fits_equal_budget, minimum_equal_budget, step_bytes
from onnx_remat.passes.solve.offload import offload
from onnx_remat.pipeline import costed_problem, prepare

MANY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@MANY
@given(tiny_problems(max_ops=7), st.floats(0.0, 1.0))
def test_cut_bound_is_below_the_brute_force_optimum(problem: Problem, fraction: float):
    problem = between_minimum_and_keep_all(problem, fraction)
    assert sum(problem.cost[0]) <= cut_lower_bound(problem) <= brute_force(problem, "cost", problem.budgets[0]) + 1e-9


def assert_below_the_optimum(p: Problem) -> None:
    """The bound is at most HiGHS's proven optimum (nothing to check where no schedule fits)."""
    try:
        result = solve(p, "highs")
    except InfeasibleBudgetError:
        return
    assert result.status == "optimal"
    assert cut_lower_bound(p) <= result.model_objective + 1e-9


@MANY
@given(two_device_problems())
def test_cut_bound_is_below_the_two_device_optimum(p: Problem):
    assert_below_the_optimum(p)


@st.composite
def short_training_steps(draw) -> Problem:
    """Training chains (gradient k reads forward k) plus a skip or two, on a fast device and one no faster,
    with budgets a little above the largest step: memory is short and the way-back term counts."""
    layers = draw(st.integers(2, 4))
    n = 2 * layers
    edges = [(i, i + 1) for i in range(n - 1)] + [(k, n - 1 - k) for k in range(layers - 1)]
    skips = st.tuples(st.integers(0, n - 2), st.integers(1, n - 1)).filter(lambda e: e[0] < e[1])
    edges += draw(st.lists(skips, max_size=2))
    sizes = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    fast = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    slow = [c * draw(st.sampled_from([1, 2, 3])) + draw(st.integers(0, 3)) for c in fast]
    step = max(step_bytes(two_device(edges, sizes, [fast], [10**9]), v) for v in range(n))
    budgets = [step + draw(st.integers(0, 8)) for _ in range(2)]
    return two_device(edges, sizes, [fast, slow], budgets, copy=draw(st.sampled_from([0.05, 0.3, 1.0])))


@MANY
@given(short_training_steps())
def test_cut_bound_is_below_the_optimum_with_a_home_device(p: Problem):
    assert_below_the_optimum(p)


@pytest.mark.parametrize("graph", [training_chain(10), unet(5)], ids=["chain", "unet"])
def test_cut_bound_is_above_the_trivial_one_where_memory_is_short(graph: Problem):
    problem = with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 2)
    bound = cut_lower_bound(problem)
    assert sum(problem.cost[0]) < bound <= solve(problem, time_limit=30).model_objective + 1e-9


def two_device_training(model: str, **kwargs) -> Problem:
    """A model's training step on the analytic device and a copy of it 2.5x slower, copies at memory bandwidth,
    each device at a quarter of keep-all or, where no schedule found fits that, the smallest equal budget one
    does: memory is short."""
    prepared = prepare(models.build(model, **kwargs), "train")
    single = costed_problem(prepared, get_devices(None)).problem
    per_byte = 1.0 / Roofline().bytes_per_second
    two = replace(
        single,
        devices=("fast", "slow"),
        cost=(single.cost[0], tuple(2.5 * c for c in single.cost[0])),
        resident_bytes=(single.resident_bytes[0],) * 2,
        kept_bytes=(single.kept_bytes[0],) * 2,
        budgets=(single.keep_all_bytes(),) * 2,
        copy_seconds_per_byte=((0.0, per_byte), (per_byte, 0.0)),
        copy_fixed_seconds=((0.0, 0.0), (0.0, 0.0)),
    )
    quarter = two.keep_all_bytes() // 4
    budget = quarter if fits_equal_budget(two, quarter) else minimum_equal_budget(two).feasible
    return replace(two, budgets=(budget, budget))


@pytest.mark.slow
@pytest.mark.parametrize(("model", "kwargs"), [("vgg16", {"batch": 8}), ("unet", {"batch": 8})], ids=["vgg16", "unet"])
def test_cut_bound_is_below_the_schedules_found_for_real_training_graphs(model: str, kwargs: dict):
    """Parked gradients that were read before a cut owe no way back, an operator's inputs sit where it runs: a
    bound that got either wrong exceeded a schedule the heuristics found for U-Net."""
    problem = two_device_training(model, **kwargs)
    bound = cut_lower_bound(problem)
    schedules = [offload(problem, 0, 1), solve(problem, time_limit=10).schedule]
    simulations = [simulate(problem, schedule) for schedule in schedules if schedule is not None]
    costs = [simulation.total_cost for simulation in simulations if simulation.fits(problem.budgets)]
    assert costs and sum(problem.cost[0]) < bound <= min(costs) + 1e-12
