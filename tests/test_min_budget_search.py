"""The eviction heuristic's least budget, as the minimum-budget search finds it, against brute force on graphs small
enough to enumerate: its eviction score and a fitting that is not monotone in the budget. Every schedule is checked by
the simulator."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_simulate_kept import brute_force_kept
from test_solver import make_problem, tiny_problems, with_budget

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Schedule
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import keep_all, prune_unread
from onnx_remat.passes.solve.defer import deferred
from onnx_remat.passes.solve.min_budget import _least_budget, _least_evicting, minimum_budget
from onnx_remat.passes.solve.offload import offload


def evicting(problem: Problem, budget: int) -> Schedule | None:
    """The eviction heuristic's schedule at `budget`, checked by the simulator, or None."""
    schedule = offload(with_budget(problem, budget), 0)
    if schedule is not None:
        check_schedule(with_budget(problem, budget), schedule)
    return schedule


def least_evicting_peak(problem: Problem) -> int:
    schedule = _least_evicting(problem, 0)
    assert schedule is not None
    return check_schedule(problem, schedule).peak_bytes[0]


def test_an_output_whose_inputs_are_gone_is_not_evicted_as_cheap():
    """Stage 5 must evict op 0 (5 bytes, 4 s) or op 2 (5 bytes, 3 s), both read at stage 6. Op 2's input, op 1 (9
    bytes), is gone: recomputing op 2 needs op 1 and op 0 back with it, 19 bytes at once. Rated by its own cost op 2
    was evicted and 14 bytes, the minimum, did not fit (the search ended at 15); rated with its missing input's cost,
    op 0 is evicted and 14 fits."""
    edges = [(0, 1), (1, 2), (0, 3), (2, 3), (0, 4), (4, 5), (2, 6), (0, 6)]
    problem = make_problem(7, edges, [5, 9, 5, 2, 4, 1, 3], [4, 3, 3, 4, 1, 4, 1])
    assert brute_force_kept(problem, "peak") == 14
    assert evicting(problem, 14) is not None
    assert least_evicting_peak(problem) == 14


def test_the_search_sweeps_below_a_budget_that_does_not_fit():
    """With the bytes the runtime keeps per computation the heuristic fits 29 and 31 bytes but not 30: halving stopped
    at 31, the sweep below it finds 29, the minimum."""
    graph = make_problem(
        7, [(0, 1), (0, 2), (2, 3), (0, 3), (3, 4), (0, 4), (4, 5), (1, 6), (2, 6)], [7, 3, 4, 4, 1, 5, 2],
        [3, 2, 2, 2, 1, 2, 5]
    )
    problem = replace(graph, kept_bytes=((0, 1, 3, 3, 2, 1, 2),))
    assert [evicting(problem, budget) is not None for budget in (29, 30, 31)] == [True, False, True]
    assert brute_force_kept(problem, "peak") == 29
    assert least_evicting_peak(problem) == 29
    found = minimum_budget(problem, time_limit=0.0)
    assert found.feasible == 29 and found.schedule is not None
    check_schedule(with_budget(problem, 29), found.schedule)


def test_the_lower_bound_is_tried_last_and_once():
    """A budget that does not fit costs the heuristic most, and the lower bound rarely fits: where the first step down
    would pass it, the search halves instead of trying it first (with no time left, swin_v2_t's training step spent
    its work there)."""
    tried: list[int] = []
    schedule = Schedule(())

    def fitting(budget: int) -> Schedule | None:
        tried.append(budget)
        return schedule if budget >= 950 else None

    assert _least_budget(fitting, 900, 1000) == (950, schedule)
    assert tried[:2] == [1000, 950] and tried[-1] == 900 and tried.count(900) == 1


WEIGHT_GRADIENT_LAST = make_problem(5, [(0, 1), (0, 2), (1, 2), (1, 3), (3, 4)], [1, 1, 10, 8, 1], [1] * 5, [2, 4])
"""Op 2 (10 bytes) is a graph output nobody reads, like a weight's gradient, made from two 1-byte inputs; op 3 (8 bytes)
runs after it. Computed at its stage (every schedule of the MILP's form, whose stages compute in operator order) op 2
is held while op 3 runs: 19 bytes. Computed again after op 4, its inputs held until then, and its first computation
dropped: 13."""


def least_peak_over_orders(problem: Problem) -> int:
    """The least peak of computing every operator once, in any topological order, each output freed after its last
    reader (graph outputs held to the end): brute force over the orders."""
    best = None
    for order in itertools.permutations(range(problem.num_ops)):
        position = {op: index for index, op in enumerate(order)}
        if any(position[u] > position[v] for u, v in problem.edges):
            continue
        last = {op: max((position[r] for r in problem.successors[op]), default=position[op]) for op in order}
        peak = 0
        for index, op in enumerate(order):
            held = sum(problem.output_bytes[o] for o in order[:index]
                       if last[o] >= index or o in problem.graph_outputs)
            peak = max(peak, held + problem.output_bytes[op] + problem.workspace_bytes[op])
        best = peak if best is None else min(best, peak)
    assert best is not None
    return best


def test_the_minimum_computes_an_unread_output_last_where_that_lowers_the_peak():
    """The search's candidates, built in operator order, peaked at 19 bytes, as the exact MILP's least budget; computing
    the unread output last (defer.py) peaks at 13, the least over every order (brute force). A solve at that budget
    fits it from the search's schedule, as the pipeline runs it, and without it (keep-all deferred is a heuristic of
    the solver's too)."""
    problem = WEIGHT_GRADIENT_LAST
    fixed = solve(with_budget(problem, 19), "highs")
    assert check_schedule(with_budget(problem, 19), fixed.schedule).peak_bytes[0] == 19
    found = minimum_budget(problem, time_limit=0.0)  # heuristics only: bounded by work
    assert found.feasible == least_peak_over_orders(problem) == 13 <= fixed.simulation.peak_bytes[0]
    assert found.schedule is not None
    assert check_schedule(with_budget(problem, 13), found.schedule).peak_bytes[0] == 13
    for hints in ((found.schedule,), ()):
        at_minimum = solve(with_budget(problem, 13), "highs", hints=hints)
        assert check_schedule(with_budget(problem, 13), at_minimum.schedule).peak_bytes[0] <= 13
        assert at_minimum.schedule.recompute_count() == 0  # the first computation of op 2, unread, is dropped


@settings(max_examples=25, deadline=None)
@given(tiny_problems(), st.sets(st.integers(0, 5), max_size=3), st.lists(st.integers(0, 2), min_size=7, max_size=7))
def test_deferral_replays_and_never_raises_the_peak(graph: Problem, extra: set[int], kept: list[int]):
    """Keep-all's and the eviction heuristic's schedules, with more graph outputs and kept bytes, and their deferrals:
    the simulator replays each (and the deferral with its unread first computations pruned, as the solver hands it
    out) at a peak no higher."""
    outputs = sorted({*graph.graph_outputs, *(op for op in extra if op < graph.num_ops)})
    problem = replace(graph, graph_outputs=tuple(outputs), kept_bytes=(tuple(kept[:graph.num_ops]),))
    for schedule in (keep_all(problem), offload(problem, 0)):
        assert schedule is not None
        before = simulate(problem, schedule).peak_bytes[0]
        later = deferred(problem, schedule)
        assert simulate(problem, later).peak_bytes[0] <= before
        assert simulate(problem, prune_unread(problem, later)).peak_bytes[0] <= before
