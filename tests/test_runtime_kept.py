"""What onnxruntime keeps per session after its first run: the stack its intra-op worker thread touches in a GEMM,
predicted (`runtime_kept.kept_per_session`) and measured in fresh processes."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_remat
from onnx_remat.core.devices import Device
from onnx_remat.passes.measure_devices import measure_device_peaks
from onnx_remat.passes.run_devices import build_plan
from onnx_remat.passes.runtime_kept import SGEMM_STACK_BYTES, kept_per_session

NODES = 40
SHAPE = (256, 4, 16, 16)  # t5_encoder's attention scores at 256 rows: a batched MatMul of two activations


def matmul_chain() -> helper.ModelProto:
    """x @ x, then each product by itself: MatMuls whose B is an activation, which MLAS packs on the stack."""
    nodes = [helper.make_node("MatMul", [name, name], ["y" if k == NODES - 1 else f"t{k}"], name=f"n{k}")
             for k, name in enumerate(["x", *(f"t{k}" for k in range(NODES - 1))])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def cpu(threads: int) -> Device:
    return Device("cpu", "onnxruntime", "CPUExecutionProvider", threads=threads)


def test_a_session_keeps_its_worker_threads_gemm_stack_only_with_a_gemm_on_onnxruntime_cpu():
    assert kept_per_session(cpu(1), {"MatMul"}) == 0
    assert kept_per_session(cpu(3), {"Conv", "Relu"}) == 2 * SGEMM_STACK_BYTES
    assert kept_per_session(cpu(3), {"Add", "Relu"}) == 0
    assert kept_per_session(Device("cpu", "openvino", "CPU", threads=3), {"MatMul"}) == 0


@pytest.mark.slow
def test_what_a_worker_thread_keeps_is_measured_as_predicted():
    model = onnx_remat.remat(matmul_chain(), budget="100%").model
    feeds = {"x": np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)}
    plans = {threads: build_plan(model, (cpu(threads),)) for threads in (1, 2)}
    # Medians of three fresh processes: 0-16 KiB kept with one thread, 56-80 with two (one worker thread).
    measured = {threads: statistics.median(measure_device_peaks(plan, feeds).kept_bytes[0] for _ in range(3))
                for threads, plan in plans.items()}
    predicted = {threads: plan.kept_bytes[0] for threads, plan in plans.items()}
    assert measured[2] - measured[1] == pytest.approx(predicted[2] - predicted[1], abs=32 * 1024)
