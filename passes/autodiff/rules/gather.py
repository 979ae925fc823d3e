"""Gradients of indexing ops: the output gradient scattered back with repeated indices accumulated (opset 16+)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]
SCATTER_ADD_OPSET = 16
"""ScatterND and ScatterElements take reduction="add" from opset 16."""


def _require_scatter_add(e: Emitter, node: ir.Node) -> None:
    if e.info.opset < SCATTER_ADD_OPSET:
        raise ModelError(f"the gradient of {node.op_type} {node.name!r} needs opset {SCATTER_ADD_OPSET} or newer "
                         f"(the model has {e.info.opset}): export the model at opset {SCATTER_ADD_OPSET}+")


def _wrapped(e: Emitter, indices: ir.Value, size: int) -> ir.Value:
    """Indices with negative entries counted from the end, as Gather reads them."""
    negative = e.op("Less", indices, e.const_like(indices, 0))
    return e.op("Where", negative, e.op("Add", indices, e.const_like(indices, size)), indices)


def gather(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Scatter-add dy into zeros shaped like the data: with the gathered axis moved to the front, ScatterND adds
    each index's slice of dy, so an embedding row picked twice gets both gradients."""
    _require_scatter_add(e, node)
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
    _require_scatter_add(e, node)
    data, indices = (present(v) for v in node.inputs[:2])
    shape = e.info.shape(data)
    axis = attr_int(node, "axis", 0) % len(shape)
    positions = _wrapped(e, indices, shape[axis])
    return {0: e.op("ScatterElements", e.zeros(shape), positions, dys[0], axis=axis, reduction="add")}
