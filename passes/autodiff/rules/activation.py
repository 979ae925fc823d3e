"""Gradients of the smooth and piecewise-linear activations exporters write as single ops (opset 14-20)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float, attr_str, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]
GELU_TANH_CUBIC = 0.044715
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875
"""Selu's defaults (opset 6)."""
HARD_SWISH_ALPHA = float(np.float32(1 / 6))
"""HardSwish's slope inside its function body, HardSigmoid(alpha=1/6), whose float attribute holds 1/6 rounded to
float32: every runtime that inlines the body (onnxruntime, onnx's reference) computes the forward with it, in float64
too, so the derivative uses it (exact 1/6 differs by 3e-8 relative, which float64 gradient checks see)."""


def gelu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Gelu (opset 20), exact: 0.5 (1 + erf(x/sqrt2)) + x exp(-x^2/2) / sqrt(2 pi); or its tanh approximation."""
    x = present(node.inputs[0])
    if attr_str(node, "approximate", "none") == "tanh":
        return {0: e.op("Mul", dys[0], _gelu_tanh_slope(e, x))}
    cdf = e.op("Add", e.scalar(1.0), e.op("Erf", e.scale(x, 1 / math.sqrt(2))))
    bell = e.op("Exp", e.scale(e.op("Mul", x, x), -0.5))
    slope = e.op("Add", e.scale(cdf, 0.5), e.op("Mul", e.scale(x, 1 / math.sqrt(2 * math.pi)), bell))
    return {0: e.op("Mul", dys[0], slope)}


def _gelu_tanh_slope(e: Emitter, x: ir.Value) -> ir.Value:
    """d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + c x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) u'."""
    k = math.sqrt(2 / math.pi)
    square = e.op("Mul", x, x)
    u = e.scale(e.op("Add", x, e.scale(e.op("Mul", square, x), GELU_TANH_CUBIC)), k)
    t = e.op("Tanh", u)
    du = e.scale(e.op("Add", e.scalar(1.0), e.scale(square, 3 * GELU_TANH_CUBIC)), k)
    sech2 = e.op("Sub", e.scalar(1.0), e.op("Mul", t, t))
    outer = e.scale(e.op("Add", e.scalar(1.0), t), 0.5)
    return e.op("Add", outer, e.op("Mul", e.scale(x, 0.5), e.op("Mul", sech2, du)))


def _inside(e: Emitter, z: ir.Value, low: float, high: float) -> ir.Value:
    """low < z < high, as a boolean tensor."""
    return e.op("And", e.op("Greater", z, e.scalar(low)), e.op("Less", z, e.scalar(high)))


def hard_sigmoid(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """alpha dy where 0 < alpha x + beta < 1, else 0."""
    alpha, beta = attr_float(node, "alpha", 0.2), attr_float(node, "beta", 0.5)
    z = e.op("Add", e.scale(present(node.inputs[0]), alpha), e.scalar(beta))
    return {0: e.op("Where", _inside(e, z, 0.0, 1.0), e.scale(dys[0], alpha), e.scalar(0.0))}


def hard_swish(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x hardsigmoid(x) (alpha HARD_SWISH_ALPHA, beta 1/2): slope 0 below -1/(2 alpha), 2 alpha x + 1/2 up to
    1/(2 alpha), 1 above (the bounds are -3 and 3 in float32)."""
    x = present(node.inputs[0])
    bound = 0.5 / HARD_SWISH_ALPHA
    ramp = e.op("Add", e.scale(x, 2 * HARD_SWISH_ALPHA), e.scalar(0.5))
    slope = e.op("Where", e.op("Greater", x, e.scalar(bound)), e.scalar(1.0),
                 e.op("Where", e.op("Less", x, e.scalar(-bound)), e.scalar(0.0), ramp))
    return {0: e.op("Mul", dys[0], slope)}


def softplus(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy sigmoid(x)."""
    return {0: e.op("Mul", dys[0], e.op("Sigmoid", node.inputs[0]))}


def mish(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x tanh(softplus(x)): slope tanh(s) + x sigmoid(x) (1 - tanh(s)^2)."""
    x = present(node.inputs[0])
    t = e.op("Tanh", e.op("Softplus", x))
    sech2 = e.op("Sub", e.scalar(1.0), e.op("Mul", t, t))
    slope = e.op("Add", t, e.op("Mul", e.op("Mul", x, e.op("Sigmoid", x)), sech2))
    return {0: e.op("Mul", dys[0], slope)}


def elu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy where x > 0, dy (y + alpha) elsewhere."""
    x, y, alpha = present(node.inputs[0]), node.outputs[0], attr_float(node, "alpha", 1.0)
    negative = e.op("Mul", dys[0], e.op("Add", y, e.scalar(alpha)))
    return {0: e.op("Where", e.op("Greater", x, e.scalar(0.0)), dys[0], negative)}


def prelu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x where x > 0, slope * x elsewhere: dx = dy or slope * dy; dslope = dy * x where x <= 0, summed back to the
    slope's (broadcast) shape."""
    x, slope = (present(v) for v in node.inputs[:2])
    positive = e.op("Greater", x, e.scalar(0.0))
    grads = {}
    if needs[0]:
        grads[0] = e.op("Where", positive, dys[0], e.op("Mul", dys[0], slope))
    if needs[1]:
        below = e.op("Where", positive, e.scalar(0.0), e.op("Mul", dys[0], x))
        grads[1] = e.sum_to(below, e.info.shape(node.outputs[0]), e.info.shape(slope))
    return grads


def selu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """gamma dy where x > 0, dy (y + gamma alpha) elsewhere."""
    x, y = present(node.inputs[0]), node.outputs[0]
    alpha, gamma = attr_float(node, "alpha", SELU_ALPHA), attr_float(node, "gamma", SELU_GAMMA)
    negative = e.op("Mul", dys[0], e.op("Add", y, e.scalar(gamma * alpha)))
    return {0: e.op("Where", e.op("Greater", x, e.scalar(0.0)), e.scale(dys[0], gamma), negative)}


def celu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy where x > 0, dy exp(x / alpha) elsewhere."""
    x, alpha = present(node.inputs[0]), attr_float(node, "alpha", 1.0)
    negative = e.op("Mul", dys[0], e.op("Exp", e.scale(x, 1 / alpha)))
    return {0: e.op("Where", e.op("Greater", x, e.scalar(0.0)), dys[0], negative)}


def softsign(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x / (1 + |x|): slope 1 / (1 + |x|)^2."""
    denominator = e.op("Add", e.scalar(1.0), e.op("Abs", present(node.inputs[0])))
    return {0: e.op("Div", dys[0], e.op("Mul", denominator, denominator))}


def shrink(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x -/+ bias outside [-lambd, lambd], 0 inside: dy where |x| > lambd (x < -lambd or x > lambd)."""
    x, lambd = present(node.inputs[0]), attr_float(node, "lambd", 0.5)
    outside = e.op("Or", e.op("Less", x, e.scalar(-lambd)), e.op("Greater", x, e.scalar(lambd)))
    return {0: e.op("Where", outside, dys[0], e.scalar(0.0))}


def thresholded_relu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """x where x > alpha, else 0: dy where x > alpha."""
    above = e.op("Greater", present(node.inputs[0]), e.scalar(attr_float(node, "alpha", 1.0)))
    return {0: e.op("Where", above, dys[0], e.scalar(0.0))}


def swish(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Swish (opset 24), x sigmoid(alpha x): slope s + alpha x s (1 - s), s = sigmoid(alpha x)."""
    x, alpha = present(node.inputs[0]), attr_float(node, "alpha", 1.0)
    s = e.op("Sigmoid", e.scale(x, alpha))
    bend = e.op("Mul", e.scale(x, alpha), e.op("Mul", s, e.op("Sub", e.scalar(1.0), s)))
    return {0: e.op("Mul", dys[0], e.op("Add", s, bend))}
