"""Run models in onnxruntime the way a rewritten schedule needs: in file order, duplicates kept.

Measured with onnxruntime 1.32 on a graph holding a node and its `__remat1` duplicate:
- `disabled_optimizers=["CommonSubexpressionElimination"]` (InferenceSession argument) keeps the
  duplicate at ORT_ENABLE_BASIC; the session config entry `session.disable_specified_optimizers`
  does not (the duplicate is merged away).
- ORT_ENABLE_EXTENDED fuses Conv+Relu (the Relu node disappears) and moves the duplicate ahead of
  the original; ORT_ENABLE_ALL renames nodes (`<tensor>_nchwc`) and adds layout reorders.
- ORT_DISABLE_ALL runs exactly the file's nodes, in file order under PRIORITY_BASED.
So sessions use ORT_DISABLE_ALL, and still disable CSE by name so a raised level stays safe.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnx_remat.core.errors import ModelError

ModelLike = onnx.ModelProto | bytes | str | Path

_KERNEL_SUFFIX = "_kernel_time"
_NODE_FAILURE = re.compile(r"running (?P<op>\w+) node\. Name:'(?P<node>[^']*)' Status Message: (?P<message>.*)", re.S)
"""How onnxruntime reports a node it could not run (session.run raises its Fail, run_with_iobinding a RuntimeError)."""


@contextlib.contextmanager
def node_failures_refused() -> Iterator[None]:
    """Turn onnxruntime's failure to run a node into a ModelError naming the node: a model the ONNX checker passes
    may still not run (the dynamo exporter of PyTorch 2.13 writes a bias-free Conv3d's zero bias with shape [C, 2])."""
    try:
        yield
    except (RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail) as exc:
        found = _NODE_FAILURE.search(str(exc))
        if found is None:
            raise
        message = " ".join(found["message"].split())
        raise ModelError(f"onnxruntime cannot run node {found['node']!r} ({found['op']}): {message}; check that "
                         "onnxruntime runs the model as it was given (an exporter can write a model it refuses)"
                         ) from exc


def adds_unsynchronised(node: onnx.NodeProto) -> bool:
    """Whether onnxruntime's CPU kernel for `node` adds into shared output rows from several threads unsynchronised:
    ScatterND with a reduction (1.32) splits its index rows between threads, so two rows naming one slice race and a
    run can lose an update (microsoft/onnxruntime#18048); two runs of the same session differ."""
    reduction = next((a.s for a in node.attribute if a.name == "reduction"), b"none")
    return node.domain in ("", "ai.onnx") and node.op_type == "ScatterND" and reduction != b"none"


def session_options(profile: bool = False, threads: int | None = None) -> ort.SessionOptions:
    """File-order execution, no graph rewriting, per-tensor allocation (arena and memory patterns off)."""
    options = ort.SessionOptions()
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.enable_mem_reuse = False
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"onnx_remat_{os.getpid()}")
    return options


def ort_session(model: ModelLike, profile: bool = False, threads: int | None = None) -> ort.InferenceSession:
    """A CPU session that runs `model`'s nodes as written: in order, none merged, none fused."""
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    if isinstance(source, Path):
        source = str(source)
    return ort.InferenceSession(
        source,
        session_options(profile, threads),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=["CommonSubexpressionElimination"],
    )


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Reproducible random values for every graph input that is not an initializer."""
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    return {value.name: _random_value(value, rng) for value in model.graph.input if value.name not in initializers}


def _random_value(value: onnx.ValueInfoProto, rng: np.random.Generator) -> np.ndarray:
    """Standard normal floats, or 0/1 for integer and bool inputs, of the input's concrete shape."""
    tensor = value.type.tensor_type
    if not all(d.HasField("dim_value") for d in tensor.shape.dim):
        raise ValueError(f"input {value.name!r} has a symbolic shape: fix it before running")
    shape = [d.dim_value for d in tensor.shape.dim]
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2, size=shape).astype(dtype)


def run(model: ModelLike, feeds: dict[str, np.ndarray], threads: int | None = None) -> list[np.ndarray]:
    """The model's outputs for `feeds`, in graph output order."""
    with node_failures_refused():
        return ort_session(model, threads=threads).run(None, feeds)


def executed_node_names(model: ModelLike, feeds: dict[str, np.ndarray]) -> list[str]:
    """Names of the nodes onnxruntime really ran, in the order it ran them (read from its profile)."""
    session = ort_session(model, profile=True)
    session.run(None, feeds)
    profile = session.end_profiling()
    try:
        with open(profile) as stream:
            events = json.load(stream)
    finally:
        os.remove(profile)
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith(_KERNEL_SUFFIX)]
    return [e["name"].removesuffix(_KERNEL_SUFFIX) for e in sorted(kernels, key=lambda e: e["ts"])]
