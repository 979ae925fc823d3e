"""Operators computed once (issue 12): a random operator recomputed draws new values, so no schedule may recompute it.

Every schedule producer against the brute force and the simulator, detection in ONNX graphs (both PyTorch exporters'
dropout), problem files, and train steps with a random mask rewritten at their minimum budget whose gradients agree
with their forward output in one onnxruntime run.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_multidevice import two_device_problems
from test_solver import (
    between_minimum_and_keep_all,
    brute_force,
    make_problem,
    tiny_problems,
    training_chain,
    with_budget,
)

import onnx_remat
from onnx_remat.core.errors import InfeasibleBudgetError, ModelError, ScheduleError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Free, Schedule
from onnx_remat.passes.execute import run
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.baselines import BASELINES, schedule_from_stages, segmentations
from onnx_remat.passes.solve.interval import solve_intervals
from onnx_remat.passes.solve.lower_bound import cut_lower_bound
from onnx_remat.passes.solve.min_budget import minimum_budget, quick_lower_bound
from onnx_remat.passes.solve.offload import offload
from onnx_remat.problem_file import problem_from_json, problem_to_json, read_problem, write_problem

SOLVERS = ("highs", "cbc", "cpsat", "auto")
FEW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def once_problems(draw, problems: st.SearchStrategy[Problem] | None = None) -> Problem:
    """A problem of `problems` (default tiny_problems) with a non-empty set of its operators computed once."""
    problem = draw(tiny_problems() if problems is None else problems)
    once = draw(st.sets(st.integers(0, problem.num_ops - 1), min_size=1))
    return replace(problem, computed_once=tuple(sorted(once)))


def computed_again(problem: Problem, schedule: Schedule) -> list[int]:
    """The operators computed once by the problem that `schedule` computes other than exactly once."""
    counts = Counter(compute.op for compute in schedule.computes)
    return [op for op in problem.computed_once if counts[op] != 1]


# ---------------------------------------------------------------------------- schedule producers


@FEW
@given(once_problems(), st.floats(0.0, 1.0))
def test_every_backend_computes_them_once_at_the_brute_force_optimum(problem: Problem, fraction: float):
    problem = between_minimum_and_keep_all(problem, fraction)
    expected = brute_force(problem, "cost", problem.budgets[0])
    assert expected is not None
    for solver in SOLVERS:
        result = solve(problem, solver)
        check_schedule(problem, result.schedule)
        assert not computed_again(problem, result.schedule), solver
        assert result.status == "optimal" and result.model_objective == pytest.approx(expected), solver
        assert result.bound <= result.objective + 1e-9
    intervals = solve_intervals(problem, problem.num_ops, 60.0)
    assert intervals.schedule is not None and not computed_again(problem, intervals.schedule)
    assert check_schedule(problem, intervals.schedule).total_cost == pytest.approx(expected)


@FEW
@given(once_problems(), st.floats(0.0, 1.0))
def test_heuristics_never_recompute_them_and_the_bounds_stay_bounds(problem: Problem, fraction: float):
    """Baselines, Chen's segments and the eviction heuristic pass the simulator (which refuses a second computation);
    the minimum budget is at most the brute force's (defer.py's outputs computed last may beat it), above the quick
    bound; the cut bound stays below the optimum."""
    minimum = minimum_budget(problem)
    assert minimum.lower <= minimum.feasible <= brute_force(problem, "peak")  # proven unless an output is deferred
    assert quick_lower_bound(problem) <= minimum.lower
    baselines = [schedule_from_stages(problem, build(problem)) for build in BASELINES.values()]
    for schedule in [*baselines, *segmentations(problem), offload(problem, 0)]:
        if schedule is not None:
            assert not computed_again(problem, schedule)
            simulate(problem, schedule)
    problem = between_minimum_and_keep_all(problem, fraction)
    assert cut_lower_bound(problem) <= brute_force(problem, "cost", problem.budgets[0]) + 1e-9


def test_the_constraint_changes_the_optimum_of_a_training_chain():
    """At 60% of keep-all, the optimal schedule of an 8-layer training chain recomputes its first operator; computed
    once, it is held instead, at a higher cost (40 against 37) and a higher minimum budget (796 against 696 bytes)."""
    free = training_chain(8)
    budget = int(0.6 * simulate(free, schedule_from_stages(free, BASELINES["keep-all"](free))).peak_bytes[0])
    free = with_budget(free, budget)
    once = replace(free, computed_once=(0,))
    unconstrained, constrained = solve(free, "highs"), solve(once, "highs")
    assert Counter(c.op for c in unconstrained.schedule.computes)[0] > 1
    assert not computed_again(once, constrained.schedule)
    assert constrained.objective > unconstrained.objective
    assert minimum_budget(once).feasible > minimum_budget(free).feasible


def test_eviction_heuristic_gives_up_where_it_would_recompute_one():
    """0 -> 1 -> 2 -> 3 -> 4, and 1 -> 4, within 11 bytes: 1 is evicted while 3 runs and recomputed for 4, which
    needs 0 again. Computed once, 0 was freed after its last reader 1: the heuristic finds no schedule rather than
    recompute it, and the MILP holds 0 (1 byte) through instead."""
    free = with_budget(make_problem(5, [(0, 1), (1, 2), (2, 3), (3, 4), (1, 4)], [1, 5, 5, 5, 1], [1] * 5), 11)
    evicting = offload(free, 0)
    assert evicting is not None and Counter(c.op for c in evicting.computes)[0] == 2
    once = replace(free, computed_once=(0,))
    assert offload(once, 0) is None
    result = solve(once, "highs")
    check_schedule(once, result.schedule)
    assert not computed_again(once, result.schedule) and result.schedule.recompute_count() == 1


@FEW
@given(once_problems(two_device_problems()))
def test_two_devices_compute_them_once_and_highs_agrees_with_cbc(problem: Problem):
    try:
        highs = solve(problem, "highs")
    except InfeasibleBudgetError:
        with pytest.raises(InfeasibleBudgetError):
            solve(problem, "cbc")
        return
    cbc = solve(problem, "cbc")
    for result in (highs, cbc):
        check_schedule(problem, result.schedule)
        assert not computed_again(problem, result.schedule)
    assert highs.status == cbc.status == "optimal"
    assert highs.model_objective == pytest.approx(cbc.model_objective, abs=1e-6)
    for compute, store in ((0, 1), (1, 0), (0, None)):
        schedule = offload(problem, compute, store)
        if schedule is not None:
            check_schedule(problem, schedule)


def test_simulator_refuses_a_second_computation():
    problem = replace(with_budget(training_chain(2), 10**9), computed_once=(0,))
    events = (Compute(0, 0), Compute(1, 1), Free(0, 1), Compute(2, 2), Free(1, 2), Compute(0, 3), Compute(3, 3))
    with pytest.raises(ScheduleError, match="computed again, but it may be computed only once"):
        simulate(problem, Schedule(events))
    simulate(replace(problem, computed_once=()), Schedule(events))


@pytest.mark.parametrize("once", [(4,), (-1,), (1, 1)])
def test_problem_refuses_bad_operator_lists(once: tuple[int, ...]):
    with pytest.raises(ValueError, match="computed_once"):
        replace(training_chain(2), computed_once=once)


# ---------------------------------------------------------------------------- problem files


def test_problem_file_round_trip_keeps_them(tmp_path: Path):
    problem = replace(with_budget(training_chain(3), 4000), computed_once=(0, 2))
    write_problem(problem, tmp_path / "p.json")
    assert read_problem(tmp_path / "p.json") == problem


def test_problem_file_without_the_field_reads_as_none_and_a_bad_one_is_refused():
    data = problem_to_json(training_chain(3))
    del data["computed_once"]
    assert problem_from_json(data).computed_once == ()
    with pytest.raises(ModelError, match=r"computed_once\[0\] must be an operator index in 0..5"):
        problem_from_json({**data, "computed_once": [6]})
    with pytest.raises(ModelError, match="repeats an operator"):
        problem_from_json({**data, "computed_once": [1, 1]})


# ---------------------------------------------------------------------------- detection in ONNX


def _once_names(model: onnx.ModelProto | Path, mode: str = "infer") -> list[str]:
    """Names of the operators the model's problem computes once."""
    problem = onnx_remat.costed(model, onnx_remat.RematOptions(mode=mode)).graph.problem
    return [problem.op_names[op] for op in problem.computed_once]


def _one_node_model(node: onnx.NodeProto, extra_nodes=(), initializers=()) -> onnx.ModelProto:
    """input -> Relu -> `node` (and `extra_nodes`) -> Relu -> output, all of shape 2x8 floats."""
    nodes = [helper.make_node("Relu", ["input"], ["x"], name="first"), *extra_nodes, node,
             helper.make_node("Relu", [node.output[0]], ["output"], name="last")]
    value = (2, 8)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, value)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, value)], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _flag(name: str, value: bool) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value), name)


@pytest.mark.parametrize(
    ("model", "once"),
    [
        (_one_node_model(helper.make_node("Dropout", ["x", "", "on"], ["y"], name="drop"),
                         [helper.make_node("Constant", [], ["on"], value=_flag("on", True))]), ["drop"]),
        (_one_node_model(helper.make_node("Dropout", ["x", "", "off"], ["y"], name="drop"), [],
                         [_flag("off", False)]), []),
        (_one_node_model(helper.make_node("Dropout", ["x", "", "off"], ["y"], name="drop"),
                         [helper.make_node("Constant", [], ["off"], value=_flag("off", False))]), []),
        (_one_node_model(helper.make_node("Dropout", ["x"], ["y"], name="drop")), []),
        (_one_node_model(helper.make_node("RandomUniformLike", ["x"], ["y"], name="rand")), ["rand"]),
        (_one_node_model(helper.make_node("RandomNormalLike", ["x"], ["y"], name="rand")), ["rand"]),
        # onnxruntime's CPU provider has no Bernoulli kernel: prepare expands it, and its RandomUniformLike draws
        (_one_node_model(helper.make_node("Bernoulli", ["x"], ["y"], name="coin")), ["coin/RandomUniformLike"]),
    ],
    ids=["dropout-constant-true", "dropout-initializer-false", "dropout-constant-false", "dropout-inference",
         "random-uniform-like", "random-normal-like", "bernoulli"],
)
def test_random_operators_are_detected(model: onnx.ModelProto, once: list[str]):
    assert _once_names(model) == once


def test_a_random_node_inside_a_branch_makes_its_if_random():
    then = helper.make_graph([helper.make_node("RandomUniformLike", ["x"], ["r"], name="inner")], "then", [],
                             [helper.make_tensor_value_info("r", TensorProto.FLOAT, (2, 8))])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["i"], name="same")], "else", [],
                              [helper.make_tensor_value_info("i", TensorProto.FLOAT, (2, 8))])
    branch = helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then, else_branch=other)
    flag = helper.make_node("ReduceMax", ["x"], ["flag_value"], name="peak", keepdims=0)
    positive = helper.make_node("Greater", ["flag_value", "zero"], ["flag"], name="positive")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    assert _once_names(_one_node_model(branch, [flag, positive], [zero])) == ["branch"]


class _DropoutNet(torch.nn.Module):
    """Linear -> Dropout(0.5): PyTorch's exporters write the dropout of a module in training mode."""

    def __init__(self, inplace: bool):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.dropout = torch.nn.Dropout(0.5, inplace=inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear(x))


@pytest.mark.parametrize(
    ("exporter", "inplace", "random_op"),
    [("legacy", False, "Dropout"), ("dynamo", False, "Dropout"), ("dynamo", True, "RandomUniformLike")],
)
def test_exported_dropout_in_training_mode_is_computed_once(tmp_path: Path, exporter: str, inplace: bool,
                                                            random_op: str):
    """The legacy exporter writes Dropout with a constant true training_mode; the dynamo exporter writes that too, or
    for an in-place dropout RandomUniformLike -> Less -> CastLike -> Div -> Mul. Inference and training alike."""
    module, path = _DropoutNet(inplace).train(), tmp_path / "net.onnx"
    inputs = (torch.randn(2, 8),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=17, do_constant_folding=False,
                              training=torch.onnx.TrainingMode.TRAINING, input_names=["input"])
        else:
            torch.onnx.export(module, inputs, dynamo=True, input_names=["input"], optimize=False,
                              verbose=False).save(str(path))
    random_nodes = [node.name for node in onnx.load(path).graph.node if node.op_type == random_op]
    assert len(random_nodes) == 1
    for mode in ("infer", "train"):
        assert _once_names(path, mode) == random_nodes


# ---------------------------------------------------------------------------- train steps end to end

BATCH, WIDTH, HIDDEN, RATIO = 256, 32, 128, 0.5


def masked_net(style: str) -> onnx.ModelProto:
    """input (graph input) -> random mask (a training-mode Dropout, or the dynamo exporter's RandomUniformLike ->
    Less -> Cast -> Div -> Mul) -> Mul by the parameter t -> MatMul -> Tanh -> MatMul -> Tanh -> out.

    The masked tensor is read at the start of the forward pass and at the end of the backward one (grad.t = dout/de *
    the masked tensor, zero exactly where its mask is), and the wide middle peaks: at the minimum budget without the
    constraint the solver recomputes the random operator (checked in the test)."""
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((BATCH, WIDTH)).astype(np.float32), "t"),
        numpy_helper.from_array((rng.standard_normal((WIDTH, HIDDEN)) / WIDTH**0.5).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((HIDDEN, WIDTH)) / HIDDEN**0.5).astype(np.float32), "w2"),
    ]
    keep = numpy_helper.from_array(np.array(1 - RATIO, np.float32))
    if style == "dropout":
        ratio = numpy_helper.from_array(np.array(RATIO, np.float32))
        nodes = [helper.make_node("Constant", [], ["ratio"], value=ratio),
                 helper.make_node("Dropout", ["input", "ratio"], ["d"], name="random")]
    else:
        nodes = [helper.make_node("RandomUniformLike", ["input"], ["r"], name="random"),
                 helper.make_node("Constant", [], ["keep_p"], value=keep),
                 helper.make_node("Less", ["r", "keep_p"], ["kept"], name="less"),
                 helper.make_node("Cast", ["kept"], ["mask"], name="cast", to=TensorProto.FLOAT),
                 helper.make_node("Div", ["mask", "keep_p"], ["scaled"], name="div"),
                 helper.make_node("Mul", ["input", "scaled"], ["d"], name="apply")]
    nodes += [helper.make_node("Mul", ["d", "t"], ["e"], name="scale"),
              helper.make_node("MatMul", ["e", "w1"], ["z1"], name="mm1"),
              helper.make_node("Tanh", ["z1"], ["h1"], name="tanh1"),
              helper.make_node("MatMul", ["h1", "w2"], ["z2"], name="mm2"),
              helper.make_node("Tanh", ["z2"], ["out"], name="tanh2")]
    shape = (BATCH, WIDTH)
    graph = helper.make_graph(nodes, style, [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def autograd(model: onnx.ModelProto, x: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The output and every parameter's gradient of `masked_net` under the sum loss with this mask, in float64."""
    params = {init.name: torch.tensor(numpy_helper.to_array(init), dtype=torch.float64, requires_grad=True)
              for init in model.graph.initializer}
    masked = torch.tensor(x, dtype=torch.float64) * torch.tensor(mask, dtype=torch.float64) / (1 - RATIO)
    out = torch.tanh(torch.tanh((masked * params["t"]) @ params["w1"]) @ params["w2"])
    out.sum().backward()
    return {"out": out.detach().numpy(), **{f"grad.{name}": p.grad.numpy() for name, p in params.items()}}


@pytest.mark.parametrize("style", ["dropout", "uniform"])
def test_train_step_at_its_minimum_uses_one_mask(style: str):
    """Rewritten at its minimum budget, the train step's output and gradients, from one onnxruntime run, are those of
    one mask: the one its grad.t shows (zero where the mask is). Recomputing the random operator (which the solver
    does without the constraint, at that problem's minimum) drew a second mask: outputs off by up to 1.8."""
    model = masked_net(style)
    options = onnx_remat.RematOptions(mode="train", training=onnx_remat.TrainingOptions(loss="sum"), time_limit=60)
    costed = onnx_remat.costed(model, options)
    problem = costed.graph.problem
    random_op = problem.op_names.index("random")
    assert problem.computed_once == (random_op,)
    free = replace(problem, computed_once=())
    least = minimum_budget(free, time_limit=60)
    hints = () if least.schedule is None else (least.schedule,)
    loose = solve(with_budget(free, least.feasible), "highs", time_limit=60, hints=hints)
    assert Counter(c.op for c in loose.schedule.computes)[random_op] > 1
    result = onnx_remat.rewritten(onnx_remat.solve_at(costed, "min", options))
    assert not computed_again(problem, result.schedule) and result.report.recomputations
    assert result.report.computed_once == ("random",)
    assert "random       1 operators computed once, never recomputed: random" in result.report.summary()
    assert not [node.name for node in result.model.graph.node if node.name.startswith("random__remat")]
    x = np.random.default_rng(1).standard_normal((BATCH, WIDTH)).astype(np.float32)
    names = [output.name for output in result.model.graph.output]
    got = dict(zip(names, run(result.model, {"input": x}), strict=True))
    mask = got["grad.t"] != 0
    assert 0.4 < mask.mean() < 0.6
    for name, want in autograd(model, x, mask).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
