"""Gradients of indexing ops: the output gradient scattered back with repeated indices accumulated (reduction="add",
opset 16: training_form converts an older model up), or gathered from where a scatter wrote.

The accumulation is a one-hot MatMul or ScatterElements (`_add_rows`), never ScatterND: onnxruntime's CPU ScatterND
(1.32) runs its index rows on several threads without synchronisation, so with reduction="add" two threads adding to a
row picked twice lose one addition (microsoft/onnxruntime#18048; a Mixtral training step's expert gradients differed
from run to run, by whole updates), where its ScatterElements splits the work by output position and adds each
position's updates in index order, and its MatMul gives the same numbers on any thread count."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, attr_str, present

ONE_HOT_ROWS = 64
"""Up to this many rows, a gradient's rows are summed by a one-hot MatMul rather than ScatterElements (`_add_rows`):
4 rows of 8192 values from 1024 updates took 9.4 ms against 282 ms on one thread, 5000 rows of 256 from 4096 updates
288 ms against 34 ms (onnxruntime 1.32, tools/bench_scatter_add.py): ScatterElements costs some 33 ns an element."""
Grads = Sequence[ir.Value]
Needs = Sequence[bool]
def _wrapped(e: Emitter, indices: ir.Value, size: int) -> ir.Value:
    """Indices with negative entries counted from the end, as Gather reads them."""
    negative = e.op("Less", indices, e.const_like(indices, 0))
    return e.op("Where", negative, e.op("Add", indices, e.const_like(indices, size)), indices)


def gather(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Scatter-add dy into zeros shaped like the data: with the gathered axis moved to the front, each index's slice
    of dy is added to its row, so an embedding row picked twice gets both gradients."""
    data, indices = (present(v) for v in node.inputs[:2])
    shape, index_shape = e.info.shape(data), e.info.shape(indices)
    axis = attr_int(node, "axis", 0) % len(shape)
    rank_i = len(index_shape)
    # dy: shape[:axis] + index_shape + shape[axis+1:]; bring the index axes first, then the data's other axes.
    index_axes = list(range(axis, axis + rank_i))
    outer = [a for a in range(len(shape) - 1 + rank_i) if a not in index_axes]
    dy = e.transpose(dys[0], index_axes + outer)
    front = [shape[axis], *shape[:axis], *shape[axis + 1:]]
    summed = _add_rows(e, _wrapped(e, indices, shape[axis]), math.prod(index_shape), dy, front)
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
    """dy added into zeros shaped like the data at the slices the index tuples name: a slice picked twice gets both.
    Each tuple of depth k becomes the row of the data with its first k axes flattened into one."""
    _require_no_batch_dims(node)
    data, indices = (present(v) for v in node.inputs[:2])
    shape = e.info.shape(data)
    *tuples, depth = e.info.shape(indices)
    strides = [math.prod(shape[axis + 1:depth]) for axis in range(depth)]
    offsets = e.op("Mul", _wrapped_nd(e, indices, shape), e.const(np.asarray(strides, dtype=e.info.np_dtype(indices))))
    rows = e.reduce_sum(offsets, [-1], keepdims=False)
    summed = _add_rows(e, rows, math.prod(tuples), dys[0], [math.prod(shape[:depth]), *shape[depth:]])
    return {0: e.reshape(summed, shape)}


def _add_rows(e: Emitter, rows: ir.Value, count: int, updates: ir.Value, shape: Sequence[int]) -> ir.Value:
    """Zeros of `shape` with each slice of `updates` (shaped `rows`' shape + shape[1:]) added to the row along axis 0
    that its entry of `rows` (`count` entries) names, both flattened to two dimensions: for a few rows (experts,
    a short axis) a one-hot matrix times the updates, else ScatterElements with reduction="add", its indices each row
    broadcast across the slice (int32: half of int64's bytes, and a row count fits)."""
    width = math.prod(shape[1:])
    flat = e.reshape(updates, [count, width])
    rows = e.op("Cast", rows, to=ir.DataType.INT32)
    if shape[0] <= ONE_HOT_ROWS:
        every_row = e.const(np.arange(shape[0], dtype=np.int32).reshape(-1, 1))
        one_hot = e.op("Equal", every_row, e.reshape(rows, [1, count]))
        return e.reshape(e.op("MatMul", e.op("Cast", one_hot, to=ir.DataType.from_numpy(e.dtype)), flat), shape)
    positions = e.op("Expand", e.reshape(rows, [count, 1]), e.ints([count, width]))
    summed = e.op("ScatterElements", e.zeros([shape[0], width]), positions, flat, axis=0, reduction="add")
    return e.reshape(summed, shape)


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
