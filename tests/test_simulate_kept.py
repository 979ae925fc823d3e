"""What a runtime keeps per computation (Problem.kept_bytes): held for the whole run by the simulator, and every
solver's schedule within its budget with it, at the brute force's optimum and minimum budget."""

from __future__ import annotations

from dataclasses import replace

import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, shape_inference
from test_simulate import GOOD, chain3, run
from test_solver import stage_peak, subsets, tiny_problems, with_budget

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Free
from onnx_remat.passes.build_problem import build_problem
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.problem_file import problem_from_json, problem_to_json

FEW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_kept(problem: Problem, kept: tuple[int, ...]) -> Problem:
    return replace(problem, kept_bytes=(kept,) * problem.num_devices)


def test_kept_bytes_of_every_computation_are_held_throughout():
    """a, b, c keep 10, 20, 40 bytes: the whole run holds 70 more; recomputing a holds 10 more again."""
    problem = with_kept(chain3(), (10, 20, 40))
    assert simulate(problem, GOOD).memory_trace == ((1170, 1370, 1270, 1570, 1370),)
    again = run(Compute(0, 0), Free(0, 0), Compute(0, 1), Compute(1, 1), Free(0, 1), Compute(2, 2), Free(1, 2))
    assert simulate(problem, again).peak_bytes == (1500 + 80,)
    assert problem.keep_all_bytes() == 1000 + 70 + 600 + 50


def test_kept_bytes_count_on_the_device_that_computes():
    problem = replace(chain3(devices=("cpu", "gpu")), kept_bytes=((10, 20, 40), (0, 0, 0)))
    simulation = simulate(problem, run(Compute(0, 0, 1), Compute(1, 1, 1), Copy(1, 2, 1, 0), Compute(2, 2, 0)))
    assert simulation.memory_trace[0][0] == 1000 + 40
    assert simulation.memory_trace[1][0] == 1000 + 100  # its runtime keeps nothing


def test_kept_bytes_must_be_devices_by_operators():
    with pytest.raises(ValueError, match="kept_bytes"):
        with_kept(chain3(), (1, 2))


def test_problem_files_carry_kept_bytes():
    problem = with_kept(chain3(), (10, 20, 40))
    assert problem_from_json(problem_to_json(problem)) == problem


@st.composite
def kept_problems(draw) -> Problem:
    problem = draw(tiny_problems(max_ops=6))
    return with_kept(problem, tuple(draw(st.lists(st.integers(0, 3), min_size=problem.num_ops,
                                                  max_size=problem.num_ops))))


def brute_force_kept(problem: Problem, objective: str, budget: int | None = None) -> float | None:
    """The cheapest schedule within `budget` ("cost") or the smallest peak ("peak") with kept bytes, by a dynamic
    program over (held set, kept bytes of recomputations so far); for "cost" once per reserve for the recomputations'
    kept bytes, each stage's peak within the budget less the reserve."""
    kept, n = problem.kept_bytes[0], problem.num_ops
    base = sum(kept)
    if objective == "peak":
        return min((peak + base + extra for (_, extra), peak in _states(problem, None).items()), default=None)
    assert budget is not None
    reserves = range(sum(kept) * (n - 1) + 1)
    found = [value for reserve in reserves for (_, extra), value in
             _states(problem, budget - base - reserve).items() if extra <= reserve]
    return min(found, default=None)


def _states(problem: Problem, budget: int | None) -> dict[tuple[frozenset, int], float]:
    """(held set after the last stage, recomputations' kept bytes) -> the least cost (budget given: every stage's
    peak within it) or the least peak of the stages (no budget)."""
    n, outputs, kept = problem.num_ops, frozenset(problem.graph_outputs), problem.kept_bytes[0]
    states: dict[tuple[frozenset, int], float] = {(frozenset(), 0): 0.0}
    for t in range(n):
        useful = {i for i in range(t + 1) if i in outputs or problem.successors[i]}
        following: dict[tuple[frozenset, int], float] = {}
        for (held, extra), value in states.items():
            for again in subsets(i for i in range(t) if i not in held):
                computes = sorted(again) + [t]
                for keep in [outputs] if t == n - 1 else subsets((held | set(computes)) & useful):
                    if not keep <= held | set(computes):
                        continue
                    peak = stage_peak(problem, held, computes, keep)
                    if peak is None or (budget is not None and peak > budget):
                        continue
                    key = (keep, extra + sum(kept[i] for i in again))
                    total = value + sum(problem.cost[0][k] for k in computes) if budget is not None else max(value,
                                                                                                           peak)
                    following[key] = min(total, following.get(key, float("inf")))
        states = following
    return states


@FEW
@given(kept_problems())
def test_minimum_budget_counts_kept_bytes(problem: Problem):
    found = minimum_budget(problem)
    assert found.lower <= found.feasible <= brute_force_kept(problem, "peak")  # proven unless an output is deferred


@FEW
@given(kept_problems(), st.floats(0.0, 1.0))
@pytest.mark.parametrize("solver", ["highs", "cpsat", "auto"])
def test_solvers_are_optimal_within_the_budget_with_kept_bytes(solver: str, problem: Problem, fraction: float):
    minimum = int(brute_force_kept(problem, "peak") or 0)
    keep_all = problem.keep_all_bytes()
    problem = with_budget(problem, int(minimum + fraction * (keep_all - minimum)))
    result = solve(problem, solver)
    check_schedule(problem, result.schedule)
    expected = brute_force_kept(problem, "cost", problem.budgets[0])
    assert expected is not None and result.objective <= result.model_objective + 1e-9
    if solver == "auto":  # the interval model orders a stage's computations freely: it may beat the staged optimum
        assert result.objective <= expected + 1e-9
    else:  # the staged model's optimum; the schedule drops a computation whose output is freed before any read
        assert result.model_objective == pytest.approx(expected)


def test_build_problem_counts_nodes_writing_into_their_input_buffer_and_the_prelude_with_the_first_operator():
    """A Relu in place over a Neg's output and an Identity keep 240 bytes each on the first device; the Identity of
    a sum of initializers (read by two operators) runs up front, on the first operator's device, so it loads with
    operator 0 (its output, read by operators 1 and 2, also with them)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    weights = [helper.make_tensor(name, TensorProto.FLOAT, [4], [1.0] * 4) for name in ("w", "v")]
    nodes = [helper.make_node("Add", ["w", "v"], ["c"], name="up_front"),
             helper.make_node("Identity", ["c"], ["ci"], name="view"),
             helper.make_node("Neg", ["x"], ["n"], name="neg"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "ci"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "ci"], ["y"], name="mul")]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y], weights))
    infos = tensor_infos(shape_inference.infer_shapes(proto))
    costs = {name: (lambda node, sizes: 1.0) for name in ("ort", "ov")}
    graph = build_problem(ir.from_proto(proto), infos, costs, lambda node, sizes: 0, shared_kept={"ort": 240, "ov": 0})
    plain = build_problem(ir.from_proto(proto), infos, costs, lambda node, sizes: 0).problem
    assert graph.opmap.node_names == (("neg", "relu"), ("add",), ("mul",))
    assert graph.problem.kept_bytes == ((240, 0, 0), (0, 0, 0))
    every = range(graph.problem.num_ops)
    assert graph.problem.resident_bytes == (0, 0)
    assert [group.readers for group in graph.problem.loaded] == [(0,), (0, 1, 2)]
    assert graph.problem.resident_with(0, every) == plain.resident_with(0, every) + 240
    assert graph.problem.resident_with(1, every) == plain.resident_with(1, every)
    assert graph.problem.resident_with(1, [1]) == graph.problem.loaded[1].bytes[1]
