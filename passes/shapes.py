"""Resolve every tensor's shape for fixed input shapes, the way exported models need it.

Exporters compute shapes inside the graph (Shape -> Gather -> Concat -> Reshape/Expand/Slice), which ONNX shape
inference alone often leaves symbolic. `ResolveShapes`, an in-place onnx-ir pass, sets the values' shapes and types
in three steps, each only for what the previous one left unknown:
1. ONNX shape inference with data propagation, on the model without its weights;
2. the same on a clone whose shape subgraphs onnxscript's constant folder has evaluated; the clone is only read for
   shapes, so the model keeps its nodes and its parameters stay where the user put them;
3. one run of onnxruntime on random inputs of the given shapes, with the still unknown tensors as outputs.
Only a shape that depends on input values (behind NonZero, Unique, a Loop...) is refused, naming the node.
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import onnx_ir as ir

from onnx_remat.core.errors import ModelError, one_line
from onnx_remat.passes.manager import named, run_passes, to_proto, without_weights
from onnx_remat.passes.operator_groups import subgraphs
from onnx_remat.passes.sizes import is_concrete_value

DATA_DEPENDENT_OPS = frozenset({"NonZero", "Unique", "Compress", "Loop", "NonMaxSuppression", "StringSplit"})
"""Ops whose output shapes can depend on input values: a tensor they leave unknown is not given a shape."""
VALUE_FREE_READS = {"Shape": (0,), "Size": (0,), "CastLike": (1,)}
"""Inputs an op reads for their shape or type only: folding such a node does not fold a parameter's values."""
SMALL_CONSTANT = 4096
"""ConstantOfShape outputs up to this many elements are folded (the folder keeps ConstantOfShape by default)."""
WEIGHT_BYTES = 4096
"""Initializers this large are never shape data (a shape, a slice bound, a Resize scale is a few numbers): shape
inference sees them as inputs of their type and shape only."""
FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


class ResolveShapes(ir.passes.InPlacePass):
    """Give every named node output of the main graph a concrete shape and element type (value.shape, value.dtype).
    Ensures each has one (ModelError naming the first that has not) and that every Conv or ConvTranspose reads as
    many channels as its weight takes."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        _infer(model)
        unknown = _unknown(model.graph)
        if unknown:
            _adopt(unknown, _folded_shapes(model))
            unknown = _unknown(model.graph)
        if unknown:
            _refuse_data_dependent(unknown)
            _adopt(unknown, _shapes_from_running(model, unknown))
        return ir.passes.PassResult(model, modified=True)

    def ensures(self, model: ir.Model) -> None:
        unknown = _unknown(model.graph)
        if unknown:
            raise ModelError(f"cannot determine the size of {len(unknown)} tensors (first: {unknown[0].name!r}), "
                             "even by running the model in onnxruntime")
        _refuse_mismatched_channels(model.graph)


def resolve_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose value_info gives a concrete shape and type to every node output (`ResolveShapes`), for
    callers holding a ModelProto (a rewritten model run on devices)."""
    return to_proto(run_passes(ir.serde.deserialize_model(model), [ResolveShapes()]))


def is_concrete(value: onnx.ValueInfoProto | None) -> bool:
    """Whether a value info gives a tensor type with every dimension fixed."""
    if value is None or not value.type.HasField("tensor_type"):
        return False
    tensor = value.type.tensor_type
    return tensor.elem_type != 0 and tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim)


def _infer(model: ir.Model) -> None:
    """Set the shapes and types strict ONNX shape inference finds. Inference runs on the model without its weights
    (serialising them to onnx's C++ was most of its time), with data propagation unless that contradicts shapes the
    model already states (onnx 1.23 propagates a Slice of a shape whose bounds are unknown as if it took
    everything). Not onnx-ir's ShapeInferencePass: where inference fails it logs a warning and leaves the model as
    it was, and that failure is the user's to hear about."""
    inferred = _infer_types(without_weights(model, WEIGHT_BYTES)).graph
    values = ir.convenience.create_value_mapping(model.graph, include_subgraphs=False)
    for info in [*inferred.value_info, *inferred.output]:
        value = values.get(info.name)
        if value is not None and not value.is_initializer() and is_concrete(info):
            tensor = info.type.tensor_type
            value.dtype = ir.DataType(tensor.elem_type)
            value.shape = ir.Shape([d.dim_value for d in tensor.shape.dim])


def _infer_types(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError):
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
        raise ModelError(f"shape inference failed: {one_line(exc)}") from None


def _refuse_mismatched_channels(graph: ir.Graph) -> None:
    """ModelError for a Conv or ConvTranspose whose input has other channels than its weight takes: ONNX shape
    inference lets it through and onnxruntime fails only when it runs (after the rewrite was written)."""
    for node in graph:
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.inputs) < 2:
            continue
        x, w = (_dims(value) for value in node.inputs[:2])
        if len(x) < 2 or len(w) < 2:
            continue
        group = node.attributes.get_int("group", 1)
        expected = w[1] * group if node.op_type == "Conv" else w[0]
        if x[1] != expected:
            raise ModelError(f"{node.op_type} node {node.name!r} reads {_name(node.inputs[0])!r} with {x[1]} "
                             f"channels, but its weight {_name(node.inputs[1])!r} of shape {w} (group {group}) takes "
                             f"{expected}: fix the model's input shape (--input-shape) or its weights")


def _dims(value: ir.Value | None) -> list[int]:
    """A value's concrete dimensions, or none when it has no concrete shape."""
    if value is None or value.shape is None or not value.shape.is_static():
        return []
    return list(value.shape.numpy())


def _name(value: ir.Value | None) -> str:
    return "" if value is None else value.name or ""


def _unknown(graph: ir.Graph) -> list[ir.Value]:
    """Named node outputs without a concrete shape and type, in graph order."""
    return [value for node in graph for value in node.outputs
            if value.name and not value.is_initializer() and not is_concrete_value(value)]


def _adopt(unknown: list[ir.Value], found: dict[str, ir.Value]) -> None:
    """Give the `unknown` values the types and shapes of the values of their names `found`."""
    for value in unknown:
        shape = found.get(named(value))
        if shape is not None:
            value.type = shape.type
            value.shape = ir.Shape(shape.shape.dims) if shape.shape is not None else None


def _folded_shapes(model: ir.Model) -> dict[str, ir.Value]:
    """Concrete values, by name, of a clone whose constant shape subgraphs are folded (never a parameter's values):
    those the folder evaluated (their nodes are gone from the clone) and those inference then finds downstream."""
    from onnxscript.optimizer import fold_constants  # 0.15-0.3 s to import, for models inference leaves unknown only

    parameters = {name for name, value in model.graph.initializers.items() if value.dtype in FLOAT_TYPES}
    copy = model.clone()
    values = [value for node in copy.graph for value in node.outputs]
    fold_constants(copy, onnx_shape_inference=True, should_fold=lambda node: _should_fold(node, parameters))
    with contextlib.suppress(ModelError):  # the folder's shapes alone then
        _infer(copy)
    return {named(value): value for value in values if value.name and is_concrete_value(value)}


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


def _refuse_data_dependent(unknown: list[ir.Value]) -> None:
    """ModelError naming the first op whose output shape depends on input values, upstream of an unknown tensor."""
    seen: set[ir.Node] = set()
    stack: list[ir.Value | None] = list(unknown)
    while stack:
        value = stack.pop()
        node = None if value is None else value.producer()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.op_type in DATA_DEPENDENT_OPS and _reads_input_values(node):
            raise ModelError(f"the shape of {_name(node.outputs[0])!r} depends on the input values ({node.op_type} "
                             f"node {node.name!r}): onnx-remat needs every tensor's size known before running")
        stack.extend(node.inputs)


def _reads_input_values(node: ir.Node) -> bool:
    """Whether `node` reads a graph input's values, directly or through other nodes; a read of its shape alone does
    not count (input shapes are fixed), and a node with subgraphs counts (they may read any outer value). A NonZero
    of a constant (wav2vec 2.0's time mask, drawn at export) has one fixed shape, which running the model finds."""
    seen: set[ir.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if next(subgraphs(current), None) is not None:
            return True
        shape_only = VALUE_FREE_READS.get(current.op_type, ())
        for index, value in enumerate(current.inputs):
            if value is None or index in shape_only:
                continue
            if value.is_graph_input():
                return True
            if (producer := value.producer()) is not None:
                stack.append(producer)
    return False


def _shapes_from_running(model: ir.Model, unknown: list[ir.Value]) -> dict[str, ir.Value]:
    """Run the model once in onnxruntime with the unknown tensors as outputs; values of their types and shapes."""
    from onnx_remat.passes.execute import random_feeds, run

    probe = to_proto(model)
    outputs = len(probe.graph.output)
    names = [named(value) for value in unknown]
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    try:
        values = run(probe, random_feeds(probe))[outputs:]
    except Exception as exc:  # onnxruntime raises several types, all meaning the model cannot run here
        raise ModelError(f"cannot determine the size of {len(unknown)} tensors (first: {names[0]!r}): running "
                         f"the model in onnxruntime to find them failed: {one_line(exc)}") from None
    return {name: ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(value.dtype)),
                           shape=ir.Shape(value.shape))
            for name, value in zip(names, values, strict=True) if isinstance(value, np.ndarray)}
