"""Load and validate an ONNX model: readable with its external weights, checker-clean, nodes named, input shapes
fixed."""

from __future__ import annotations

import functools
from pathlib import Path

import onnx

from onnx_remat.errors import ModelError, UsageError, one_line
from onnx_remat.model_files import read_model


def load_model(source: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """Read a model from a path, external weights included (or take a ModelProto), and run the ONNX checker on it
    (on the file when there is one: faster, and it holds models beyond protobuf's 2 GiB)."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        name = "the model"
    else:
        name = str(source)
        model = read_model(Path(source))
    if not model.graph.node:
        raise ModelError(f"{name} has no nodes: is it an ONNX model file?")
    try:
        onnx.checker.check_model(model if isinstance(source, onnx.ModelProto) else str(source))
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise ModelError(f"{name} fails the ONNX checker: {one_line(exc)}") from None
    _refuse_unrunnable_opset(model, name)
    _refuse_negative_dimensions(model, name)
    return model


def _refuse_negative_dimensions(model: onnx.ModelProto, name: str) -> None:
    """ModelError for a declared dimension below zero (the checker lets it through; sizes would come out negative)."""
    graph = model.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim if d.HasField("dim_value")]
        if any(size < 0 for size in dims):
            raise ModelError(f"{name} declares tensor {value.name!r} with a negative dimension {dims}: "
                             "fix the model's shapes")


def _refuse_unrunnable_opset(model: onnx.ModelProto, name: str) -> None:
    """ModelError if onnxruntime cannot run the model's default-domain opset."""
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if version and not _onnxruntime_runs_opset(version):
        raise ModelError(f"{name} uses ai.onnx opset {version}, newer than onnxruntime {_onnxruntime_version()} "
                         "runs: export it at an older opset or upgrade onnxruntime")


@functools.cache
def _onnxruntime_runs_opset(version: int) -> bool:
    """Whether onnxruntime loads a one-node model at this opset (it states its range nowhere else)."""
    import onnxruntime as ort

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [x],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", version)])
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime raises its own exception types for an unknown opset
        return False
    return True


def _onnxruntime_version() -> str:
    import onnxruntime as ort

    return ort.__version__


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Give each graph input its concrete shape; every symbolic dimension must end up fixed."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    for name in shapes:
        if name not in inputs:
            raise UsageError(f"--input-shape names {name!r}, but the model's inputs are {', '.join(inputs)}")
    for name, value in inputs.items():
        dims = value.type.tensor_type.shape.dim
        if name in shapes:
            _set_shape(value, shapes[name])
            _refuse_empty(value, "--input-shape gives")
            continue
        symbolic = [d.dim_param or "?" for d in dims if not d.HasField("dim_value")]
        if symbolic:
            example = "x".join(str(d.dim_value) if d.HasField("dim_value") else "1" for d in dims)
            raise ModelError(
                f"input {name!r} has symbolic dimensions ({', '.join(symbolic)}): "
                f"fix them with --input-shape {name}={example}"
            )
        _refuse_empty(value, "the model gives")


def _refuse_empty(value: onnx.ValueInfoProto, who: str) -> None:
    """ModelError for an input with a zero-sized dimension: every tensor downstream may be empty, nothing to plan."""
    dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
    if 0 in dims:
        shape = "x".join(map(str, dims))
        raise ModelError(f"{who} input {value.name!r} an empty shape {shape}: give every dimension a size above zero "
                         f"with --input-shape {value.name}=...")


def _set_shape(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    dims = value.type.tensor_type.shape.dim
    if len(dims) != len(shape):
        raise UsageError(
            f"--input-shape gives {value.name!r} {len(shape)} dimensions, but the model declares {len(dims)}"
        )
    for dim, size in zip(dims, shape, strict=True):
        if dim.HasField("dim_value") and dim.dim_value != size:
            raise UsageError(
                f"--input-shape sets {value.name!r} to {shape}, but the model fixes that dimension at {dim.dim_value}"
            )
        dim.Clear()
        dim.dim_value = size


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique readable name; the rewrite and report refer to nodes by name."""
    used = {node.name for node in model.graph.node if node.name}
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = node.name or f"{node.op_type}_{index}"
        candidate, k = base, 1
        while candidate in used or candidate in seen:
            candidate, k = f"{base}_{k}", k + 1
        node.name = candidate
        seen.add(candidate)
        used.add(candidate)
