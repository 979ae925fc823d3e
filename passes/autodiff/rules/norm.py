"""Gradients of normalizations (batch statistics recomputed in the backward pass) and softmaxes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float, attr_int, attr_ints, present

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


def group_norm(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """GroupNormalization (opset 21): statistics per sample over each group of channels and the spatial axes; scale
    and bias per channel."""
    x, scale, dy = present(node.inputs[0]), present(node.inputs[1]), dys[0]
    shape, groups = e.info.shape(x), attr_int(node, "num_groups")
    if e.info.shape(scale)[0] != shape[1]:
        raise ModelError(f"GroupNormalization {node.name!r}: scale and bias per group (opset 18, deprecated) have no "
                         "gradient here: export the model at opset 21, where they are per channel")
    grouped = (shape[0], groups, -1)
    xhat, inv_std = _normalized(e, e.reshape(x, grouped), [2], attr_float(node, "epsilon", 1e-5))
    grads = {}
    if needs[0]:
        dxhat = e.reshape(e.op("Mul", dy, e.reshape(scale, (1, shape[1], *[1] * (len(shape) - 2)))), grouped)
        grads[0] = e.reshape(_input_grad(e, dxhat, xhat, inv_std, [2]), shape)
    channel_axes = [0, *range(2, len(shape))]
    if needs[1]:
        grads[1] = e.reduce_sum(e.op("Mul", dy, e.reshape(xhat, shape)), channel_axes, keepdims=False)
    if needs[2]:
        grads[2] = e.reduce_sum(dy, channel_axes, keepdims=False)
    return grads


def lp_normalization(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """y = x / |x|_p along `axis` (p 1 or 2): dx = (dy - s sum(dy y)) / |x|_p, s = y for p = 2 and sign(x) for
    p = 1."""
    x, y, dy = present(node.inputs[0]), node.outputs[0], dys[0]
    axis, p = attr_int(node, "axis", -1), attr_int(node, "p", 2)
    norm = e.reduce("ReduceL2" if p == 2 else "ReduceL1", x, [axis], keepdims=True)
    direction = y if p == 2 else e.op("Sign", x)
    along = e.op("Mul", direction, e.reduce_sum(e.op("Mul", dy, y), [axis], keepdims=True))
    return {0: e.op("Div", e.op("Sub", dy, along), norm)}


def mean_variance_normalization(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """(x - mean) / std over `axes` (default N and spatial axes of NCHW): LayerNormalization's input gradient
    without scale or epsilon."""
    x = present(node.inputs[0])
    rank = len(e.info.shape(x))
    axes = sorted(a % rank for a in attr_ints(node, "axes", [0, 2, 3]))
    xhat, inv_std = _normalized(e, x, axes, 0.0)
    return {0: _input_grad(e, dys[0], xhat, inv_std, axes)}


def lrn(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """LRN: y = x d^-beta, d = bias + alpha/size * (sum of x^2 over a window of channels). dx = dy d^-beta
    - (2 alpha beta / size) x * (sum of dy y / d over the windows that hold x's channel)."""
    x, y, dy = present(node.inputs[0]), node.outputs[0], dys[0]
    size, alpha = attr_int(node, "size"), attr_float(node, "alpha", 1e-4)
    beta, bias = attr_float(node, "beta", 0.75), attr_float(node, "bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    shape = e.info.shape(x)
    d = e.op("Add", e.scale(_channel_window_sum(e, e.op("Mul", x, x), shape, before, after), alpha / size),
             e.scalar(bias))
    direct = e.op("Mul", dy, e.op("Pow", d, e.scalar(-beta)))
    spread = _channel_window_sum(e, e.op("Div", e.op("Mul", dy, y), d), shape, after, before)
    return {0: e.op("Sub", direct, e.op("Mul", e.scale(x, 2 * alpha * beta / size), spread))}


def _channel_window_sum(e: Emitter, t: ir.Value, shape: Sequence[int], before: int, after: int) -> ir.Value:
    """For each channel c, the sum of t over channels c - before .. c + after (those that exist): a ones-kernel
    Conv along the channel axis of t seen as (N, 1, C, rest)."""
    kernel = e.const(np.ones((1, 1, before + after + 1, 1), dtype=e.dtype))
    flat = e.reshape(t, (shape[0], 1, shape[1], math.prod(shape[2:])))
    return e.reshape(e.op("Conv", flat, kernel, pads=[before, 0, after, 0]), shape)


def rms_norm(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """RMSNormalization (opset 23): xhat = x r, r = 1/sqrt(mean(x^2) + eps) over the axes from `axis`; with
    g = dy scale, dx = r (g - xhat mean(g xhat)); dscale = dy xhat summed back to the scale's shape."""
    x, scale, dy = present(node.inputs[0]), present(node.inputs[1]), dys[0]
    shape = e.info.shape(x)
    axes = list(range(attr_int(node, "axis", -1) % len(shape), len(shape)))
    mean_square = e.reduce_mean(e.op("Mul", x, x), axes)
    inv_rms = e.op("Reciprocal", e.op("Sqrt", e.op("Add", mean_square, e.scalar(attr_float(node, "epsilon", 1e-5)))))
    xhat = e.op("Mul", x, inv_rms)
    grads = {}
    if needs[0]:
        g = e.op("Mul", dy, scale)
        along = e.op("Mul", xhat, e.reduce_mean(e.op("Mul", g, xhat), axes))
        grads[0] = e.op("Mul", e.op("Sub", g, along), inv_rms)
    if needs[1]:
        grads[1] = e.sum_to(e.op("Mul", dy, xhat), shape, e.info.shape(scale))
    return grads
