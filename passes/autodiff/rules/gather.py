"""Gradients of indexing ops: the output gradient scattered back with repeated indices accumulated (reduction="add",
opset 16: training_form converts an older model up), or gathered from where a scatter wrote."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, attr_str, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]
def _wrapped(e: Emitter, indices: ir.Value, size: int) -> ir.Value:
    """Indices with negative entries counted from the end, as Gather reads them."""
    negative = e.op("Less", indices, e.const_like(indices, 0))
    return e.op("Where", negative, e.op("Add", indices, e.const_like(indices, size)), indices)


def gather(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Scatter-add dy into zeros shaped like the data: with the gathered axis moved to the front, ScatterND adds
    each index's slice of dy, so an embedding row picked twice gets both gradients."""
    data, indices = (present(v) for v in node.inputs[:2])
    shape, index_shape = e.info.shape(data), e.info.shape(indices)
    axis = attr_int(node, "axis", 0) % len(shape)
    rank_i = len(index_shape)
    # dy: shape[:axis] + index_shape + shape[axis+1:]; bring the index axes first, then the data's other axes.
    index_axes = list(range(axis, axis + rank_i))
    outer = [a for a in range(len(shape) - 1 + rank_i) if a not in index_axes]
    dy = e.transpose(dys[0], index_axes + outer)
    front = [shape[axis], *shape[:axis], *shape[axis + 1:]]
    positions = e.op("Unsqueeze", _wrapped(e, indices, shape[axis]), e.ints([rank_i]))
    summed = e.op("ScatterND", e.zeros(front), positions, dy, reduction="add")
    back = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(shape)))
    return {0: e.transpose(summed, back)}


def gather_elements(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """ScatterElements with reduction="add" of dy into zeros shaped like the data, along the same axis."""
    data, indices = (present(v) for v in node.inputs[:2])
    shape = e.info.shape(data)
    axis = attr_int(node, "axis", 0) % len(shape)
    positions = _wrapped(e, indices, shape[axis])
    return {0: e.op("ScatterElements", e.zeros(shape), positions, dys[0], axis=axis, reduction="add")}


def _wrapped_nd(e: Emitter, indices: ir.Value, shape: Sequence[int]) -> ir.Value:
    """GatherND/ScatterND index tuples with negative coordinates counted from the end of their axes."""
    depth = e.info.shape(indices)[-1]
    sizes = e.const(np.asarray(shape[:depth], dtype=e.info.np_dtype(indices)))
    negative = e.op("Less", indices, e.const_like(indices, 0))
    return e.op("Where", negative, e.op("Add", indices, sizes), indices)


def _require_no_batch_dims(node: ir.Node) -> None:
    if attr_int(node, "batch_dims", 0):
        raise ModelError(f"the gradient of {node.op_type} {node.name!r} supports batch_dims=0 only, not "
                         f"{attr_int(node, 'batch_dims')}: export with plain indexing")


def gather_nd(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """ScatterND with reduction="add" of dy into zeros shaped like the data: a slice picked twice gets both."""
    _require_no_batch_dims(node)
    data, indices = (present(v) for v in node.inputs[:2])
    shape = e.info.shape(data)
    positions = _wrapped_nd(e, indices, shape)
    return {0: e.op("ScatterND", e.zeros(shape), positions, dys[0], reduction="add")}


def scatter_nd(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Data: dy where nothing was written over it (all of dy for reduction="add"); updates: dy at their indices."""
    reduction = attr_str(node, "reduction", "none")
    if reduction not in ("none", "add"):
        raise ModelError(f"ScatterND {node.name!r}: only reduction none or add has a gradient here, not "
                         f"{reduction!r}")
    data, indices, updates = (present(v) for v in node.inputs[:3])
    positions = _wrapped_nd(e, indices, e.info.shape(data))
    grads = {}
    if needs[0]:
        grads[0] = dys[0] if reduction == "add" else e.op("ScatterND", dys[0], positions,
                                                         e.zeros(e.info.shape(updates)))
    if needs[2]:
        grads[2] = e.op("GatherND", dys[0], positions)
    return grads


def top_k(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """The values' gradient scattered back to the positions the indices output names (distinct along the axis)."""
    shape = e.info.shape(node.inputs[0])
    axis = attr_int(node, "axis", -1) % len(shape)
    return {0: e.op("ScatterElements", e.zeros(shape), node.outputs[1], dys[0], axis=axis)}


def scatter_elements(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Data: dy where nothing was written over it (all of dy for reduction="add"); updates: dy gathered from
    where they went, along the same axis (torch.scatter and scatter_add)."""
    reduction = attr_str(node, "reduction", "none")
    if reduction not in ("none", "add"):
        raise ModelError(f"ScatterElements {node.name!r}: only reduction none or add has a gradient here, not "
                         f"{reduction!r}")
    data, indices, updates = (present(v) for v in node.inputs[:3])
    axis = attr_int(node, "axis", 0) % len(e.info.shape(data))
    grads = {}
    if needs[0]:
        grads[0] = dys[0] if reduction == "add" else e.op(
            "ScatterElements", dys[0], indices, e.zeros(e.info.shape(updates)), axis=axis)
    if needs[2]:
        grads[2] = e.op("GatherElements", dys[0], indices, axis=axis)
    return grads
