"""Run models in onnxruntime the way a rewritten schedule needs: in file order, duplicates kept."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


def session_options(profile_dir: str | None = None, threads: int | None = None) -> ort.SessionOptions:
    """Nodes run in the file's order (PRIORITY_BASED), no optimizer merges or reorders our nodes,
    and memory is allocated and freed per tensor (arena and memory patterns off) so peaks are real."""
    options = ort.SessionOptions()
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if profile_dir:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(profile_dir, "onnx_remat")
    return options


def ort_session(model: onnx.ModelProto | bytes | str, profile_dir: str | None = None, threads: int | None = None):
    """An onnxruntime CPU session for `model` with `session_options`."""
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(
        data, session_options(profile_dir, threads), providers=["CPUExecutionProvider"],
        disabled_optimizers=["CommonSubexpressionElimination"],
    )


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every graph input that is not an initializer (shapes must be concrete)."""
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int | None = None) -> list[np.ndarray]:
    """The model's outputs for `feeds`, in graph output order."""
    return ort_session(model, threads=threads).run(None, feeds)


def executed_node_names(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[str]:
    """The names of the nodes onnxruntime actually ran, in the order it ran them (from its profile)."""
    with tempfile.TemporaryDirectory() as directory:
        session = ort_session(model, profile_dir=directory)
        session.run(None, feeds)
        with open(session.end_profiling()) as stream:
            events = json.load(stream)
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return [e["name"][: -len("_kernel_time")] for e in sorted(kernels, key=lambda e: e["ts"])]
