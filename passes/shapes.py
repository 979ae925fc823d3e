"""Resolve every tensor's shape for fixed input shapes, the way exported models need it.

Exporters compute shapes inside the graph (Shape -> Gather -> Concat -> Reshape/Expand/Slice), which ONNX shape
inference alone often leaves symbolic. Three steps, each only for what the previous one left unknown:
1. ONNX shape inference with data propagation;
2. the same on a copy whose shape subgraphs onnxscript's constant folder (on onnx-ir) has evaluated; the copy is
   only read for shapes, so the model keeps its nodes and its parameters stay where the user put them;
3. one run of onnxruntime on random inputs of the given shapes, with the still unknown tensors as outputs.
Only a shape that depends on input values (behind NonZero, Unique, a Loop...) is refused, naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.optimizer import fold_constants

from onnx_remat.errors import ModelError, one_line
from onnx_remat.passes.manager import named

DATA_DEPENDENT_OPS = frozenset({"NonZero", "Unique", "Compress", "Loop", "NonMaxSuppression", "StringSplit"})
"""Ops whose output shapes can depend on input values: a tensor they leave unknown is not given a shape."""
VALUE_FREE_READS = {"Shape": (0,), "Size": (0,), "CastLike": (1,)}
"""Inputs an op reads for their shape or type only: folding such a node does not fold a parameter's values."""
SMALL_CONSTANT = 4096
"""ConstantOfShape outputs up to this many elements are folded (the folder keeps ConstantOfShape by default)."""
WEIGHT_BYTES = 4096
"""Initializers this large are never shape data (a shape, a slice bound, a Resize scale is a few numbers): shape
inference sees them as inputs of their type and shape only."""
FLOAT_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
})


def resolve_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose value_info gives a concrete shape and type to every node output."""
    inferred = _infer(model)
    unknown = _unknown(inferred)
    if unknown:
        _adopt(inferred, _folded_shapes(model), unknown)
        unknown = _unknown(inferred)
    if unknown:
        _refuse_data_dependent(inferred, unknown)
        _adopt(inferred, _shapes_from_running(inferred, unknown), unknown)
        unknown = _unknown(inferred)
    if unknown:
        raise ModelError(f"cannot determine the size of {len(unknown)} tensors (first: {unknown[0]!r}), "
                         "even by running the model in onnxruntime")
    _refuse_mismatched_channels(inferred)
    return inferred


def is_concrete(value: onnx.ValueInfoProto | None) -> bool:
    """Whether a value info gives a tensor type with every dimension fixed."""
    if value is None or not value.type.HasField("tensor_type"):
        return False
    tensor = value.type.tensor_type
    return tensor.elem_type != 0 and tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with the value infos strict ONNX shape inference finds. Inference runs on the model without
    its weights (serialising them to onnx's C++ was most of its time), with data propagation unless that contradicts
    shapes the model already states (onnx 1.23 propagates a Slice of a shape whose bounds are unknown as if it took
    everything)."""
    inferred = _infer_types(_without_weights(model))
    result = onnx.ModelProto()
    result.CopyFrom(model)
    result.graph.ClearField("value_info")
    result.graph.value_info.extend(inferred.graph.value_info)
    result.graph.ClearField("output")
    result.graph.output.extend(inferred.graph.output)
    return result


def _infer_types(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError):
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
        raise ModelError(f"shape inference failed: {one_line(exc)}") from None


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose initializers of WEIGHT_BYTES or more are graph inputs of the same type and shape instead."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    graph = light.graph
    weights = [t for t in graph.initializer if len(t.raw_data) >= WEIGHT_BYTES]
    kept = [t for t in graph.initializer if len(t.raw_data) < WEIGHT_BYTES]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    declared = {value.name for value in graph.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                       for t in weights if t.name not in declared)
    return light


def _refuse_mismatched_channels(model: onnx.ModelProto) -> None:
    """ModelError for a Conv or ConvTranspose whose input has other channels than its weight takes: ONNX shape
    inference lets it through and onnxruntime fails only when it runs (after the rewrite was written)."""
    dims = {name: [d.dim_value for d in value.type.tensor_type.shape.dim] for name, value in _known(model).items()}
    dims.update({i.name: list(i.dims) for i in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
            continue
        x, w = dims.get(node.input[0]), dims.get(node.input[1])
        if not x or not w or len(x) < 2 or len(w) < 2:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        expected = w[1] * group if node.op_type == "Conv" else w[0]
        if x[1] != expected:
            raise ModelError(f"{node.op_type} node {node.name!r} reads {node.input[0]!r} with {x[1]} channels, but "
                             f"its weight {node.input[1]!r} of shape {w} (group {group}) takes {expected}: fix the "
                             "model's input shape (--input-shape) or its weights")


def _known(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    graph = model.graph
    return {v.name: v for v in [*graph.value_info, *graph.output, *graph.input] if is_concrete(v)}


def _unknown(model: onnx.ModelProto) -> list[str]:
    """Node outputs without a concrete shape and type, in graph order."""
    known = _known(model)
    initializers = {i.name for i in model.graph.initializer}
    return [out for node in model.graph.node for out in node.output
            if out and out not in known and out not in initializers]


def _adopt(model: onnx.ModelProto, shapes: dict[str, onnx.ValueInfoProto], names: list[str]) -> None:
    """Record the shapes found for `names` in the model's value_info (or its outputs), replacing partial ones."""
    found = {name: shapes[name] for name in names if name in shapes}
    for output in model.graph.output:
        if output.name in found:
            output.type.CopyFrom(found.pop(output.name).type)
    kept = [v for v in model.graph.value_info if v.name not in found]
    model.graph.ClearField("value_info")
    model.graph.value_info.extend([*kept, *found.values()])


def _folded_shapes(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Shapes on a copy whose constant shape subgraphs are folded (never a parameter's values): those the folder
    gave the values it evaluated (their nodes are gone from the copy), then those inference finds downstream."""
    parameters = {i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES}
    copy = ir.serde.deserialize_model(model)
    values = [value for node in copy.graph for value in node.outputs]
    fold_constants(copy, onnx_shape_inference=True, should_fold=lambda node: _should_fold(node, parameters))
    shapes = {named(value): ir.serde.serialize_value(value) for value in values if _is_concrete_value(value)}
    try:
        return {**_known(_infer(ir.serde.serialize_model(copy))), **shapes}
    except ModelError:
        return shapes


def _is_concrete_value(value: ir.Value) -> bool:
    """Whether an IR value has a name, a tensor type and every dimension fixed."""
    return bool(value.name) and value.dtype is not None and value.shape is not None and value.shape.is_static()


def _should_fold(node: ir.Node, parameters: set[str]) -> bool | None:
    """False for nodes reading a float parameter's values; True for small ConstantOfShape; else the folder's
    default."""
    allowed = VALUE_FREE_READS.get(node.op_type, ())
    if any(v is not None and v.name in parameters and k not in allowed for k, v in enumerate(node.inputs)):
        return False
    shape = node.inputs[0] if node.inputs else None
    if node.op_type == "ConstantOfShape" and shape is not None and shape.const_value is not None:
        return int(shape.const_value.numpy().prod()) <= SMALL_CONSTANT
    return None


def _refuse_data_dependent(model: onnx.ModelProto, unknown: list[str]) -> None:
    """ModelError naming the first op whose output shape depends on input values, upstream of an unknown tensor."""
    producer = {out: node for node in model.graph.node for out in node.output}
    seen: set[str] = set()
    stack = list(unknown)
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type in DATA_DEPENDENT_OPS:
            raise ModelError(f"the shape of {node.output[0]!r} depends on the input values ({node.op_type} node "
                             f"{node.name!r}): onnx-remat needs every tensor's size known before running")
        stack.extend(node.input)


def _shapes_from_running(model: onnx.ModelProto, unknown: list[str]) -> dict[str, onnx.ValueInfoProto]:
    """Run the model once in onnxruntime with the unknown tensors as outputs; their value infos."""
    from onnx_remat.passes.execute import random_feeds, run

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in unknown)
    try:
        values = run(probe, random_feeds(probe))[len(model.graph.output):]
    except Exception as exc:  # onnxruntime raises several types, all meaning the model cannot run here
        raise ModelError(f"cannot determine the size of {len(unknown)} tensors (first: {unknown[0]!r}): running "
                         f"the model in onnxruntime to find them failed: {one_line(exc)}") from None
    return {name: onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
            for name, value in zip(unknown, values, strict=True) if isinstance(value, np.ndarray)}
