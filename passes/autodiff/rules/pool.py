"""Gradients of pooling and reductions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float, attr_int, attr_ints, has_attr, present
from onnx_remat.passes.autodiff.rules.linear import Window, window

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def max_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Scatter-add dy to the argmax positions, taken by a MaxPool of its own in the backward pass.

    The forward MaxPool computes no indices: onnxruntime's kernel takes about ten times as long with them, and a
    node's outputs are one operator of the problem, held until the last reader of any. Apart, the forward output
    is freed after the forward reads it, the indices are computed where the solver puts them, and the time of
    each part is its own."""
    if attr_int(node, "storage_order", 0):
        raise ModelError(f"MaxPool {node.name!r}: storage_order=1 is not supported")
    shape = e.info.shape(node.inputs[0])
    attributes = {name: attribute.value for name, attribute in node.attributes.items()}
    indices = e.ops("MaxPool", [node.inputs[0]], 2, **attributes)[1]
    flat = e.op("ScatterElements", e.zeros([math.prod(shape)]), e.reshape(indices, [-1]),
                e.reshape(dys[0], [-1]), axis=0, reduction="add")
    return {0: e.reshape(flat, shape)}


def average_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Spread dy / window-size over each window: a depthwise ConvTranspose with a ones kernel."""
    x_shape, y_shape = e.info.shape(node.inputs[0]), e.info.shape(node.outputs[0])
    win = window(node, attr_ints(node, "kernel_shape"), x_shape[2:])
    divisor = _divisor(win, x_shape[2:], y_shape[2:], bool(attr_int(node, "count_include_pad", 0)))
    uniform = np.all(divisor == divisor.flat[0])
    if uniform:
        dy = e.scale(dys[0], 1 / divisor.flat[0])
    else:
        dy = e.op("Mul", dys[0], e.const((1 / divisor).astype(e.dtype)))
    return {0: _spread(e, win, x_shape, y_shape, dy)}


def _spread(e: Emitter, win: Window, x_shape: Sequence[int], y_shape: Sequence[int], g: ir.Value) -> ir.Value:
    """Each window's value of g (shaped like the pooled output) added to every input element of the window: a
    depthwise ConvTranspose with a ones kernel."""
    channels = x_shape[1]
    ones = e.const(np.ones((channels, 1, *win.kernel), dtype=e.dtype))
    extra = [n - ((o - 1) * s + (k - 1) * d + 1 - b - f) for n, o, k, s, d, b, f in
             zip(x_shape[2:], y_shape[2:], win.kernel, win.strides, win.dilations, win.begin, win.end, strict=True)]
    ends = [f - min(x, 0) for f, x in zip(win.end, extra, strict=True)]  # ceil_mode windows past the end
    return e.op("ConvTranspose", g, ones, strides=list(win.strides), dilations=list(win.dilations),
                pads=[*win.begin, *ends], output_padding=[max(x, 0) for x in extra], group=channels)


def _divisor(win: Window, in_sizes: Sequence[int], out_sizes: Sequence[int], include_pad: bool) -> np.ndarray:
    """Number of elements each output averages over (as torch and onnxruntime count them)."""
    per_axis = []
    for n, o, k, s, b, f in zip(in_sizes, out_sizes, win.kernel, win.strides, win.begin, win.end, strict=True):
        start = np.arange(o) * s - b
        stop = np.minimum(start + k, n + f)
        if not include_pad:
            start, stop = np.maximum(start, 0), np.minimum(stop, n)
        per_axis.append((stop - start).astype(np.float64))
    divisor = per_axis[0]
    for counts in per_axis[1:]:
        divisor = np.multiply.outer(divisor, counts)
    return divisor


def global_average_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / (spatial size), broadcast over the spatial axes."""
    shape = e.info.shape(node.inputs[0])
    return {0: e.op("Expand", e.scale(dys[0], 1 / math.prod(shape[2:])), e.ints(shape))}


def _reduced_axes(e: Emitter, node: ir.Node) -> list[int] | None:
    """Axes a ReduceMean/ReduceSum node reduces (None: it is the identity)."""
    rank = len(e.info.shape(node.inputs[0]))
    axes = attr_ints(node, "axes") if has_attr(node, "axes") else None
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        axes = e.info.static(node.inputs[1]).tolist()
    if not axes:
        return None if attr_int(node, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def _unreduce(e: Emitter, node: ir.Node, dy: ir.Value, mean: bool) -> ir.Value:
    """Broadcast dy back over the reduced axes (divided by their size for a mean)."""
    shape = e.info.shape(node.inputs[0])
    axes = _reduced_axes(e, node)
    if axes is None:
        return dy
    if not attr_int(node, "keepdims", 1):
        dy = e.reshape(dy, [1 if a in axes else d for a, d in enumerate(shape)])
    if mean:
        dy = e.scale(dy, 1 / math.prod(shape[a] for a in axes))
    return e.op("Expand", dy, e.ints(shape))


def reduce_mean(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / count, broadcast over the reduced axes."""
    return {0: _unreduce(e, node, dys[0], mean=True)}


def reduce_sum(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy broadcast over the reduced axes."""
    return {0: _unreduce(e, node, dys[0], mean=False)}


def reduce_extremum(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """ReduceMax/ReduceMin: dy shared evenly among the elements equal to the result (as torch.amax), zero
    elsewhere."""
    x, y = node.inputs[0], node.outputs[0]
    axes = _reduced_axes(e, node)
    if axes is None:
        return {0: dys[0]}
    shape = e.info.shape(x)
    kept = [1 if a in axes else d for a, d in enumerate(shape)]
    peak = y if attr_int(node, "keepdims", 1) else e.reshape(y, kept)
    hits = e.op("Cast", e.op("Equal", x, peak), to=e.info.dtype(x))
    ties = e.reduce_sum(hits, axes, keepdims=True)
    share = e.op("Div", _unreduce(e, node, dys[0], mean=False), ties)
    return {0: e.op("Mul", hits, share)}


def cum_sum(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Each input adds to the sums after it (before it, reversed): dy summed the other way, equally exclusive."""
    reverse = 1 - attr_int(node, "reverse", 0)
    return {0: e.op("CumSum", dys[0], node.inputs[1], exclusive=attr_int(node, "exclusive", 0), reverse=reverse)}


def _kept(e: Emitter, node: ir.Node, y: ir.Value) -> ir.Value:
    """A reduction's output with the reduced axes kept (as size 1), to broadcast against the input."""
    shape, axes = e.info.shape(node.inputs[0]), _reduced_axes(e, node) or []
    return y if attr_int(node, "keepdims", 1) else e.reshape(y, [1 if a in axes else d for a, d in enumerate(shape)])


def reduce_l2(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x dy / y, zero where the norm y is zero (as torch.linalg.vector_norm)."""
    y = node.outputs[0]
    zero = e.op("Equal", y, e.scalar(0.0))
    ratio = e.op("Where", zero, e.scalar(0.0), e.op("Div", dys[0], e.op("Where", zero, e.scalar(1.0), y)))
    return {0: e.op("Mul", node.inputs[0], _unreduce(e, node, ratio, mean=False))}


def reduce_l1(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy sign(x)."""
    return {0: e.op("Mul", e.op("Sign", node.inputs[0]), _unreduce(e, node, dys[0], mean=False))}


def reduce_sum_square(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """2 x dy."""
    return {0: e.op("Mul", e.scale(present(node.inputs[0]), 2.0), _unreduce(e, node, dys[0], mean=False))}


def reduce_log_sum_exp(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy softmax(x) over the reduced axes: dy exp(x - y)."""
    weights = e.op("Exp", e.op("Sub", node.inputs[0], _kept(e, node, node.outputs[0])))
    return {0: e.op("Mul", weights, _unreduce(e, node, dys[0], mean=False))}


def global_max_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy shared evenly among each channel's elements equal to its maximum (as ReduceMax), zero elsewhere."""
    x, y = node.inputs[0], node.outputs[0]
    shape = e.info.shape(x)
    hits = e.op("Cast", e.op("Equal", x, y), to=e.info.dtype(x))
    ties = e.reduce_sum(hits, list(range(2, len(shape))), keepdims=True)
    return {0: e.op("Mul", hits, e.op("Div", dys[0], ties))}


def reduce_prod(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy times the product of the other elements, exact with zeros (as torch.prod): with p the product of the
    nonzero elements and z the count of zeros, y/x = p/x where z = 0; at the zero, p where z = 1; else 0."""
    axes = _reduced_axes(e, node)
    if axes is None:
        return {0: dys[0]}
    x = node.inputs[0]
    zero = e.op("Equal", x, e.scalar(0.0))
    nonzero = e.op("Where", zero, e.scalar(1.0), x)
    product = e.reduce("ReduceProd", nonzero, axes, keepdims=True)
    zeros = e.reduce_sum(e.op("Cast", zero, to=e.info.dtype(x)), axes, keepdims=True)
    at_zero = e.op("Where", e.op("Equal", zeros, e.scalar(1.0)), product, e.scalar(0.0))
    elsewhere = e.op("Where", e.op("Equal", zeros, e.scalar(0.0)), e.op("Div", product, nonzero), e.scalar(0.0))
    return {0: e.op("Mul", e.op("Where", zero, at_zero, elsewhere), _unreduce(e, node, dys[0], mean=False))}


def reduce_log_sum(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / sum(x) = dy exp(-y), broadcast over the reduced axes."""
    weights = e.op("Exp", e.op("Neg", _kept(e, node, node.outputs[0])))
    return {0: e.op("Mul", _unreduce(e, node, dys[0], mean=False), weights)}


def cum_prod(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """CumProd (opset 26), exact with zeros: dx_j = sum over the products y_i that include x_j of dy_i y_i / x_j,
    written without dividing as sum_i dy_i prod_{k <= i, k != j} x_k. Along a new axis j, x with x_j replaced by 1
    goes through the same CumProd, so each output reads without dividing; a mask keeps the outputs that include x_j.
    Takes n times the input's memory for an axis of length n."""
    x, axis_input = node.inputs[0], node.inputs[1]
    shape = e.info.shape(x)
    axis = int(e.info.static(axis_input)) % len(shape)
    n, rank = shape[axis], len(shape)
    exclusive, reverse = attr_int(node, "exclusive", 0), attr_int(node, "reverse", 0)
    positions = np.arange(n)
    own = positions[:, None] == positions[None, :]  # [j, i]: i is j
    order = (positions[None, :] <= positions[:, None]) if reverse else (positions[None, :] >= positions[:, None])
    includes = order & ~own if exclusive else order  # [j, i]: output i's product includes x_j
    # Shapes with the new axis j in front: x becomes [1, ...], masks [n, 1.., n at axis, 1..].
    mask_shape = [n, *[n if a == axis else 1 for a in range(rank)]]
    others = e.op("Where", e.const(own.reshape(mask_shape)), e.scalar(1.0), e.op("Unsqueeze", x, e.ints([0])))
    partial = e.op("CumProd", others, e.const(np.array(axis + 1)), exclusive=exclusive, reverse=reverse)
    weighted = e.op("Mul", partial, e.op("Unsqueeze", dys[0], e.ints([0])))
    picked = e.op("Where", e.const(includes.reshape(mask_shape)), weighted, e.scalar(0.0))
    summed = e.reduce_sum(picked, [axis + 1], keepdims=False)  # [j, rest of x's axes]
    return {0: e.transpose(summed, [*range(1, axis + 1), 0, *range(axis + 1, rank)])}


def _lp_slope(e: Emitter, x: ir.Value, y: ir.Value, p: float) -> tuple[ir.Value, ir.Value]:
    """The two factors of d(sum |x|^p)^(1/p) / dx = sign(x) |x|^(p-1) * y^(1-p): per input element, per output."""
    per_input = e.op("Mul", e.op("Sign", x), e.op("Pow", e.op("Abs", x), e.scalar(p - 1)))
    return per_input, e.op("Pow", y, e.scalar(1 - p))


def lp_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """y = (sum over the window of |x|^p)^(1/p): dy y^(1-p) spread over each window, times sign(x) |x|^(p-1)."""
    x, y = present(node.inputs[0]), node.outputs[0]
    x_shape, y_shape = e.info.shape(x), e.info.shape(y)
    win = window(node, attr_ints(node, "kernel_shape"), x_shape[2:])
    per_input, per_output = _lp_slope(e, x, y, attr_float(node, "p", 2.0))
    return {0: e.op("Mul", per_input, _spread(e, win, x_shape, y_shape, e.op("Mul", dys[0], per_output)))}


def global_lp_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """y = (sum over the spatial axes of |x|^p)^(1/p): dy y^(1-p) sign(x) |x|^(p-1)."""
    x, y = present(node.inputs[0]), node.outputs[0]
    per_input, per_output = _lp_slope(e, x, y, attr_float(node, "p", 2.0))
    return {0: e.op("Mul", per_input, e.op("Mul", dys[0], per_output))}


def max_unpool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Each input element went to its index in the flattened output: its gradient is dy there."""
    return {0: e.op("Gather", e.reshape(dys[0], [-1]), node.inputs[1], axis=0)}
