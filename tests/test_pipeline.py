"""The whole path on one device: remat -> rewritten model -> onnxruntime, same numbers, within budget."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import CPU_TWO_THREADS, conv_chain, skip_net

import onnx_remat
import onnx_remat.pipeline as pipeline
from onnx_remat.core.budget import format_bytes
from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import InfeasibleBudgetError, RematWarning, SolverError, UsageError
from onnx_remat.core.options import LAST_SECONDS, RematOptions
from onnx_remat.passes.execute import executed_node_names, random_feeds, run
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.passes.solve import solve
from onnx_remat.pipeline import (
    FINISH_SECONDS,
    PLOT_SECONDS,
    _known_minimum,
    _solve_seconds,
    _time_left,
    costed_problem,
    finish_estimate,
    prepare,
    solve_at,
    with_headroom,
)


@pytest.mark.parametrize("position", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("build", [conv_chain, skip_net])
def test_rewritten_model_matches_original_within_budget(build, position):
    """Budgets from the keep-all order's peak (no recomputation needed) down to the minimum."""
    original = build()
    reference = onnx_remat.remat(original, "100%").report
    low, high = reference.minimum_budget_bytes, reference.baselines["keep-all"].peak_bytes
    result = onnx_remat.remat(original, int(low + position * (high - low)))
    onnx.checker.check_model(result.model, full_check=True)
    simulation = check_schedule(result.problem, result.schedule)
    assert max(simulation.peak_bytes) <= result.report.budget_bytes
    assert result.report.predicted_peak_bytes == max(simulate(result.problem, result.schedule, as_run=True).peak_bytes)
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(result.model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_low_budget_forces_recompute_that_really_executes():
    original = skip_net()
    result = onnx_remat.remat(original, "min")
    recomputes = [n.name for n in result.model.graph.node if "__remat" in n.name]
    assert recomputes, "the minimum budget of a skip network needs recomputation"
    assert result.report.recomputations
    executed = executed_node_names(result.model, random_feeds(original, seed=0))
    assert set(recomputes) <= set(executed)


def test_nodes_carry_role_and_origin_and_follow_schedule_order():
    result = onnx_remat.remat(skip_net(), "min")
    roles = {}
    for node in result.model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        roles[node.name] = meta["onnx_remat.role"]
        assert meta["onnx_remat.device"] == "cpu"
        assert node.name.startswith(meta["onnx_remat.origin"])
    assert {roles[n] for n in roles if "__remat" in n} == {"recompute"}
    assert {roles[n] for n in roles if "__remat" not in n} == {"forward"}


def test_report_is_consistent_with_schedule():
    result = onnx_remat.remat(skip_net(), "75%")
    report = result.report
    assert report.budget_bytes == int(0.75 * report.keep_all_bytes)
    assert report.minimum_budget_bytes <= report.budget_bytes
    extra = sum(r.extra_computations for r in report.recomputations)
    assert extra == result.schedule.recompute_count()
    assert report.predicted_seconds >= report.keep_all_seconds
    assert report.predicted_seconds <= min(b.seconds for b in report.baselines.values() if b.within_budget) + 1e-12


def test_the_summary_says_whether_the_stated_minimum_is_proven():
    report = onnx_remat.remat(skip_net(), "min").report
    assert report.minimum_lower_bytes <= report.minimum_budget_bytes <= report.budget_bytes
    line = next(line for line in report.summary().splitlines() if line.startswith("budget"))
    proven = report.minimum_lower_bytes == report.minimum_budget_bytes
    assert (", proven)" in line) == proven
    assert ("found, proven at least" in line) == (not proven)
    unproven = replace(report, minimum_lower_bytes=report.minimum_budget_bytes // 2)
    assert f"proven at least {format_bytes(report.minimum_budget_bytes // 2)}" in unproven.summary()


def test_budget_below_minimum_states_the_minimum():
    with pytest.raises(onnx_remat.InfeasibleBudgetError) as info:
        onnx_remat.remat(skip_net(), "10%")
    minimum = info.value.minimum_bytes
    assert minimum and str(minimum) in str(info.value)
    assert onnx_remat.remat(skip_net(), minimum).report.predicted_peak_bytes <= minimum


def test_headroom_leaves_a_share_of_the_budget_free():
    """4% headroom at the budget the un-rewritten order needs: the schedule peaks within 96% of it (recomputing),
    the report states the budget; headroom that takes a budget below the minimum is refused with the minimum."""
    original = skip_net()
    reference = onnx_remat.remat(original, "100%").report
    budget = reference.baselines["keep-all"].peak_bytes
    plain = onnx_remat.remat(original, budget).report
    spared = onnx_remat.remat(original, budget, headroom=0.04).report
    assert spared.budget_bytes == budget
    assert spared.predicted_peak_bytes <= 0.96 * budget < plain.predicted_peak_bytes
    assert sum(r.extra_computations for r in spared.recomputations) > 0
    with pytest.raises(InfeasibleBudgetError, match="headroom"):
        onnx_remat.remat(original, reference.minimum_budget_bytes, headroom=0.05)
    with pytest.raises(UsageError, match="headroom"):
        onnx_remat.remat(original, budget, headroom=1.5)


def test_summary_counts_the_recomputed_nodes_a_user_sees():
    """One operator may be a group of nodes (a training step's layers): the summary counts the graph's `__remat`
    nodes, not the operators' extra computations. 250 KiB is below the peak without recomputation (266.2 KiB with two
    threads, of which 72 KiB the worker thread's stack: runtime_kept) and above the least found (236.1 KiB): any
    schedule within it recomputes. No time limit: the heuristics alone fit no less than 250.2 KiB, and with 10 s at a
    load that slows preparing 22 times the solver had no time left to find one."""
    result = onnx_remat.remat(conv_chain(depth=4, size=16), "250KiB", mode="train", devices=CPU_TWO_THREADS,
                              time_limit=None)
    nodes = sum(1 for n in result.model.graph.node if "__remat" in n.name)
    extra = sum(r.extra_computations for r in result.report.recomputations)
    assert result.report.recomputed_nodes == nodes >= extra > 0
    assert f"recompute    {nodes} nodes: {extra} extra computations" in result.report.summary()


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_the_prepared_model_is_one_onnx_ir_model_sized_as_onnxruntime_computes(mode):
    """prepare() keeps one ir.Model whose every node output carries the shape and element type onnxruntime gives
    it; `proto` is that model serialised once."""
    prepared = prepare(skip_net(), mode)
    assert isinstance(prepared.model, ir.Model) and prepared.proto is prepared.proto
    infos = tensor_infos(prepared.model)
    names = [value.name for node in prepared.model.graph for value in node.outputs if value.name]
    probe = onnx.ModelProto()
    probe.CopyFrom(prepared.proto)
    declared = {output.name for output in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in declared)
    computed = dict(zip([o.name for o in probe.graph.output], run(probe, random_feeds(probe, seed=0)), strict=True))
    for name in names:
        assert infos[name].shape == computed[name].shape, name
        assert infos[name].elem_type == onnx.helper.np_dtype_to_tensor_dtype(computed[name].dtype), name


def test_headroom_refuses_only_the_budgets_it_takes_below_their_minimum():
    """A budget under the best known minimum but above the proven bound is the solver's to try: no headroom (or any
    headroom) lets it through; a headroom that takes a budget from its minimum to below it is refused by name."""
    graph = prepare(conv_chain(depth=2), "infer")
    problem = costed_problem(graph, get_devices(None)).problem
    problem = replace(problem, budgets=(1000,))
    assert with_headroom(problem, 0.0, (1200,)).budgets == (1000,)
    assert with_headroom(problem, 0.1, (1200,)).budgets == (900,)
    assert with_headroom(problem, 0.1, (800,)).budgets == (900,)
    refusal = "budget 1000 B less 20% headroom, 800 B, is below the minimum feasible budget 900 B"
    with pytest.raises(InfeasibleBudgetError, match=refusal):
        with_headroom(problem, 0.2, (900,))


def test_a_budget_at_the_found_minimum_always_has_its_schedule():
    """The minimum-budget search's schedule starts the solver: with too little time for the MILP to find its own at
    that budget, the solve still returns one (was 'no schedule found' on a training chain's minimum)."""
    result = onnx_remat.remat(conv_chain(depth=4, size=8), "min", mode="train", time_limit=0.5)
    assert result.report.predicted_peak_bytes <= result.report.budget_bytes
    check_schedule(result.problem, result.schedule)


def test_no_schedule_found_states_the_smallest_budget_known_to_fit_and_the_proven_least():
    """When the solver finds no schedule at a budget the search could not refuse, the error says what to ask for,
    whether or not the minimum was searched before (with --report it was, and the error said only 'raise it')."""
    costed = costed_problem(prepare(conv_chain(depth=4, size=8), "train"), get_devices(None))
    minimum = costed.minima.minimum(costed.problem.budgets, 0, 0.0)  # the heuristics' alone: not proven
    assert minimum.lower < minimum.feasible
    problem = replace(costed.problem, budgets=(minimum.lower,))
    with pytest.raises(SolverError) as error:
        _known_minimum(costed.minima, problem, SolverError("no schedule"), 0.0)
    assert f"{minimum.feasible} bytes" in str(error.value) and format_bytes(minimum.lower) in str(error.value)


def test_a_budget_at_a_known_minimum_has_a_schedule_where_the_heuristics_fail_and_no_time_is_left():
    """A budget at or above the smallest known to fit gives a schedule, at worst the one that fit. With the minimum
    searched before (a sweep's earlier point, or the search's cache) and the deadline already past, the heuristics
    found nothing at the budget, and the error said the smallest budget known to fit was the very one asked for."""
    costed = costed_problem(prepare(conv_chain(depth=4, size=8), "train"), get_devices(None))
    minimum = costed.minima.minimum(costed.problem.budgets, 0, 10.0)
    # What the solver alone finds there, saying why: 24 operators are not too many for it (it said they were).
    with pytest.raises(SolverError, match="no heuristic schedule fits .* the time limit left too little"):
        solve(replace(costed.problem, budgets=(minimum.feasible,)), time_limit=LAST_SECONDS)
    options = RematOptions(time_limit=1.0, find_minimum=False)
    solved = solve_at(costed, minimum.feasible, options, started=time.perf_counter() - 10.0)
    check_schedule(solved.problem, solved.result.schedule)
    assert solved.result.simulation.peak_bytes[0] <= minimum.feasible == solved.problem.budgets[0]
    # at most the budget asked for: with the execution frame's bytes per computation the schedule found there can
    # peak below the search's minimum (114,848 against 114,920 bytes: three values' 24 bytes each)
    assert solved.minimum_bytes[0] <= minimum.feasible


def test_the_time_kept_for_the_last_stages_grows_with_their_work_and_the_load():
    """The rewrite, report and files are estimated from the nodes, the weight bytes and whether a plot is drawn, times
    how much slower than an idle core the machine runs now."""
    small = finish_estimate(700, 500_000, plot=False, slowdown=1.0)
    assert FINISH_SECONDS < small < finish_estimate(5500, 500_000, plot=False, slowdown=1.0)
    assert small < finish_estimate(700, 30_000_000, plot=False, slowdown=1.0)
    assert small + PLOT_SECONDS < finish_estimate(700, 500_000, plot=True, slowdown=1.0)
    assert finish_estimate(700, 500_000, plot=False, slowdown=3.0) == pytest.approx(3 * small)


def test_the_search_and_solver_get_the_limit_less_the_time_kept_for_the_last_stages():
    """What is left of the limit counts from the command's start and keeps the last stages' estimate; the solver gets
    at least LAST_SECONDS to return its starting schedule."""
    assert _time_left(None, time.perf_counter(), 5.0) is None
    assert _time_left(30.0, time.perf_counter() - 26.0, 5.0) == 0.0
    assert _solve_seconds(30.0, time.perf_counter() - 26.0, 5.0) == LAST_SECONDS
    assert 0 < _time_left(3600.0, time.perf_counter(), 5.0) <= 3595.0


def test_preparing_states_how_much_the_load_slows_it():
    assert prepare(skip_net()).slowdown >= 1.0


def test_no_time_left_to_measure_costs_uses_the_roofline_and_says_why(monkeypatch):
    """Measuring would not stop before its first deadline check (sessions, a whole run): with no time for that the
    roofline serves, no runtime is started, and the summary says why."""
    monkeypatch.delenv("ONNX_REMAT_COST_MODEL", raising=False)
    with pytest.warns(RematWarning, match="past the time limit"):
        problem = onnx_remat.costed(skip_net(), onnx_remat.RematOptions(time_limit=0.0), started=time.perf_counter())
    assert problem.cost_model == "analytic"
    assert problem.cost_source.startswith("roofline estimates: measuring in-graph costs would take longer than its "
                                          "share of the time limit (about")


def test_costs_whose_whole_runs_would_pass_their_share_are_not_measured(monkeypatch):
    """Measuring runs the whole model a few times before its first deadline check: a model whose one run the roofline
    puts at 3.4 s (a 4096-square MatMul) is not measured in a 40 s limit, whatever few nodes it has (measuring such a
    training step took 45 CPU s past its 14 s share)."""
    monkeypatch.delenv("ONNX_REMAT_COST_MODEL", raising=False)
    square = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["a", "b"], ["c"], name="matmul")], "big",
        [square(name, onnx.TensorProto.FLOAT, [4096, 4096]) for name in ("a", "b")],
        [square("c", onnx.TensorProto.FLOAT, [4096, 4096])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    problem = onnx_remat.costed(model, onnx_remat.RematOptions(time_limit=40.0), started=time.perf_counter())
    assert problem.cost_model == "analytic"
    assert problem.cost_source.startswith("roofline estimates: measuring in-graph costs would take longer than its "
                                          "share of the time limit (about")


def test_costs_needing_between_a_quarter_and_half_of_the_time_left_are_measured(monkeypatch, tmp_path):
    """Measuring may take up to half of what is left when a quarter is too little: its share is then exactly what it
    needs, which a deadline set before the check had always made too short (the roofline served instead)."""
    monkeypatch.delenv("ONNX_REMAT_COST_MODEL", raising=False)
    monkeypatch.setattr(pipeline, "_measure_seconds", lambda roofline: 400.0)
    options = onnx_remat.RematOptions(time_limit=1000.0, cache_dir=tmp_path)
    problem = onnx_remat.costed(skip_net(), options, started=time.perf_counter())
    assert problem.cost_model == "in-graph"
    assert not problem.cost_source.startswith("roofline")


def test_a_late_warning_on_a_graph_too_large_for_the_exact_solver_promises_no_search():
    """Past the limit on a graph the exact solver never takes, the warning says the schedule is the heuristics' at any
    limit and what a longer one leaves time for: it said to raise the limit "for the solver to search" (moe's training
    step, 618 operators, whose solve is the heuristics' at any limit)."""
    options = onnx_remat.RematOptions(time_limit=0.0, cost_model="analytic")
    with pytest.warns(RematWarning) as caught:
        problem = onnx_remat.costed(conv_chain(depth=320, channels=1, size=2), options)
    assert problem.problem.num_ops == 321
    message = " ".join(str(warning.message) for warning in caught)
    wanted = (r"at 321 operators the graph is too large for the exact solver, so the schedule is the heuristics' at "
              r"any limit; raise --time-limit above \d+ s to leave time to measure costs")
    assert re.search(wanted, message)
    assert "solver to search" not in message


@pytest.mark.parametrize("time_limit", [0.0, 1e-3])
def test_a_limit_too_short_for_preparing_warns_and_still_gives_a_valid_schedule(time_limit):
    """With no time at all the warm starts, bounded by work, still give a schedule within the budget (checked by the
    simulator), the rewritten model computes what the original does, and one warning says what to raise."""
    original = skip_net()
    with pytest.warns(RematWarning, match=r"past the time limit .*: .*raise --time-limit above \d+ s"):
        result = onnx_remat.remat(original, "min", time_limit=time_limit)
    simulation = check_schedule(result.problem, result.schedule)
    assert max(simulation.peak_bytes) <= result.report.budget_bytes
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(result.model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
