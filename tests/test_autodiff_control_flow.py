"""If, Loop and Scan have no gradient rule: a training step through one is refused naming it, also where the
parameters reach the loss only through its subgraphs' reads of outer tensors (as torch.cond and the scan and
while_loop operators export: before, the refusal blamed an integer-only path, or found no trainable parameter)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import step_as_proto
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.core.errors import ModelError


def branch(name: str, op: str) -> object:
    """A branch applying op to the outer tensor h."""
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 3])
    return helper.make_graph([helper.make_node(op, ["h"], [f"{name}_out"])], name, [], [out])


def test_if_reading_parameters_in_its_branches_is_named() -> None:
    """torch.cond(h.sum() > 0, relu, tanh, (h,)) with h = w * x: w reaches the loss through the branches, and the
    condition alone through a boolean."""
    nodes = [helper.make_node("Mul", ["w", "x"], ["h"]),
             helper.make_node("ReduceSum", ["h"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["output"], name="cond", then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Tanh"))]
    inits = [numpy_helper.from_array(np.ones((2, 3), np.float32), "w"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(ModelError, match=r"no gradient rule for these op types: If \(e.g. node 'cond'\)"):
        step_as_proto(model, loss="sum", freeze=["zero"])


def test_scan_reading_a_parameter_in_its_body_is_named() -> None:
    """A recurrence h' = tanh(h W + x_t) whose W is read from the outer graph only."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["hw"]), helper.make_node("Add", ["hw", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_next"]), helper.make_node("Identity", ["h_next"], ["y_t"])],
        "body", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("h", "x_t")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("h_next", "y_t")])
    nodes = [helper.make_node("Scan", ["h0", "xs"], ["h_last", "output"], name="scan", body=body,
                              num_scan_inputs=1)]
    inits = [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
             numpy_helper.from_array(np.zeros((2, 4), np.float32), "h0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("xs", TensorProto.FLOAT, [3, 2, 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [3, 2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(ModelError, match=r"no gradient rule for these op types: Scan \(e.g. node 'scan'\)"):
        step_as_proto(model, loss="sum", freeze=["h0"])
