"""Control flow: an If whose branches read outer tensors. The read is an edge like an input: the producer stays
before the If, the tensor lives until the If runs, and a recomputed instance is what the branches read."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto
from onnx import helper as h

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.core.opmap import OpMap
from onnx_remat.core.schedule import Compute, Schedule
from onnx_remat.passes.execute import run
from onnx_remat.passes.execution_frame import ORT_VALUE_BYTES, ROUNDING_BYTES, session_values
from onnx_remat.passes.reads import outer_uses, value_reads
from onnx_remat.passes.rewrite import rewrite
from onnx_remat.passes.run_devices import build_plan, execute
from onnx_remat.passes.sizes import allocated_bytes

WIDTH = 256


def _branch(name: str, op: str) -> onnx.GraphProto:
    """A branch giving op(sum a, sum d) from the outer graph's tensors a and d (a small output, so that recomputing a
    rather than holding it across the chain lowers the peak; scalars inside, so that the branch itself holds
    little while the If runs)."""
    out = h.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [])
    nodes = [h.make_node("ReduceSum", ["a"], [f"{name}_a"], keepdims=0),
             h.make_node("ReduceSum", ["d"], [f"{name}_d"], keepdims=0),
             h.make_node(op, [f"{name}_a", f"{name}_d"], [f"{name}_out"])]
    return h.make_graph(nodes, name, [], [out])


def if_model() -> onnx.ModelProto:
    """a = Relu(x) starts a chain b -> c -> d and is read again inside the If's branches: keeping a across the chain
    or recomputing it before the If is the solver's choice."""
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])
    flag = h.make_tensor_value_info("flag", TensorProto.BOOL, [])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [])
    nodes = [
        h.make_node("Relu", ["x"], ["a"], name="relu"),
        h.make_node("Sigmoid", ["a"], ["b"], name="sigmoid"),
        h.make_node("Tanh", ["b"], ["c"], name="tanh"),
        h.make_node("Exp", ["c"], ["d"], name="exp"),
        h.make_node("If", ["flag"], ["y"], name="branch",
                    then_branch=_branch("then", "Add"), else_branch=_branch("else", "Sub")),
    ]
    model = h.make_model(h.make_graph(nodes, "if_reads_outer", [x, flag], [y]),
                         opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def outer_reads(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Each If of `model` by name -> the outer tensors its branches read, each once, in order of first use."""
    graph = ir.serde.deserialize_model(model).graph
    return {str(node.name): list(dict.fromkeys(str(value.name) for _, _, value in outer_uses(node)))
            for node in graph if node.op_type == "If"}


def test_an_if_reads_its_branches_outer_tensors():
    branch = ir.serde.deserialize_model(if_model()).graph.node(-1)
    assert outer_reads(if_model()) == {"branch": ["a", "d"]}
    assert [value.name for value in value_reads(branch)] == ["flag", "a", "d"]


@pytest.mark.parametrize("budget", ["min", "100%"])
@pytest.mark.parametrize("flag", [True, False])
def test_a_rewritten_if_reads_the_right_instances_and_gives_the_original_outputs(budget, flag):
    model = if_model()
    result = onnx_remat.remat(model, budget, time_limit=5)
    onnx.checker.check_model(result.model, full_check=True)
    assert result.report.predicted_peak_bytes <= result.report.budget_bytes
    feeds = {"x": np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32), "flag": np.array(flag)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=1e-6)


def test_the_outer_read_keeps_its_tensor_alive_until_the_if():
    """Without the edge the problem would free a right after Relu. Keeping it, the peak holds x, a, c and d;
    at the minimum a is recomputed before the If instead, and the branches read that instance."""
    tensor_bytes = allocated_bytes(WIDTH * 4)  # a heap tensor: its data and what the heap takes beside it
    kept = onnx_remat.remat(if_model(), "100%", time_limit=5)
    assert kept.report.predicted_peak_bytes >= 4 * tensor_bytes
    least = onnx_remat.remat(if_model(), "min", time_limit=5)
    frame = ORT_VALUE_BYTES * session_values(least.model) + ROUNDING_BYTES  # the report's execution frame, at most
    assert least.report.predicted_peak_bytes - frame < 4 * tensor_bytes + 2 * allocated_bytes(4)  # the branch's sums
    branch = next(node.name for node in least.model.graph.node if node.op_type == "If")
    recomputed = next(node for node in least.model.graph.node if node.name.startswith("relu__remat"))
    assert outer_reads(least.model) == {branch: [recomputed.output[0], "d"]}


@pytest.mark.parametrize("flag", [True, False])
def test_a_recomputed_if_has_its_own_branches_reading_the_latest_instances(flag):
    """Recomputing a and then the If itself: the recomputation's branches (cloned) read a's recomputation, the first
    If's still read a's first instance, and the graph output is the recomputation's."""
    model = if_model()
    ops = OpMap(tuple((node.name,) for node in model.graph.node))
    events = [Compute(op, op) for op in range(5)] + [Compute(0, 5), Compute(4, 6)]
    rewritten = rewrite(ir.serde.deserialize_model(model), ops, Schedule(tuple(events)))
    onnx.checker.check_model(rewritten, full_check=True)
    assert outer_reads(rewritten) == {"branch": ["a", "d"], "branch__remat1": ["a__remat1", "d"]}
    assert [node.output[0] for node in rewritten.graph.node if node.op_type == "If"] == ["y__remat0", "y"]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32), "flag": np.array(flag)}
    np.testing.assert_allclose(run(rewritten, feeds)[0], run(model, feeds)[0], rtol=1e-6)


@pytest.mark.parametrize("flag", [True, False])
def test_a_rewritten_if_runs_as_planned_for_its_device(flag):
    """`onnx-remat run`'s plan gives the If's segment the tensors its branches read (before, onnxruntime refused the
    segment: a branch read a tensor no input named)."""
    model = if_model()
    result = onnx_remat.remat(model, "min", time_limit=5)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32), "flag": np.array(flag)}
    device_run = execute(build_plan(result.model, get_devices("cpu")), feeds, repeats=1)
    np.testing.assert_allclose(device_run.outputs["y"], run(model, feeds)[0], rtol=1e-6)
