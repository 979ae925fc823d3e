"""CP-SAT on the same MILP: optima equal to the brute force and HiGHS on one and two devices, stopping, progress; CP-SAT
on the interval model and the portfolio: optima equal to the brute force and HiGHS; a stalled interval search hands
back its schedule, which HiGHS's child starts from where the MILP admits it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_multidevice import checked, two_device_problems
from test_solver import between_minimum_and_keep_all, brute_force, tiny_problems, training_chain, unet, with_budget

from onnx_remat.core.errors import InfeasibleBudgetError
from onnx_remat.core.problem import Problem
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import child, highs, portfolio, solve
from onnx_remat.passes.solve.baselines import best_baseline, keep_all
from onnx_remat.passes.solve.checkmate_milp import PeakRange, build_model
from onnx_remat.passes.solve.cpsat import WORKER, solve_cpsat
from onnx_remat.passes.solve.interval import problem_arrays, solve_intervals
from onnx_remat.passes.solve.portfolio import COPIES

QUICK = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LONG = 600.0
"""A time limit no test reaches: the problems it bounds are proven in seconds even on a loaded machine."""


def half_budget(graph: Problem) -> Problem:
    return with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 2)


@QUICK
@given(tiny_problems(max_ops=6), st.floats(0.0, 1.0))
def test_cpsat_matches_brute_force_and_highs(problem: Problem, fraction: float):
    problem = between_minimum_and_keep_all(problem, fraction)
    cpsat = checked(problem, solve(problem, "cpsat"))
    assert cpsat.status == "optimal" and cpsat.gap <= 1e-3
    assert cpsat.model_objective == pytest.approx(brute_force(problem, "cost", problem.budgets[0]))
    assert cpsat.model_objective == pytest.approx(solve(problem, "highs").model_objective)


@QUICK
@given(two_device_problems())
def test_cpsat_matches_highs_on_two_devices(p: Problem):
    try:
        highs = solve(p, "highs")
    except InfeasibleBudgetError:
        with pytest.raises(InfeasibleBudgetError):
            solve(p, "cpsat")
        return
    cpsat = checked(p, solve(p, "cpsat"))
    assert cpsat.status == "optimal"
    assert cpsat.model_objective == pytest.approx(highs.model_objective, abs=1e-6)


@pytest.mark.parametrize("graph", [training_chain(8), unet(5)], ids=["chain16", "unet16"])
def test_cpsat_optimum_equals_highs_at_half_budget(graph: Problem):
    problem = half_budget(graph)
    # Proven in seconds on a quiet machine; the limit is far beyond that so a loaded one cannot fail the test.
    cpsat, highs = solve(problem, "cpsat", time_limit=LONG), solve(problem, "highs", time_limit=LONG)
    assert cpsat.status == highs.status == "optimal"
    assert cpsat.model_objective == pytest.approx(highs.model_objective)
    assert cpsat.schedule.recompute_count() > 0


def test_minimum_peak_model_scales_to_whole_bytes():
    """The peak-minimizing model (a memory column as objective) gives the brute-force minimum peak."""
    problem = training_chain(4)
    peak = simulate(problem, keep_all(problem)).peak_bytes[0]
    model = build_model(problem, PeakRange(0, 0, peak))
    outcome = solve_cpsat(model.milp, warm_start=model.assignment(keep_all(problem)))
    assert outcome.status == "optimal"
    assert outcome.bound * model.memory_unit == pytest.approx(brute_force(problem, "peak"), abs=0.5)


def test_stop_returns_the_best_solution_so_far_and_progress_is_reported():
    problem = half_budget(unet(12))
    model = build_model(problem)
    stop, reports = threading.Event(), []

    def report_then_stop(*report: object) -> None:
        """Stop at the first report with an incumbent and a bound: the search is running and has a solution to
        return, however busy the machine."""
        reports.append(report)
        if report[1] is not None and report[2] is not None:
            stop.set()

    warm = model.assignment(best_baseline(problem))
    outcome = solve_cpsat(model.milp, LONG, warm, report_then_stop, stop=stop)
    assert outcome.status == "interrupted" and outcome.x is not None
    assert reports and reports[-1][2] is not None


@pytest.mark.parametrize("run", range(8))
def test_stopped_at_its_first_solution_returns_it(run: int):
    """Stopped as its first solution is reported, on a problem proven about as fast: the worker hands the solution
    back whichever comes first (with a SIGINT, CP-SAT's own handler aborted it in 4 of 16 such runs)."""
    problem = with_budget(training_chain(1), 10**12)
    stop = threading.Event()

    def stop_at_solution(seconds: float, incumbent: float | None, bound: float | None) -> None:
        if incumbent is not None:
            stop.set()

    outcome = solve_cpsat(build_model(problem).milp, LONG, None, stop_at_solution, stop=stop)
    assert outcome.x is not None and outcome.status in ("interrupted", "optimal")


@QUICK
@given(tiny_problems(max_ops=6), st.floats(0.0, 1.0))
def test_interval_model_with_every_copy_matches_brute_force(problem: Problem, fraction: float):
    """With as many computations per operator as the MILP allows, the interval model is the MILP's form: the same
    optimum as the brute force over it, and a schedule the simulator accepts at that cost within the budget."""
    problem = between_minimum_and_keep_all(problem, fraction)
    outcome = solve_intervals(problem, problem.num_ops, LONG)
    assert outcome.status == "optimal" and outcome.schedule is not None
    simulation = check_schedule(problem, outcome.schedule)
    assert simulation.total_cost == pytest.approx(brute_force(problem, "cost", problem.budgets[0]))


@QUICK
@given(tiny_problems(max_ops=6), st.floats(0.0, 1.0))
def test_portfolio_matches_brute_force(problem: Problem, fraction: float):
    problem = between_minimum_and_keep_all(problem, fraction)
    result = checked(problem, solve(problem, "auto"))
    assert result.solver == "portfolio" and result.status == "optimal"
    assert result.model_objective == pytest.approx(brute_force(problem, "cost", problem.budgets[0]))


def test_interval_model_finds_the_milp_optimum_at_half_budget():
    """On a 16-operator training chain at half its keep-all memory, 3 computations per operator reach the MILP's
    optimum."""
    problem = half_budget(training_chain(8))
    intervals = solve_intervals(problem, COPIES, LONG, best_baseline(problem))
    assert intervals.schedule is not None and intervals.schedule.recompute_count() > 0
    cost = check_schedule(problem, intervals.schedule).total_cost
    assert cost == pytest.approx(solve(problem, "highs", time_limit=LONG).model_objective)


def test_worker_started_early_gives_the_same_optimum():
    """The worker started before the problem is ready (as `onnx-remat solve` starts it) and the one started after
    it, in the same block, both reach the MILP's optimum of a 16-operator training chain at half its memory."""
    problem = half_budget(training_chain(8))
    optimum = solve(problem, "highs", time_limit=LONG).model_objective
    with child.started_early(WORKER):
        early, later = (solve_intervals(problem, COPIES, LONG, best_baseline(problem)) for _ in range(2))
    for outcome in (early, later):
        assert outcome.schedule is not None
        assert check_schedule(problem, outcome.schedule).total_cost == pytest.approx(optimum)


def test_unused_early_worker_ends_with_its_block():
    with child.started_early(WORKER):
        process = child._EARLY[WORKER].child
    assert process.returncode is not None and WORKER not in child._EARLY


def test_worker_stopped_before_it_reports_is_killed_at_once(tmp_path):
    """A worker stopped before it prints anything holds no solution: it is killed at once instead of answering
    within its grace (LONG here, which the test would wait out if it were given)."""
    problem = half_budget(training_chain(8))
    given, answer = tmp_path / "problem.npz", tmp_path / "answer.npz"
    np.savez(given, **problem_arrays(problem, COPIES, best_baseline(problem), LONG))
    stop, lines = threading.Event(), []
    stop.set()
    answered = child.run_worker(WORKER, [str(given), str(answer)], answer, lines.append, stop, "CP-SAT", LONG)
    assert not answered and not lines and not answer.exists()


def test_stalled_interval_search_returns_its_best_schedule():
    """With no stall allowed, the full interval search of a 37-operator U-Net at half its memory (which it does not
    prove within seconds) ends at once after its first solution, and hands back a schedule within the budget no
    costlier than its hint: the portfolio's HiGHS then starts (LONG bounds the test if it did not end)."""
    problem = half_budget(unet(12))
    hint = best_baseline(problem)
    outcome = solve_intervals(problem, COPIES, LONG, hint, stall=0.0)
    assert outcome.status == "time_limit" and outcome.schedule is not None
    assert check_schedule(problem, outcome.schedule).total_cost <= check_schedule(problem, hint).total_cost + 1e-12


def test_highs_starts_from_the_cheaper_schedule_the_milp_admits():
    """CP-SAT's schedule becomes HiGHS's start where it is cheaper and satisfies the stage relaxation's rows; keep-all,
    cheaper still but over the budget in a stage's knapsack row (the simulator says so too), is refused."""
    problem = half_budget(training_chain(8))
    model = build_model(problem, stages=())
    baseline = best_baseline(problem)
    found = solve_intervals(problem, COPIES, LONG, baseline).schedule
    assert found is not None
    cost = {id(s): check_schedule(problem, s).total_cost for s in (baseline, found)}
    assert cost[id(found)] < cost[id(baseline)]
    assert portfolio._cheapest_start(problem, model, (baseline, found)) is found
    assert portfolio._cheapest_start(problem, model, (None, found)) is found
    over = keep_all(problem)
    assert simulate(problem, over).peak_bytes[0] > problem.budgets[0]
    assert simulate(problem, over).total_cost < cost[id(found)]
    assert portfolio._cheapest_start(problem, model, (baseline, over)) is baseline


def test_portfolio_with_highs_in_its_child_proves_what_the_intervals_cannot(monkeypatch: pytest.MonkeyPatch):
    """HiGHS in its child (the in-process limit lowered to force it) runs once CP-SAT's search has ended: a
    16-operator U-Net at half its memory needs more computations of some operator than the interval model allows,
    so HiGHS proves the optimum, the same as HiGHS alone."""
    problem = half_budget(unet(5))
    optimum = solve(problem, "highs", time_limit=LONG).model_objective
    monkeypatch.setattr(portfolio, "IN_PROCESS_NONZEROS", 0)
    monkeypatch.setattr(highs, "IN_PROCESS_NONZEROS", 0)
    result = checked(problem, solve(problem, "auto", time_limit=LONG))
    assert result.solver == "portfolio" and result.status == "optimal"
    assert result.model_objective == pytest.approx(optimum)


def test_portfolio_hands_over_to_highs_when_the_stall_rule_cannot_fire(monkeypatch: pytest.MonkeyPatch):
    """A stall rule that never fires (as under heavy load, where the worker's CPU seconds do not add up to STALL within
    the limit) still leaves HiGHS's child its share: CP-SAT's search on a 37-operator U-Net at half its memory, which
    it does not prove within seconds, ends at HAND_OVER of the time limit (here at once), and HiGHS then reports a
    bound, on which the test stops the race (before, HiGHS would have waited for LONG)."""
    problem = half_budget(unet(12))
    monkeypatch.setattr(portfolio, "IN_PROCESS_NONZEROS", 0)
    monkeypatch.setattr(highs, "IN_PROCESS_NONZEROS", 0)
    monkeypatch.setattr(portfolio, "STALL", 1e9)
    monkeypatch.setattr(portfolio, "HAND_OVER", 0.0)
    hint, stop = best_baseline(problem), threading.Event()
    bounds: list[float] = []

    def highs_reported(seconds: float, incumbent: float | None, bound: float | None) -> None:
        if bound is not None:
            bounds.append(bound)
            stop.set()

    found = portfolio.race(problem, LONG, hint, (highs_reported, None), (1e-6, 1e-6), stop)
    assert bounds and found.milp.status == "interrupted" and not found.exact
    assert found.intervals.status != "optimal"
