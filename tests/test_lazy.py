"""The MILP's stage relaxation with stages followed lazily (lazy.py): optima equal to the brute force and to HiGHS on
the full MILP, also where the relaxation's first optimum exceeds the budget inside a stage."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solver import (
    between_minimum_and_keep_all,
    brute_force,
    make_problem,
    tiny_problems,
    training_chain,
    unet,
    with_budget,
)

from onnx_remat.core.errors import InfeasibleBudgetError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import best_baseline, keep_all
from onnx_remat.passes.solve.checkmate_milp import CheckmateModel, build_model
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.lazy import LazyOutcome, over_budget, solve_lazily

QUICK = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GAPS = (1e-9, 1e-9)


def lazily(problem: Problem) -> LazyOutcome:
    """solve_lazily from the best baseline that fits (if any), without a time limit."""
    warm = best_baseline(problem)
    fits = warm is not None and simulate(problem, warm).fits(problem.budgets)

    def start(model: CheckmateModel) -> Schedule | None:
        return warm if fits else None

    return solve_lazily(problem, None, start, None, GAPS, threading.Event(), 0.0)


def over_in_a_stage() -> Problem:
    """Five operators (found by a seeded search of random graphs) whose stage relaxation's optimum, 4.0, exceeds the
    budget inside stage 4; the MILP's is 4.333 (costs in units of the costliest operator, 3)."""
    problem = make_problem(5, [(0, 1), (1, 2), (0, 2), (0, 3), (2, 4), (1, 4), (3, 4)], [7, 4, 6, 3, 5],
                           [3, 1, 2, 2, 3], [2, 4], [2, 1, 0, 3, 2], resident=4)
    return with_budget(problem, 24)


def test_stages_the_relaxation_exceeds_the_budget_in_are_followed_until_its_schedule_fits():
    problem = over_in_a_stage()
    relaxed = build_model(problem, stages=())
    first = solve_highs(relaxed.milp, gaps=GAPS)
    assert first.x is not None and over_budget(problem, relaxed.schedule(first.x)) == {4}
    outcome = lazily(problem)
    assert outcome.status == "optimal" and outcome.schedule is not None
    cost = check_schedule(problem, outcome.schedule).total_cost
    assert cost == pytest.approx(brute_force(problem, "cost", problem.budgets[0]))
    assert cost == pytest.approx(solve(problem, "highs").model_objective)
    assert first.bound is not None and first.bound * relaxed.objective_unit < cost - 0.1
    assert outcome.bound == pytest.approx(cost)


@QUICK
@given(tiny_problems(max_ops=6), st.floats(0.0, 1.0))
def test_lazy_optimum_matches_brute_force(problem: Problem, fraction: float):
    problem = between_minimum_and_keep_all(problem, fraction)
    outcome = lazily(problem)
    assert outcome.status == "optimal" and outcome.schedule is not None
    cost = check_schedule(problem, outcome.schedule).total_cost
    assert cost == pytest.approx(brute_force(problem, "cost", problem.budgets[0]))
    assert outcome.bound is not None and outcome.bound <= cost + 1e-9


@pytest.mark.parametrize("graph", [training_chain(8), unet(5)], ids=["chain16", "unet16"])
def test_lazy_optimum_equals_the_full_milps_at_half_budget(graph: Problem):
    problem = with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 2)
    outcome = lazily(problem)
    assert outcome.status == "optimal" and outcome.schedule is not None
    assert outcome.schedule.recompute_count() > 0
    full = solve(problem, "highs")
    assert check_schedule(problem, outcome.schedule).total_cost == pytest.approx(full.model_objective)


def test_auto_proves_a_budget_below_the_minimum_infeasible():
    """Below its minimum the MILP has no schedule; the relaxations, however many stages they follow, prove it (the
    last of them is the MILP), and `auto` says which budget is the least."""
    problem = make_problem(5, [(0, 1), (0, 4), (1, 2), (1, 3), (2, 4)], [5, 5, 2, 5, 3], [1] * 5)
    minimum = brute_force(problem, "peak")
    below = with_budget(problem, minimum - 1)
    assert solve_lazily(below, None, lambda model: None, None, GAPS, threading.Event(), 0.0).status == "infeasible"
    with pytest.raises(InfeasibleBudgetError) as error:
        solve(below, "auto")
    assert error.value.minimum_bytes == minimum
