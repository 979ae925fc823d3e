"""onnxruntime's execution frame (24 bytes per value of a session's graph, held for a run) in both predictions."""

from __future__ import annotations

from onnx import TensorProto, helper

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.passes.execution_frame import ROUNDING_BYTES, frame_bytes, session_values
from onnx_remat.passes.measure import node_memory
from onnx_remat.passes.run_devices import Segment, build_plan


def exp_chain(nodes: int) -> helper.ModelProto:
    """Exp after Exp on 4 KiB tensors: nodes + 1 values."""
    names = ["x", *(f"t{k}" for k in range(nodes - 1)), "y"]
    graph = helper.make_graph(
        [helper.make_node("Exp", [names[k]], [names[k + 1]]) for k in range(nodes)], "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_segment_holds_its_frame_while_it_runs_and_the_report_counts_it_too():
    """600 values: a 14,400-byte frame, 16 KiB in its own pages, beside two 8 KiB tensors at a time."""
    model = exp_chain(599)
    result = onnx_remat.remat(model, budget="100%", cost_model="analytic")
    plan = build_plan(result.model, get_devices("cpu"))
    (segment,) = [step for step in plan.steps if isinstance(step, Segment)]
    tensors = max(sum(step.live.values()) + step.workspace for step in node_memory(segment.model))
    assert session_values(segment.model) == 600
    assert frame_bytes(segment.model) == 16384
    assert segment.activation_bytes == tensors + 16384
    assert 0 <= result.report.predicted_peak_bytes - plan.peak_bytes[0] <= ROUNDING_BYTES
