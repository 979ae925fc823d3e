"""Run onnx-ir passes the way the pipeline needs: in order, by onnx-ir's PassManager, with a user's error (a
RematError raised in a pass or its requires/ensures) surfacing as itself rather than wrapped in onnx-ir's errors."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnx_remat.core.errors import ModelError, RematError, one_line


def run_passes(model: ir.Model, passes: Sequence[ir.passes.PassBase]) -> ir.Model:
    """Run `passes` on `model` in order and return the resulting model (`model` itself when all are in place)."""
    try:
        return ir.passes.PassManager(passes)(model).model
    except (ir.passes.PassError, ir.passes.InvariantError) as exc:
        cause = _user_error(exc)
        if cause is None:
            raise
        raise cause from None


def _user_error(exc: BaseException | None) -> RematError | None:
    """The first RematError in the chain of causes of `exc`, if any."""
    while exc is not None and not isinstance(exc, RematError):
        exc = exc.__cause__
    return exc


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """`model` serialised, less the value_info onnx-ir writes for every initializer (their shapes are in the
    initializers), so a model reads after a round trip as it did before. ModelError for what onnx-ir cannot write
    (a damaged file's name that is no UTF-8 text reads, but does not write)."""
    proto = _serialized(model)
    graph = proto.graph
    initializers = {init.name for init in graph.initializer}
    kept = [info for info in graph.value_info if info.name not in initializers]
    if len(kept) < len(graph.value_info):
        graph.ClearField("value_info")
        graph.value_info.extend(kept)
    return proto


def without_weights(model: ir.Model, smallest: int) -> onnx.ModelProto:
    """The model serialised with its initializers of `smallest` bytes or more as graph inputs of their type and shape
    instead, for onnx's C++ (shape inference, the checker), which reads them so: they leave the graph while it is
    serialised (copying their bytes was most of the time), then return in their order."""
    graph = model.graph
    inputs, initializers = list(graph.inputs), list(graph.initializers.values())
    weights = {v: v.const_value for v in initializers if v.const_value is not None
               and v.const_value.nbytes >= smallest}
    graph.initializers.clear()
    for value in initializers:
        tensor = weights.get(value)
        if tensor is None:
            graph.initializers.add(value)
            continue
        value.dtype = value.dtype or tensor.dtype
        value.shape = value.shape or ir.Shape(tensor.shape.numpy())
        if value not in inputs:
            graph.inputs.append(value)
    try:
        return _serialized(model)
    finally:
        graph.inputs.clear()
        graph.inputs.extend(inputs)
        graph.initializers.clear()
        for value in initializers:
            graph.initializers.add(value)


def _serialized(model: ir.Model) -> onnx.ModelProto:
    """`model` serialised; ModelError for what onnx-ir cannot write (a damaged file's name that is no UTF-8 text
    reads, but does not write)."""
    try:
        return ir.serde.serialize_model(model)
    except ir.serde.SerdeError as exc:
        raise ModelError(f"cannot write the model back from onnx-ir ({one_line(root_cause(exc))}): is every name "
                         "in it UTF-8 text?") from None


def root_cause(exc: BaseException) -> BaseException:
    """The innermost cause of `exc` (onnx-ir's serde errors wrap the one that says what went wrong)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def named(item: ir.Node | ir.Value) -> str:
    """The name of a main-graph node (NameNodes in load.py names every one) or of a tensor a graph reads or
    returns (ONNX names those); ValueError for an unnamed one."""
    if not item.name:
        raise ValueError(f"unnamed {item!r}: nodes are named when the model is loaded (passes/load.py)")
    return item.name


def name_of(value: ir.Value | None) -> str:
    """The name of a node's input or output, "" for a blank (left-out optional) one, as ONNX writes it."""
    return "" if value is None or value.name is None else value.name
