"""The two predictions of a rewrite's peak agree: the report's (the solver's simulation of the problem) and `run`'s
(node-level liveness of the rewritten graph, `run_devices.build_plan`)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.passes.execution_frame import ROUNDING_BYTES
from onnx_remat.passes.run_devices import build_plan

ROWS, COLUMNS = 256, 1024  # 1 MiB of float32 per tensor


def predictions(model: onnx.ModelProto, budget: str = "100%") -> tuple[int, int]:
    """The report's predicted peak and `run`'s, of `model` rewritten at `budget`."""
    result = onnx_remat.remat(model, budget, time_limit=30)
    return result.report.predicted_peak_bytes, build_plan(result.model, get_devices(None)).peak_bytes[0]


def test_a_constant_read_by_one_operator_lives_as_long_as_the_rewritten_graph_holds_it():
    """An Expand of constants (a loss gradient's seed) read by one operator: onnxruntime frees it after that reader,
    so the problem must not hold it resident for the whole run (it did: 1 MiB over `run`'s prediction)."""
    nodes = [
        helper.make_node("Expand", ["one", "shape"], ["ones"], name="expand"),
        helper.make_node("Add", ["x", "ones"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["b"], name="relu0"),
        helper.make_node("Tanh", ["b"], ["c"], name="tanh"),
        helper.make_node("Relu", ["c"], ["y"], name="relu1"),
    ]
    initializers = [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
                    helper.make_tensor("shape", TensorProto.INT64, [2], [ROWS, COLUMNS])]
    graph = helper.make_graph(nodes, "constant_seed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, COLUMNS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, COLUMNS])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    report, run = predictions(model)
    assert 0 <= report - run <= ROUNDING_BYTES  # the report rounds the execution frame's block up to a page
