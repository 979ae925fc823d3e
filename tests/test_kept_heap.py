"""What tensors served from glibc's heap take beyond their data while they live, predicted and measured: many small
tensors live at once in one session measure within the predictions, and above their data alone (which measured
lower still while the heap's holes from loading and a first run served them unseen: measure_devices)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_remat
from onnx_remat.core.devices import get_devices
from onnx_remat.passes.measure_devices import measure_device_peaks
from onnx_remat.passes.run_devices import build_plan
from onnx_remat.passes.sizes import HEAP_TENSOR_BYTES

pytestmark = pytest.mark.slow

TENSORS = 3000
CHANNELS = 256  # each sum is 256 floats: 1 KiB, served from the heap


def fan() -> helper.ModelProto:
    """x read by TENSORS ReduceSum nodes into 1 KiB tensors, all live until one Concat reads them."""
    nodes = [helper.make_node("ReduceSum", ["x", "plane"], [f"s{k}"], name=f"sum{k}") for k in range(TENSORS)]
    nodes.append(helper.make_node("Concat", [f"s{k}" for k in range(TENSORS)], ["y"], axis=0, name="concat"))
    graph = helper.make_graph(
        nodes, "fan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, CHANNELS, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (TENSORS, CHANNELS, 1, 1))],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "plane")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_measured_peak_of_many_live_heap_tensors_is_within_the_predictions():
    result = onnx_remat.remat(fan(), budget="100%")
    plan = build_plan(result.model, get_devices("cpu"))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, CHANNELS, 16, 16)).astype(np.float32)}
    measured = measure_device_peaks(plan, feeds).peak_bytes[0]
    predicted = result.report.predicted_peak_bytes
    assert plan.peak_bytes[0] == pytest.approx(predicted, rel=0.01)
    assert plan.peak_bytes[0] - TENSORS * HEAP_TENSOR_BYTES < measured  # their data alone is below
    assert measured == pytest.approx(predicted, rel=0.10)
