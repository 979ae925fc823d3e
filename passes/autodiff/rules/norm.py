"""Gradients of normalizations (batch statistics recomputed in the backward pass) and softmaxes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float, attr_int, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def _normalized(e: Emitter, x: ir.Value, axes: Sequence[int], eps: float) -> tuple[ir.Value, ir.Value]:
    """(xhat, 1/std) of x normalized over `axes` with the biased variance, axes kept."""
    centered = e.op("Sub", x, e.reduce_mean(x, axes))
    var = e.reduce_mean(e.op("Mul", centered, centered), axes)
    inv_std = e.op("Reciprocal", e.op("Sqrt", e.op("Add", var, e.scalar(eps))))
    return e.op("Mul", centered, inv_std), inv_std


def _input_grad(e: Emitter, dxhat: ir.Value, xhat: ir.Value, inv_std: ir.Value, axes: Sequence[int]) -> ir.Value:
    """dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std, means over `axes`."""
    along = e.op("Mul", xhat, e.reduce_mean(e.op("Mul", dxhat, xhat), axes))
    return e.op("Mul", e.op("Sub", e.op("Sub", dxhat, e.reduce_mean(dxhat, axes)), along), inv_std)


def _channel_norm(e: Emitter, node: ir.Node, dy: ir.Value, needs: Needs, axes: Sequence[int]) -> dict[int, ir.Value]:
    """Shared by BatchNormalization (training) and InstanceNormalization: per-channel scale and bias.

    With c = x - mean(x), r = 1/std and per-channel scale s, dx = a (dy + q c + e) where a = s r,
    q = -r^2 mean(dy c) and e = -mean(dy) are reduced tensors, and dscale = sum(r mean(dy c)) * n.
    Written so, at most two full-size temporaries are alive at once and the last node turns one of them
    into dx (the textbook form holds four: xhat, dxhat and two partial sums), which lowers the layer's
    peak inside the backward pass."""
    x, scale = (present(v) for v in node.inputs[:2])
    shape = e.info.shape(x)
    reduce_axes = sorted({0, *axes})
    count = math.prod(shape[a] for a in axes)
    grads = {}
    if needs[0] or needs[1]:
        centered, inv_std, dy_centered = _centered_stats(e, x, dy, axes, count, attr_float(node, "epsilon", 1e-5))
        if needs[1]:
            grads[1] = e.scale(e.reduce_sum(e.op("Mul", dy_centered, inv_std), reduce_axes, keepdims=False), count)
        if needs[0]:
            q = e.op("Neg", e.op("Mul", e.op("Mul", inv_std, inv_std), dy_centered))
            inner = e.op("Sum", dy, e.op("Mul", centered, q), e.op("Neg", e.reduce_mean(dy, axes)))
            a = e.op("Mul", e.reshape(scale, (1, shape[1], *[1] * (len(shape) - 2))), inv_std)
            grads[0] = e.op("Mul", inner, a)
    if needs[2]:
        grads[2] = e.reduce_sum(dy, reduce_axes, keepdims=False)
    return grads


def _centered_stats(
    e: Emitter, x: ir.Value, dy: ir.Value, axes: Sequence[int], count: int, eps: float
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(c = x - mean(x), 1/std, mean(dy c)) over `axes`, axes kept; one full-size temporary beside c."""
    centered = e.op("Sub", x, e.reduce_mean(x, axes))
    var = e.scale(e.reduce("ReduceSumSquare", centered, axes, keepdims=True), 1 / count)
    inv_std = e.op("Reciprocal", e.op("Sqrt", e.op("Add", var, e.scalar(eps))))
    return centered, inv_std, e.reduce_mean(e.op("Mul", dy, centered), axes)


def batch_norm(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Training-mode BatchNormalization: statistics over batch and spatial axes."""
    rank = len(e.info.shape(node.inputs[0]))
    return _channel_norm(e, node, dys[0], needs, [0, *range(2, rank)])


def instance_norm(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """InstanceNormalization: statistics over spatial axes."""
    rank = len(e.info.shape(node.inputs[0]))
    return _channel_norm(e, node, dys[0], needs, list(range(2, rank)))


def layer_norm(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """LayerNormalization: statistics over the axes from `axis` on; scale and bias broadcast there."""
    x, scale, dy = present(node.inputs[0]), present(node.inputs[1]), dys[0]
    shape = e.info.shape(x)
    axes = list(range(attr_int(node, "axis", -1) % len(shape), len(shape)))
    xhat, inv_std = _normalized(e, x, axes, attr_float(node, "epsilon", 1e-5))
    grads = {}
    if needs[0]:
        grads[0] = _input_grad(e, e.op("Mul", dy, scale), xhat, inv_std, axes)
    if needs[1]:
        grads[1] = e.sum_to(e.op("Mul", dy, xhat), shape, e.info.shape(scale))
    if len(node.inputs) > 2 and needs[2]:
        grads[2] = e.sum_to(dy, shape, e.info.shape(node.inputs[2]))
    return grads


def softmax(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dx = y * (dy - sum(dy * y))."""
    y, axis = node.outputs[0], attr_int(node, "axis", -1)
    dot = e.reduce_sum(e.op("Mul", dys[0], y), [axis], keepdims=True)
    return {0: e.op("Mul", y, e.op("Sub", dys[0], dot))}


def log_softmax(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dx = dy - exp(y) * sum(dy)."""
    y, axis = node.outputs[0], attr_int(node, "axis", -1)
    total = e.reduce_sum(dys[0], [axis], keepdims=True)
    return {0: e.op("Sub", dys[0], e.op("Mul", e.op("Exp", y), total))}
