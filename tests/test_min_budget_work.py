"""The heuristics the solver and the minimum-budget search start from are bounded by work, not wall time: at a time
limit of 0 their schedules are still found, so a loaded machine cannot lose them; and the eviction heuristic's
schedules fit with what the runtime keeps per computation. Every schedule is checked by the simulator."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_simulate_kept import kept_problems
from test_solver import training_chain, unet, with_budget

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import baselines_of, best_segmented
from onnx_remat.passes.solve.min_budget import (
    SEARCH_FLOOR_RUNS,
    _least_evicting,
    eviction_runs,
    minimum_budget,
    quick_lower_bound,
    search_runs,
)
from onnx_remat.passes.solve.offload import offload

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_kept(problem: Problem, kept: int) -> Problem:
    return replace(problem, kept_bytes=((kept,) * problem.num_ops,))


def evicting_peak(problem: Problem) -> int:
    """The peak of the eviction heuristic's schedule at the least budget its search finds."""
    schedule = _least_evicting(problem, 0)
    assert schedule is not None
    return simulate(problem, schedule).peak_bytes[0]


@FEW
@given(kept_problems(), st.floats(0.0, 1.0))
def test_the_eviction_heuristic_fits_with_what_the_runtime_keeps(problem: Problem, fraction: float):
    lower, keep = quick_lower_bound(problem), problem.keep_all_bytes()
    problem = with_budget(problem, int(lower + fraction * (keep - lower)))
    schedule = offload(problem, 0)
    if schedule is not None:
        check_schedule(problem, schedule)


def test_recomputations_keep_bytes_within_the_budget():
    """A training chain at 60% of keep-all recomputes; each of its 24 operators keeps 30 bytes per computation, so the
    recomputations' kept bytes come off the room the heuristic plans with (it went over by them before)."""
    graph = with_kept(training_chain(12), 30)
    problem = with_budget(graph, graph.keep_all_bytes() * 3 // 5)
    schedule = offload(problem, 0)
    assert schedule is not None
    check_schedule(problem, schedule)
    assert sum(isinstance(event, Compute) for event in schedule.events) > problem.num_ops


def test_the_work_limit_counts_operator_runs():
    """Every operator runs once at keep-all: one run fewer than the operators is not enough."""
    problem = with_budget(unet(4), unet(4).keep_all_bytes())
    assert offload(problem, 0, max_runs=problem.num_ops - 1) is None
    schedule = offload(problem, 0, max_runs=problem.num_ops)
    assert schedule is not None
    check_schedule(problem, schedule)


def test_the_minimum_found_without_time_is_the_eviction_searchs_at_most():
    """At a limit of 0 s (or a millisecond) the search still ends at most at the eviction heuristic's least budget,
    with a schedule peaking there."""
    for graph in (with_kept(training_chain(20), 7), unet(6)):
        heuristic = evicting_peak(graph)
        for seconds in (0.0, 1e-3):
            found = minimum_budget(graph, time_limit=seconds)
            assert found.lower <= found.feasible <= heuristic
            assert found.schedule is not None
            check_schedule(with_budget(graph, found.feasible), found.schedule)


def test_a_solve_without_time_starts_from_the_eviction_heuristic_at_the_budget():
    """With a millisecond to solve in, the schedule at a budget that no baseline and no Chen segmentation fits is the
    eviction heuristic's (or no worse): before, its deadline was the solve's, and the solve found no schedule."""
    graph = with_kept(unet(6), 5)
    problem = with_budget(graph, evicting_peak(graph))
    assert not any(baseline.fits(problem.budgets) for baseline in baselines_of(problem))
    assert best_segmented(problem) is None
    evicting = offload(problem, 0, max_runs=eviction_runs(problem))
    assert evicting is not None
    result = solve(problem, "auto", time_limit=1e-3)
    check_schedule(problem, result.schedule)
    assert result.objective <= check_schedule(problem, evicting).total_cost + 1e-12


def test_the_searchs_work_shrinks_with_the_limit_and_the_load_but_never_below_its_floor():
    problem = with_budget(unet(6), unet(6).keep_all_bytes())
    runs = [search_runs(problem, seconds, 1.0) for seconds in (0.0, 1.0, 10.0, 100.0)]
    assert runs == sorted(runs) and runs[0] < runs[-1]
    assert search_runs(problem, 100.0, 4.0) < search_runs(problem, 100.0, 1.0)
    assert search_runs(problem, 0.0, 1000.0) >= SEARCH_FLOOR_RUNS * problem.num_ops


def test_a_search_cut_short_by_its_work_still_ends_at_a_fitting_schedule_no_better_than_a_longer_ones():
    """The least budget found with the least work the search may get (its first budget's) fits, checked by the
    simulator; with more work the search goes further down the same budgets."""
    graph = with_kept(unet(6), 5)
    short = _least_evicting(graph, 0, runs=SEARCH_FLOOR_RUNS * graph.num_ops)
    full = _least_evicting(graph, 0)
    assert short is not None and full is not None
    short_peak, full_peak = simulate(graph, short).peak_bytes[0], simulate(graph, full).peak_bytes[0]
    check_schedule(with_budget(graph, short_peak), short)
    assert full_peak < short_peak


def test_the_minimum_search_on_a_loaded_machine_without_time_still_gives_a_fitting_schedule():
    graph = with_kept(unet(6), 5)
    found = minimum_budget(graph, time_limit=0.0, slowdown=100.0)
    assert found.schedule is not None and found.lower <= found.feasible
    check_schedule(with_budget(graph, found.feasible), found.schedule)


def test_a_search_past_its_deadline_builds_no_segmentation_once_a_baseline_is_found(monkeypatch):
    """With no time left the search ends at the baselines and the eviction heuristic: Chen's segments are no longer
    built first and then dropped at the deadline. With time, it builds them all (and finds no larger minimum)."""
    import onnx_remat.passes.solve.baselines as baselines_module

    built: list[int] = []
    real = baselines_module.chen_stages

    def counted(problem: Problem, length: int):
        built.append(length)
        return real(problem, length)

    graph = with_kept(unet(6), 5)
    baselines_of(graph)  # the baselines (chen-sqrt-n among them), figured before any deadline and kept
    monkeypatch.setattr(baselines_module, "chen_stages", counted)
    late = minimum_budget(graph, time_limit=0.0)
    assert built == [] and late.schedule is not None
    check_schedule(with_budget(graph, late.feasible), late.schedule)
    timely = minimum_budget(graph, time_limit=1e6)
    assert len(built) > 1 and timely.feasible <= late.feasible
