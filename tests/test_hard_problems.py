"""Issue 14's hard small training steps: the MILP's relaxation above the trivial bound, two backends' optima equal."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.devices import get_devices
from onnx_remat.core.problem import Problem
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve.backend import SolveStatus
from onnx_remat.passes.solve.baselines import BASELINES, schedule_from_stages
from onnx_remat.passes.solve.cbc import solve_cbc
from onnx_remat.passes.solve.checkmate_milp import build_model
from onnx_remat.passes.solve.highs import solve_highs
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.pipeline import costed_problem, prepare


def concat_step(rows: int, width: int) -> Problem:
    """The training step of issue 14's concat graph (x * w0 beside MatMul, Tanh, MatMul; Concat; Tanh), roofline
    costs: two costly MatMuls among cheap element-wise operators, workspaces, resident weights, graph outputs."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((0.02 * rng.standard_normal(shape)).astype(np.float32), name)
               for name, shape in (("w0", (width,)), ("up", (width, 2 * width)), ("down", (2 * width, width)))]
    nodes = [
        helper.make_node("Mul", ["x", "w0"], ["a"]),
        helper.make_node("MatMul", ["x", "up"], ["b0"]),
        helper.make_node("Tanh", ["b0"], ["b1"]),
        helper.make_node("MatMul", ["b1", "down"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
        helper.make_node("Tanh", ["c"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 2 * width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return costed_problem(prepare(model, "train"), get_devices(None)).problem


@pytest.fixture(scope="module")
def concat() -> Problem:
    """The concat step at 2% above its minimum budget, where it must recompute."""
    problem = concat_step(64, 128)
    return replace(problem, budgets=(int(1.02 * minimum_budget(problem).feasible),))


def test_the_relaxation_bounds_above_computing_everything_once(concat: Problem):
    """The frees' stage rows keep the LP from holding a fraction of a tensor and freeing it again: its bound is
    above the trivial one (every operator once), which the per-free rows alone did not pass."""
    model = build_model(concat)
    relaxed = dataclasses.replace(model.milp, integer=np.zeros_like(model.milp.integer))
    outcome = solve_highs(relaxed)
    assert outcome.status == SolveStatus.OPTIMAL and outcome.x is not None
    trivial = sum(concat.cost[0])
    assert float(outcome.x @ model.milp.cost) * model.objective_unit > trivial * (1 + 1e-4)


def test_highs_and_cbc_prove_the_same_optimum(concat: Problem):
    """Both MILP backends prove the step's optimum, the same one, and every baseline that fits costs no less."""
    model = build_model(concat)
    costs = []
    for backend in (solve_highs, solve_cbc):
        outcome = backend(model.milp, None, gaps=(1e-9, 1e-9))
        assert outcome.status == SolveStatus.OPTIMAL and outcome.x is not None
        costs.append(check_schedule(concat, model.schedule(outcome.x)).total_cost)
    assert costs[0] == pytest.approx(costs[1], rel=1e-6)
    assert costs[0] > sum(concat.cost[0]) * (1 + 1e-4)  # the budget forces a recomputation
    for build in BASELINES.values():
        baseline = simulate(concat, schedule_from_stages(concat, build(concat)))
        assert baseline.peak_bytes[0] > concat.budgets[0] or baseline.total_cost >= costs[0] * (1 - 1e-6)


def test_every_baseline_satisfies_the_strengthened_rows(concat: Problem):
    """The new rows cut off no schedule: at a budget every baseline fits, each one's assignment (FREE at its true
    value) satisfies every row of the model."""
    roomy = replace(concat, budgets=(2 * concat.keep_all_bytes(),))
    model = build_model(roomy)
    matrix = model.milp.matrix.toarray()
    for build in BASELINES.values():
        values = matrix @ model.assignment(schedule_from_stages(roomy, build(roomy)))
        assert np.all(values >= model.milp.row_lower - 1e-6) and np.all(values <= model.milp.row_upper + 1e-6)


def test_every_baseline_fitting_to_the_byte_satisfies_the_stage_knapsacks(concat: Problem):
    """The stages' knapsack rows cut off no schedule, even one at exactly its own peak: at a budget equal to each
    baseline's simulated peak, its assignment satisfies every row of the model."""
    for build in BASELINES.values():
        schedule = schedule_from_stages(concat, build(concat))
        tight = replace(concat, budgets=(simulate(concat, schedule).peak_bytes[0],))
        model = build_model(tight)
        values = model.milp.matrix.toarray() @ model.assignment(schedule)
        assert np.all(values >= model.milp.row_lower - 1e-6) and np.all(values <= model.milp.row_upper + 1e-6)
