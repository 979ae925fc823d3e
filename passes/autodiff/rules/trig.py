"""Gradients of the trigonometric and hyperbolic functions and their inverses (unchanged since opset 7-9)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def _square(e: Emitter, x: ir.Value | None) -> ir.Value:
    return e.op("Mul", x, x)


def sin(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * cos(x)."""
    return {0: e.op("Mul", dys[0], e.op("Cos", node.inputs[0]))}


def cos(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """-dy * sin(x)."""
    return {0: e.op("Neg", e.op("Mul", dys[0], e.op("Sin", node.inputs[0])))}


def tan(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * (1 + y^2), read from the output."""
    return {0: e.op("Mul", dys[0], e.op("Add", e.scalar(1.0), _square(e, node.outputs[0])))}


def atan(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / (1 + x^2)."""
    return {0: e.op("Div", dys[0], e.op("Add", e.scalar(1.0), _square(e, node.inputs[0])))}


def _one_minus_square_root(e: Emitter, x: ir.Value | None) -> ir.Value:
    return e.op("Sqrt", e.op("Sub", e.scalar(1.0), _square(e, x)))


def asin(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / sqrt(1 - x^2)."""
    return {0: e.op("Div", dys[0], _one_minus_square_root(e, node.inputs[0]))}


def acos(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """-dy / sqrt(1 - x^2)."""
    return {0: e.op("Neg", e.op("Div", dys[0], _one_minus_square_root(e, node.inputs[0])))}


def sinh(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * cosh(x)."""
    return {0: e.op("Mul", dys[0], e.op("Cosh", node.inputs[0]))}


def cosh(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy * sinh(x)."""
    return {0: e.op("Mul", dys[0], e.op("Sinh", node.inputs[0]))}


def asinh(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / sqrt(x^2 + 1)."""
    return {0: e.op("Div", dys[0], e.op("Sqrt", e.op("Add", _square(e, node.inputs[0]), e.scalar(1.0))))}


def acosh(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / sqrt(x^2 - 1)."""
    return {0: e.op("Div", dys[0], e.op("Sqrt", e.op("Sub", _square(e, node.inputs[0]), e.scalar(1.0))))}


def atanh(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy / (1 - x^2)."""
    return {0: e.op("Div", dys[0], e.op("Sub", e.scalar(1.0), _square(e, node.inputs[0])))}
