"""The solver layer against an independent brute force on tiny graphs, the baselines and CBC."""

from __future__ import annotations

import itertools
import os
import signal
import threading
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_remat import models
from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import InfeasibleBudgetError, UsageError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Free
from onnx_remat.passes import solve as solve_module
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import BACKENDS, PORTFOLIO, SOLVERS, BestSoFar, solve
from onnx_remat.passes.solve.backend import MilpOutcome, SolveStatus
from onnx_remat.passes.solve.baselines import (
    BASELINES,
    best_baseline,
    best_segmented,
    cheapest_fitting,
    chen_sqrt_n,
    fitting,
    frontier_only,
    keep_all,
    schedule_from_stages,
    segmentations,
    segmented_baselines,
)
from onnx_remat.passes.solve.checkmate_milp import build_model
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.min_budget import eviction_runs, minimum_budget, quick_lower_bound
from onnx_remat.passes.solve.offload import offload
from onnx_remat.pipeline import costed_problem, prepare

# ---------------------------------------------------------------------------- graphs


def make_problem(n: int, edges, sizes, costs, outputs=None, workspace=None, resident=0) -> Problem:
    return Problem(
        op_names=tuple(f"op{i}" for i in range(n)),
        edges=tuple(sorted(set(edges))),
        output_bytes=tuple(sizes),
        cost=(tuple(float(c) for c in costs),),
        resident_bytes=(resident,),
        budgets=(10**12,),
        graph_outputs=tuple(outputs if outputs is not None else (n - 1,)),
        workspace_bytes=tuple(workspace) if workspace else (),
    )


def training_chain(layers: int) -> Problem:
    """Forward f_0..f_{L-1}, then gradients g_{L-1}..g_0: g_k reads the next gradient and f_k."""
    n = 2 * layers
    edges = [(i, i + 1) for i in range(n - 1)] + [(k, n - 1 - k) for k in range(layers - 1)]
    sizes = [100 + 37 * (i % 5) for i in range(n)]
    costs = [1 + (i % 3) for i in range(n)]
    return make_problem(n, edges, sizes, costs)


def unet(levels: int) -> Problem:
    """Encoder levels (conv, conv = skip), a bottleneck, decoder levels (conv reading the level below and the skip).

    Activations keep one size at every level, so the skips held across the bottom dominate memory.
    """
    edges: list[tuple[int, int]] = []
    skips: list[int] = []
    count = 0

    def op(*inputs: int | None) -> int:
        nonlocal count
        edges.extend((i, count) for i in inputs if i is not None)
        count += 1
        return count - 1

    current = None
    for _ in range(levels):
        current = op(op(current))
        skips.append(current)
    current = op(current)
    for skip in reversed(skips):
        current = op(current, skip)
    return make_problem(count, edges, [100] * count, [1 + (i % 4) for i in range(count)], workspace=[10] * count)


@st.composite
def tiny_problems(draw, max_ops: int = 7) -> Problem:
    n = draw(st.integers(2, max_ops))
    edges = [(u, v) for v in range(1, n) for u in draw(st.sets(st.integers(0, v - 1), min_size=1, max_size=3))]
    sizes = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    workspace = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    costs = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    outputs = {n - 1} | draw(st.sets(st.integers(0, n - 2), max_size=1))
    return make_problem(n, edges, sizes, costs, sorted(outputs), workspace, draw(st.integers(0, 5)))


def with_budget(problem: Problem, budget: int) -> Problem:
    return replace(problem, budgets=(budget,))


def between_minimum_and_keep_all(problem: Problem, fraction: float) -> Problem:
    """`problem` with its budget `fraction` of the way from the brute-force minimum to the keep-all peak."""
    minimum = brute_force(problem, "peak")
    keep_peak = simulate(problem, keep_all(problem)).peak_bytes[0]
    return with_budget(problem, int(minimum + fraction * (keep_peak - minimum)))


# ---------------------------------------------------------------------------- brute force


def stage_peak(problem: Problem, held: frozenset, computes: list[int], keep: frozenset) -> int | None:
    """Peak of one stage from `held`, computing `computes` in order, freeing what is not kept at last use."""
    sizes, preds = problem.output_bytes, problem.predecessors
    live = set(held)
    memory = problem.resident_bytes[0] + sum(sizes[i] for i in held)
    peak = memory
    for index, k in enumerate(computes):
        if any(p not in live for p in preds[k]):
            return None
        peak = max(peak, memory + sizes[k] + problem.workspace_bytes[k])
        live.add(k)
        memory += sizes[k]
        later = computes[index + 1 :]
        for i in {*preds[k], k}:
            if i not in keep and not any(i in preds[j] for j in later):
                live.discard(i)
                memory -= sizes[i]
    return peak


def subsets(items) -> list[frozenset]:
    items = list(items)
    return [frozenset(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r)]


def brute_force(problem: Problem, objective: str, budget: float = float("inf")) -> float | None:
    """Dynamic program over the held set between stages: every recompute set and every kept set.

    objective "cost": cheapest schedule with every stage peak within `budget`; "peak": smallest peak. An operator
    computed once (problem.computed_once) is never in a recompute set.
    """
    n, outputs, once = problem.num_ops, frozenset(problem.graph_outputs), frozenset(problem.computed_once)
    # Keeping an output nothing reads (not even a recomputation) and that is no graph output never helps.
    states: dict[frozenset, float] = {frozenset(): 0.0}
    for t in range(n):
        useful = {i for i in range(t + 1) if i in outputs or problem.successors[i]}
        following: dict[frozenset, float] = {}
        for held, value in states.items():
            for extra in subsets(i for i in range(t) if i not in held and i not in once):
                computes = sorted(extra) + [t]
                available = held | set(computes)
                for keep in [outputs] if t == n - 1 else subsets(available & useful):
                    if not keep <= available:
                        continue
                    peak = stage_peak(problem, held, computes, keep)
                    if peak is None or peak > budget:
                        continue
                    step = sum(problem.cost[0][k] for k in computes) if objective == "cost" else peak
                    total = value + step if objective == "cost" else max(value, step)
                    if total < following.get(keep, float("inf")):
                        following[keep] = total
        states = following
    return min(states.values(), default=None)


# ---------------------------------------------------------------------------- tests

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


LEAKED_START = make_problem(
    7, [(0, 1), (0, 2), (0, 4), (0, 5), (0, 6), (1, 4), (1, 6), (2, 3), (2, 5), (3, 6)], [1] * 7, [1] * 7, [6],
    [0, 0, 1, 1, 0, 2, 0], 2,
)
"""HiGHS finds its optimum in presolved space and hands back the warm start's columns: the stop at the proven
bound once fired on that unseen optimum and left the start (cost 10 against 9, status time_limit)."""


@FAST
@given(tiny_problems(), st.floats(0.0, 1.0))
@example(LEAKED_START, 0.0)
def test_milp_matches_brute_force_and_cbc(problem: Problem, fraction: float):
    problem = between_minimum_and_keep_all(problem, fraction)
    expected = brute_force(problem, "cost", problem.budgets[0])
    highs = solve(problem, "highs")
    cbc = solve(problem, "cbc")
    assert highs.status == "optimal" and cbc.status == "optimal"
    assert highs.model_objective == pytest.approx(expected) and cbc.model_objective == pytest.approx(expected)
    for result in (highs, cbc):
        assert result.objective <= result.model_objective + 1e-9
        check_schedule(problem, result.schedule)
        assert result.bound <= result.objective + 1e-9 and result.gap <= 1e-3
    for build in BASELINES.values():
        baseline = simulate(problem, schedule_from_stages(problem, build(problem)))
        if baseline.peak_bytes[0] <= problem.budgets[0]:
            assert highs.objective <= baseline.total_cost + 1e-9


OUT_OF_INDEX_ORDER = make_problem(
    7, [(0, 1), (0, 2), (0, 3), (0, 5), (1, 4), (1, 5), (3, 6), (4, 6)], [1] * 7, [1] * 7, [6], [0, 0, 0, 1, 0, 0, 0])
"""Peaks at 3 only by recomputing 0, 3, 1, 4 in that order before 6 (the eviction heuristic's schedule); in index
order within each stage, as the brute force and the MILP compute, 1 is held while 3 runs with its workspace: 4."""


DEFERRABLE_OUTPUT = make_problem(5, [(0, 1), (0, 2), (0, 3), (0, 4), (1, 4)], [1, 1, 1, 2, 1], [1] * 5, [3, 4],
                                 [0] * 5)
"""Peaks at 4 with graph output 3 computed again after the last operator (passes/solve/defer.py), below the brute
force's 5 over staged schedules, but not proven: a schedule out of index order, which the MILP's bound does not cover,
so the stated lower bound stays at 3 (hypothesis found it in CI)."""


@FAST
@given(tiny_problems())
@example(OUT_OF_INDEX_ORDER)
@example(DEFERRABLE_OUTPUT)
def test_minimum_budget_matches_brute_force(problem: Problem):
    """The minimum found peaks where it says and is never above the brute force's over staged schedules (which
    computes each stage in index order: a heuristic's schedule out of that order may peak lower), and its lower bound
    is below it (proven only where no graph output may be computed last: the MILP's bound covers staged schedules)."""
    found = minimum_budget(problem)
    assert found.lower <= found.feasible <= brute_force(problem, "peak")
    assert found.schedule is None or simulate(problem, found.schedule).peak_bytes[0] == found.feasible
    assert quick_lower_bound(problem) <= found.lower


@settings(max_examples=20, deadline=None)
@given(tiny_problems(max_ops=12))
def test_baselines_are_valid(problem: Problem):
    for build in BASELINES.values():
        simulate(problem, schedule_from_stages(problem, build(problem)))
    assert keep_all(problem).recompute_count() == 0


def test_keep_all_frees_at_last_use():
    problem = make_problem(4, [(0, 1), (0, 2), (1, 2), (2, 3)], [10, 20, 30, 40], [1, 1, 1, 1])
    events = keep_all(problem).events
    assert events == (
        Compute(0, 0),
        Compute(1, 1),
        Compute(2, 2),
        Free(0, 2),
        Free(1, 2),
        Compute(3, 3),
        Free(2, 3),
    )
    assert simulate(problem, keep_all(problem)).peak_bytes == (70,)


@pytest.mark.parametrize("graph", [training_chain(8), unet(5)], ids=["chain", "unet"])
def test_half_budget_needs_recomputation(graph: Problem):
    """Half of the keep-all schedule's peak: the solver must recompute, and beat Chen if Chen fits."""
    problem = with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 2)
    result = solve(problem)
    assert result.status == "optimal"
    assert result.schedule.recompute_count() > 0
    assert check_schedule(problem, result.schedule).total_cost == pytest.approx(result.objective)
    chen = simulate(problem, chen_sqrt_n(problem))
    if chen.peak_bytes[0] <= problem.budgets[0]:
        assert result.objective <= chen.total_cost + 1e-9


def test_budget_below_the_largest_step_is_refused():
    problem = training_chain(4)
    lower = quick_lower_bound(problem)
    with pytest.raises(InfeasibleBudgetError) as error:
        solve(with_budget(problem, lower - 1))
    assert error.value.minimum_bytes == lower


def test_infeasible_budget_above_the_quick_bound_is_proven():
    problem = make_problem(5, [(0, 1), (0, 4), (1, 2), (1, 3), (2, 4)], [5, 5, 2, 5, 3], [1] * 5)
    minimum = brute_force(problem, "peak")
    assert quick_lower_bound(problem) < minimum == minimum_budget(problem).lower
    with pytest.raises(InfeasibleBudgetError) as error:
        solve(with_budget(problem, minimum - 1))
    assert error.value.minimum_bytes == minimum


def test_the_portfolio_reports_the_proof_of_infeasibility_that_stopped_highs():
    """A chain small enough for CP-SAT's interval model to be exact: it proves the budget infeasible, which stops
    HiGHS; the answer is that proof, not the stopped HiGHS's "interrupted" (raised as a Ctrl-C before)."""
    problem = make_problem(3, [(0, 1), (1, 2)], [4, 5, 7], [2, 5, 1], [0, 2], [2, 3, 3], 0)
    minimum = brute_force(problem, "peak")
    assert quick_lower_bound(problem) <= 16 < minimum
    with pytest.raises(InfeasibleBudgetError):
        solve(with_budget(problem, 16), "auto")


def test_unknown_solver_names_the_valid_ones():
    with pytest.raises(UsageError, match="auto, highs, cbc"):
        solve(training_chain(2), "gurobi")


def test_no_incumbent_falls_back_to_the_best_baseline(monkeypatch):
    problem = with_budget(training_chain(4), 10**6)
    monkeypatch.setitem(BACKENDS, "highs", lambda *args, **kwargs: MilpOutcome(None, SolveStatus.TIME_LIMIT, None))
    monkeypatch.setattr(solve_module, "cut_lower_bound", lambda problem, seconds, stop: 0.0)  # proves nothing
    result = solve_module.solve(problem)
    assert (result.status, result.schedule) == ("heuristic", best_baseline(problem))
    assert best_baseline(problem) == keep_all(problem)


def test_a_bound_that_proves_the_heuristics_schedule_spares_the_backend(monkeypatch):
    def backend(*args, **kwargs) -> MilpOutcome:
        raise AssertionError("the backend ran")

    problem = with_budget(training_chain(4), 10**6)  # keep-all fits: nothing beats computing each operator once
    monkeypatch.setitem(BACKENDS, "highs", backend)
    result = solve_module.solve(problem)
    assert (result.status, result.gap) == ("optimal", 0.0)
    assert result.objective == pytest.approx(sum(problem.cost[0]))


def test_progress_reports_seconds():
    calls = []
    problem = with_budget(training_chain(4), training_chain(4).keep_all_bytes() // 2)
    result = solve(problem, "cbc", progress=lambda *report: calls.append(report))
    assert calls and calls[-1][1] == pytest.approx(result.objective)


def test_progress_shows_the_best_of_the_portfolios_reports():
    """HiGHS and CP-SAT report in turn (on the peers' chain40_p40 the line went 347.6, 354.2, 347.6): what is shown
    is the best of both, never a worse incumbent or a lower bound after a better one."""
    shown = []
    progress = BestSoFar(lambda *report: shown.append(report))
    for report in ((1.0, 354.2, 342.4), (2.0, 347.6, None), (3.0, 354.2, 342.4), (4.0, None, 345.9)):
        progress(*report)
    assert shown == [(1.0, 354.2, 342.4), (2.0, 347.6, 342.4), (3.0, 347.6, 342.4), (4.0, 347.6, 345.9)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_problems(max_ops=8), st.floats(0.0, 1.0))
def test_every_backend_passes_the_simulator_and_beats_every_fitting_baseline(problem: Problem, fraction: float):
    lower = quick_lower_bound(problem)
    keep_peak = simulate(problem, keep_all(problem)).peak_bytes[0]
    problem = with_budget(problem, int(lower + fraction * (keep_peak - lower)))
    fitting = [simulate(problem, schedule_from_stages(problem, build(problem))) for build in BASELINES.values()]
    fitting = [s.total_cost for s in fitting if s.peak_bytes[0] <= problem.budgets[0]]
    for solver in SOLVERS:
        try:
            result = solve(problem, solver)
        except InfeasibleBudgetError:
            assert not fitting
            continue
        assert check_schedule(problem, result.schedule).total_cost == pytest.approx(result.objective)
        assert result.simulation == simulate(problem, result.schedule)
        assert result.objective <= min(fitting, default=result.objective) + 1e-9


def test_auto_picks_a_backend_and_says_which():
    problem = with_budget(training_chain(4), training_chain(4).keep_all_bytes() // 2)
    result = solve(problem, "auto")
    assert result.solver in (*BACKENDS, PORTFOLIO) and result.status == "optimal"
    assert result.objective == pytest.approx(solve(problem, "cbc").objective)


def test_cheapest_fitting_skips_none_and_what_does_not_fit_and_keeps_the_first_of_equals():
    problem = training_chain(6)
    keep, chen, least = keep_all(problem), chen_sqrt_n(problem), frontier_only(problem)
    tight = with_budget(problem, simulate(problem, chen).peak_bytes[0])  # keep-all does not fit, Chen does
    assert simulate(problem, keep).peak_bytes[0] > tight.budgets[0]
    assert cheapest_fitting(tight, [None, keep, chen, least]) == chen
    twin = replace(chen)  # equal to chen, another object
    assert cheapest_fitting(tight, [least, chen, twin]) is chen
    assert cheapest_fitting(with_budget(problem, 0), [keep, chen, least]) is None
    assert [s for s, _ in fitting(tight, [keep, None, chen])] == [chen]


def test_segment_lengths_fit_where_chen_sqrt_n_does_not():
    graph = training_chain(20)
    tightest = min(simulate(graph, schedule).peak_bytes[0] for schedule in segmentations(graph))
    problem = with_budget(graph, tightest)
    assert simulate(problem, chen_sqrt_n(problem)).peak_bytes[0] > tightest
    schedule = best_segmented(problem)
    assert schedule is not None
    assert check_schedule(problem, schedule).peak_bytes[0] <= tightest
    assert minimum_budget(problem, time_limit=1).feasible <= tightest


def test_segmented_baselines_figure_what_the_built_segmentations_simulate():
    """Each length's peak and cost, figured without building its events, are the simulator's of the events built,
    and so are those of the events the baseline builds when asked for."""
    graph = training_chain(20)
    for baseline, schedule in zip(segmented_baselines(graph), segmentations(graph), strict=True):
        simulation = simulate(graph, schedule)
        assert baseline.peak_bytes == simulation.peak_bytes
        assert baseline.total_cost == pytest.approx(simulation.total_cost, rel=1e-12)
        assert simulate(graph, baseline.schedule).peak_bytes == simulation.peak_bytes


def test_segmentations_past_their_deadline_end_at_the_first_that_fits():
    """With the deadline already past, the search of Chen's lengths still gives a schedule where one fits, and tries
    no length after the first that does; without a deadline it finds the cheapest, which is never costlier."""
    graph = training_chain(20)
    peaks = [baseline.peak_bytes[0] for baseline in segmented_baselines(graph)]
    problem = with_budget(graph, sorted(peaks)[len(peaks) // 2])
    late = best_segmented(problem, deadline=0.0)
    first = next(b for b in segmented_baselines(problem) if b.fits(problem.budgets))
    assert late is not None and check_schedule(problem, late).total_cost == pytest.approx(first.total_cost)
    timely = best_segmented(problem)
    assert timely is not None and check_schedule(problem, timely).total_cost <= first.total_cost


def test_a_solve_past_its_deadline_tries_chen_lengths_only_until_one_fits(monkeypatch):
    """Where neither the eviction heuristic nor a baseline fits, the solve falls back on Chen's segments; with no time
    left it stops at the first length that fits (all of them took a 2 s limit's solve of moe's training step to 47 s
    beside two busy loops)."""
    import onnx_remat.passes.solve.baselines as baselines_module

    sizes = [100, 100, 1000, 1000, 1, 1000, 1, 1, 1, 100, 1000, 1, 100, 1000, 10, 10, 100, 1000, 10]
    costs = [1, 5, 3, 3, 5, 3, 5, 5, 2, 2, 1, 2, 3, 1, 3, 5, 4, 5, 5]
    graph = with_budget(make_problem(19, [*((i, i + 1) for i in range(18)), (13, 17), (14, 18)], sizes, costs), 2100)
    assert offload(graph, 0, max_runs=eviction_runs(graph)) is None and best_baseline(graph) is None
    fitting_lengths = [b.name for b in segmented_baselines(graph) if b.fits(graph.budgets)]
    assert fitting_lengths[0] == "segments-2" and len(fitting_lengths) > 1
    built: list[int] = []
    real = baselines_module.chen_stages

    def counted(problem: Problem, length: int):
        built.append(length)
        return real(problem, length)

    monkeypatch.setattr(baselines_module, "chen_stages", counted)  # the baselines' chen-sqrt-n is kept already
    late = solve(graph, time_limit=0.1)
    assert built == [1, 2] and late.status == SolveStatus.HEURISTIC
    assert check_schedule(graph, late.schedule).peak_bytes[0] <= 2100


def test_stated_minimum_is_never_above_what_the_eviction_heuristic_fits():
    """The minimum budget of ResNet18's training step comes down to at most what the eviction heuristic and the best
    Chen segmentation fit (the heuristic was below the segmentations at batch 8, 128x128: 27.7% of keep-all against
    31.4%)."""
    prepared = prepare(models.build("resnet18", batch=4, resolution=64), "train")
    graph = costed_problem(prepared, get_devices(None)).problem
    keep = graph.keep_all_bytes()
    evicting = offload(with_budget(graph, keep * 3 // 5), 0)
    assert evicting is not None
    heuristic = simulate(graph, evicting).peak_bytes[0]
    segmented = min(simulate(graph, schedule).peak_bytes[0] for schedule in segmentations(graph))
    minimum = minimum_budget(with_budget(graph, keep), time_limit=20)
    assert minimum.lower <= minimum.feasible <= min(heuristic, segmented) and minimum.schedule is not None
    hints = (minimum.schedule,)  # as the pipeline solves at a found minimum: from the schedule that found it
    assert solve(with_budget(graph, minimum.feasible), "highs", time_limit=5, hints=hints).schedule is not None


def test_ctrl_c_returns_the_best_schedule_so_far():
    """A SIGINT one second into a solve too hard to finish stops it with a checked schedule and its gap."""
    graph = unet(14)
    problem = with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 2)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs as a background job
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    result = solve(problem, "highs", time_limit=60)
    assert result.status == "interrupted" and 0 < result.gap < 1
    check_schedule(problem, result.schedule)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_stop_in_the_root_lp_interrupts_the_solve():
    """A stop in a large root LP, where HiGHS checks no interrupt for tens of seconds, ends the solve as interrupted
    (HiGHS runs in a child process that is killed a second after the stop; tools/bench_stop.py measures how fast)."""
    graph = training_chain(100)
    model = build_model(with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 3))
    stop = threading.Event()
    threading.Timer(5.0, stop.set).start()
    outcome = solve_highs(model.milp, 120, stop=stop)
    assert stop.is_set() and outcome.status == "interrupted"


def test_highs_in_a_child_process_finds_the_same_optimum():
    problem = with_budget(training_chain(6), training_chain(6).keep_all_bytes() // 2)
    model = build_model(problem)
    here, there = (solve_highs(model.milp, 60, in_process=flag) for flag in (True, False))
    assert (here.status, there.status) == ("optimal", "optimal")
    assert float(model.milp.cost @ there.x) == pytest.approx(float(model.milp.cost @ here.x))
    assert there.bound == pytest.approx(here.bound)


def test_stop_before_the_milp_returns_the_warm_start(monkeypatch):
    problem = with_budget(training_chain(4), training_chain(4).keep_all_bytes() // 2)

    def interrupted(*args, stop, **kwargs):
        stop.set()
        return MilpOutcome(None, SolveStatus.INTERRUPTED, None)

    monkeypatch.setitem(BACKENDS, "highs", interrupted)
    monkeypatch.setattr(solve_module, "cut_lower_bound", lambda problem, seconds, stop: 0.0)  # proves nothing
    result = solve_module.solve(problem)
    assert result.status == "interrupted"
    assert result.objective == pytest.approx(simulate(problem, best_baseline(problem)).total_cost)


def test_the_time_limit_holds_for_the_whole_solve():
    """Model building and checking count too: a solve too hard to finish ends within its limit with a gap."""
    graph = unet(14)
    problem = with_budget(graph, simulate(graph, keep_all(graph)).peak_bytes[0] // 2)
    result = solve(problem, "highs", time_limit=4)
    assert result.status in ("time_limit", "heuristic") and 0 < result.gap < 1
    check_schedule(problem, result.schedule)


def test_highs_fits_the_minimum_budget_to_the_byte():
    """A Relu between two scalings of 2 MiB tensors, trained: at its minimum budget (proven) HiGHS's schedule fits
    (with HiGHS's default integrality tolerance a computation taken at 1 - 1e-6 hid 2 bytes of a 2 MiB output, and
    its schedule peaked 4 bytes over; `solve` checks every schedule through the simulator)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 1024])
    scales = [helper.make_tensor(name, TensorProto.FLOAT, [1024], [0.5] * 1024) for name in ("w0", "w1")]
    nodes = [helper.make_node("Mul", ["x", "w0"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Mul", ["b", "w1"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], scales),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    problem = costed_problem(prepare(model, "train"), get_devices(None)).problem
    minimum = minimum_budget(problem)
    assert minimum.lower == minimum.feasible
    at_minimum = with_budget(problem, minimum.feasible)
    check_schedule(at_minimum, solve(at_minimum, "highs").schedule)
