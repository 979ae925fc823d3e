"""The backend stops once its incumbent meets the memory-cut bound: the schedule is then optimal (the brute force)."""

from __future__ import annotations

import threading

import pytest
from test_solver import between_minimum_and_keep_all, brute_force, training_chain

from onnx_remat.passes import solve as solve_module
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.solve import BACKENDS
from onnx_remat.passes.solve.lower_bound import cut_lower_bound
from onnx_remat.passes.solve.proven import StopAtBound


def test_stop_is_set_once_the_incumbent_meets_the_bound():
    stop, reports = threading.Event(), []
    callback = StopAtBound(21.0, 0.5, 1e-4, stop, lambda *report: reports.append(report))
    callback(0.1, None, 30.0)
    callback(0.2, 44.0, 40.0)  # 22 s: above the bound
    assert not stop.is_set() and not callback.reached
    callback(0.3, 42.0, 40.0)  # 21 s: meets it
    assert stop.is_set() and callback.reached
    assert reports == [(0.1, None, 30.0), (0.2, 44.0, 40.0), (0.3, 42.0, 40.0)]


def test_a_schedule_meeting_the_cut_bound_is_optimal(monkeypatch):
    """Training chain at 20% between minimum and keep-all: the heuristics find 24, the cut bound and the optimum are
    21, so the backend runs and the result is optimal at the brute force's cost."""
    problem = between_minimum_and_keep_all(training_chain(4), 0.2)
    optimum = brute_force(problem, "cost", problem.budgets[0])
    assert cut_lower_bound(problem) == pytest.approx(optimum, rel=1e-5)
    statuses = []
    highs = BACKENDS["highs"]

    def recorded(*args, **kwargs):
        outcome = highs(*args, **kwargs)
        statuses.append(outcome.status)
        return outcome

    monkeypatch.setitem(BACKENDS, "highs", recorded)
    result = solve_module.solve(problem, "highs")
    assert statuses and statuses[0] in ("optimal", "interrupted")
    assert result.status == "optimal" and result.model_objective == pytest.approx(optimum)
    assert check_schedule(problem, result.schedule).total_cost == pytest.approx(result.objective)
