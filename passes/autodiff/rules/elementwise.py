"""Gradients of elementwise ops: broadcasting arithmetic, activations, casts, dropout."""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def _to_inputs(e: Emitter, node: ir.Node, grads: dict[int, ir.Value], needs: Needs) -> dict[int, ir.Value]:
    """Sum each broadcast input's gradient (shaped like the output) back to the input's shape."""
    out_shape = e.info.shape(node.outputs[0])
    return {i: e.sum_to(g, out_shape, e.info.shape(node.inputs[i])) for i, g in grads.items() if needs[i]}


def add(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d(a+b) = (dy, dy)."""
    return _to_inputs(e, node, {0: dys[0], 1: dys[0]}, needs)


def sum_(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d(a+b+...) = dy for every input."""
    return _to_inputs(e, node, dict.fromkeys(range(len(node.inputs)), dys[0]), needs)


def sub(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d(a-b) = (dy, -dy)."""
    grads = {0: dys[0]}
    if needs[1]:
        grads[1] = e.op("Neg", dys[0])
    return _to_inputs(e, node, grads, needs)


def mean(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d((a+b+...)/n) = dy/n for every input."""
    share = e.scale(dys[0], 1 / len(node.inputs))
    return _to_inputs(e, node, dict.fromkeys(range(len(node.inputs)), share), needs)


def mul(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d(a*b) = (dy*b, dy*a)."""
    a, b = node.inputs[:2]
    grads = {i: e.op("Mul", dys[0], other) for i, other in ((0, b), (1, a)) if needs[i]}
    return _to_inputs(e, node, grads, needs)


def div(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d(a/b) = (dy/b, -dy*y/b)."""
    b, y = node.inputs[1], node.outputs[0]
    da = e.op("Div", dys[0], b)
    grads = {0: da}
    if needs[1]:
        grads[1] = e.op("Neg", e.op("Mul", da, y))
    return _to_inputs(e, node, grads, needs)


def mod(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Float Mod (fmod=1: a - trunc(a/b) b, as torch.fmod): (dy, -dy trunc(a/b)); trunc as sign times floor of |.|."""
    a, b = node.inputs[:2]
    grads = {0: dys[0]}
    if needs[1]:
        quotient = e.op("Div", a, b)
        truncated = e.op("Mul", e.op("Sign", quotient), e.op("Floor", e.op("Abs", quotient)))
        grads[1] = e.op("Neg", e.op("Mul", dys[0], truncated))
    return _to_inputs(e, node, grads, needs)


def neg(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d(-x) = -dy."""
    return {0: e.op("Neg", dys[0])}


def identity(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Identity passes the gradient through."""
    return {0: dys[0]}


def cast(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Cast the gradient back to the input's float type."""
    return {0: e.op("Cast", dys[0], to=e.info.dtype(node.inputs[0]))}


def _mask(e: Emitter, condition: ir.Value, dy: ir.Value, otherwise: ir.Value | None = None) -> ir.Value:
    """dy where condition holds, else `otherwise` (zero by default)."""
    return e.op("Where", condition, dy, otherwise or e.scalar(0.0))


def relu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * sign(y): y = relu(x) is 1 where x > 0 and 0 elsewhere. Reading the output, not the input, lets
    the input go after the forward pass, and Mul holds no temporaries (onnxruntime's Where holds two)."""
    return {0: e.op("Mul", dys[0], e.op("Sign", node.outputs[0]))}


def leaky_relu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy where x > 0, alpha*dy elsewhere. For 0 < alpha <= 1 y has the sign of x, and clipping sign(y) to
    [alpha, 1] gives the slope, so as for relu the output is read instead of the input and no Where runs."""
    alpha = attr_float(node, "alpha", 0.01)
    if 0 < alpha <= 1:
        slope = e.op("Clip", e.op("Sign", node.outputs[0]), e.scalar(alpha), e.scalar(1.0))
        return {0: e.op("Mul", dys[0], slope)}
    positive = e.op("Greater", node.inputs[0], e.scalar(0.0))
    return {0: _mask(e, positive, dys[0], e.scale(dys[0], alpha))}


def clip(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy to x where min <= x <= max, to min where x < min, to max where x > max (as torch.clamp by tensors)."""
    x, bounds = node.inputs[0], [*node.inputs[1:], None, None]
    above_min = e.op("GreaterOrEqual", x, bounds[0]) if bounds[0] else None
    below_max = e.op("LessOrEqual", x, bounds[1]) if bounds[1] else None
    inside = [c for c in (above_min, below_max) if c is not None]
    grads = {}
    if needs[0]:
        grads[0] = dys[0] if not inside else _mask(e, inside[0] if len(inside) == 1 else e.op("And", *inside), dys[0])
    for position, within in ((1, above_min), (2, below_max)):
        if len(needs) > position and needs[position] and within is not None:
            grads[position] = _mask(e, e.op("Not", within), dys[0])
    return _to_inputs(e, node, grads, needs)


def sigmoid(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * y * (1 - y)."""
    y = node.outputs[0]
    return {0: e.op("Mul", e.op("Mul", dys[0], y), e.op("Sub", e.scalar(1.0), y))}


def tanh(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * (1 - y^2)."""
    y = node.outputs[0]
    return {0: e.op("Mul", dys[0], e.op("Sub", e.scalar(1.0), e.op("Mul", y, y)))}


def erf(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * 2/sqrt(pi) * exp(-x^2)."""
    x = node.inputs[0]
    bell = e.op("Exp", e.op("Neg", e.op("Mul", x, x)))
    return {0: e.op("Mul", e.scale(dys[0], 2 / math.sqrt(math.pi)), bell)}


def exp(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * y."""
    return {0: e.op("Mul", dys[0], node.outputs[0])}


def log(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / x."""
    return {0: e.op("Div", dys[0], node.inputs[0])}


def sqrt(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / (2 y)."""
    return {0: e.op("Div", e.scale(dys[0], 0.5), node.outputs[0])}


def reciprocal(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """-dy * y^2."""
    y = node.outputs[0]
    return {0: e.op("Neg", e.op("Mul", dys[0], e.op("Mul", y, y)))}


def pow_(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * p * x^(p-1) for a constant exponent p."""
    x, p = node.inputs[0], e.info.static(node.inputs[1]).astype(e.dtype)
    power = e.op("Pow", x, e.const(p - 1))
    return {0: e.op("Mul", e.op("Mul", dys[0], e.const(p)), power)}


def dropout(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * mask / (1 - ratio), with the mask output the builder makes the forward node produce."""
    ratio = float(e.info.static(node.inputs[1])) if len(node.inputs) > 1 and node.inputs[1] else 0.5
    kept = e.op("Cast", node.outputs[1], to=e.info.dtype(node.inputs[0]))
    return {0: e.op("Mul", e.scale(dys[0], 1 / (1 - ratio)), kept)}


def expand(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Sum the gradient over the broadcast axes."""
    return {0: e.sum_to(dys[0], e.info.shape(node.outputs[0]), e.info.shape(node.inputs[0]))}


def where(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy to the branch the condition picked, zero to the other."""
    condition, zero = node.inputs[0], e.scalar(0.0)
    branches = {1: (dys[0], zero), 2: (zero, dys[0])}
    grads = {i: e.op("Where", condition, *branches[i]) for i in (1, 2) if needs[i]}
    return _to_inputs(e, node, grads, needs)


def abs_(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * sign(x) (zero at x = 0, as torch)."""
    return {0: e.op("Mul", dys[0], e.op("Sign", node.inputs[0]))}


def extremum(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Max/Min: dy to the inputs equal to the output, shared evenly among ties (as torch.maximum)."""
    y = node.outputs[0]
    hits = [e.op("Cast", e.op("Equal", x, y), to=e.info.dtype(y)) for x in node.inputs]
    share = e.op("Div", dys[0], e.op("Sum", *hits))
    return _to_inputs(e, node, {i: e.op("Mul", share, hit) for i, hit in enumerate(hits) if needs[i]}, needs)
