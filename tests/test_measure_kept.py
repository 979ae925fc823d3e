"""What onnxruntime keeps per node after its first run, predicted and measured: a chain of 2000 small nodes measured
in a fresh process peaks within the predictions that count it, and above them without it."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.passes.execution_frame import frame_bytes
from onnx_remat.passes.measure_devices import measure_device_peaks
from onnx_remat.passes.run_devices import build_plan

pytestmark = pytest.mark.slow

NODES = 2000
SHAPE = (1, 16, 16, 16)  # 16 KiB: as in tools/kept_memory.py


def node_chain() -> helper.ModelProto:
    """Relu after Relu on 16 KiB tensors: each after the first writes into its input's buffer."""
    nodes = [helper.make_node("Relu", ["x" if k == 0 else f"t{k - 1}"], ["y" if k == NODES - 1 else f"t{k}"],
                              name=f"n{k}") for k in range(NODES)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_measured_peak_of_many_small_nodes_is_within_the_predictions_with_what_the_runtime_keeps():
    result = onnx_remat.remat(node_chain(), budget="100%")
    plan = build_plan(result.model, get_devices("cpu"))
    feeds = {"x": np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)}
    # The median of three fresh processes: one alone spreads by up to 150 KiB on peaks this small
    # (docs/measurements.md), and measured 594 KB against 507 predicted once on a loaded machine.
    measured = statistics.median(measure_device_peaks(plan, feeds).peak_bytes[0] for _ in range(3))
    kept = plan.kept_bytes[0]
    predicted = result.report.predicted_peak_bytes
    # The execution frame (24 bytes for each of the chain's 2001 values, a 48 KiB block) comes from heap pages the
    # session's load left resident (traced: a main-heap address), so the measurement sees none of it here.
    frame = frame_bytes(result.model)
    assert plan.peak_bytes[0] == pytest.approx(predicted, rel=0.01)
    assert plan.peak_bytes[0] - frame - kept < measured  # without the term, the prediction is below the measurement
    assert measured <= predicted
    assert measured == pytest.approx(predicted - frame, rel=0.10)
