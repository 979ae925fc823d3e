"""The gradient of Einsum: another Einsum of the output gradient and the other operands.

For Y[out] = sum over the other letters of prod_j X_j[s_j], the gradient of operand i is
dX_i[s_i] = sum over the letters not in s_i of dY[out] prod_{j != i} X_j[s_j], which is the Einsum
"out,s_j...->s_i". A letter only operand i has (summed away in the forward) is absent from that Einsum:
its gradient does not depend on it, so the result is broadcast back along it.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_str
from onnx_remat.passes.einsum_terms import explicit_terms

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def einsum(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dX_i = Einsum(out, s_j... -> s_i)(dY, X_j...), broadcast along the letters only X_i has."""
    shapes = [tuple(e.info.shape(value)) for value in node.inputs]
    terms, out = explicit_terms(attr_str(node, "equation"), [len(s) for s in shapes])
    _refuse_unsupported(node, terms, shapes)
    grads = {}
    for i, term in enumerate(terms):
        if not needs[i]:
            continue
        others = [(t, value) for j, (t, value) in enumerate(zip(terms, node.inputs, strict=True)) if j != i]
        available = set(out).union(*(set(t) for t, _ in others))
        kept = "".join(letter for letter in term if letter in available)
        grad = _product(e, dys[0], out, others, kept)
        if kept != term:
            grad = e.reshape(grad, [size if letter in available else 1
                                    for letter, size in zip(term, shapes[i], strict=True)])
            grad = e.op("Expand", grad, e.ints(shapes[i]))
        grads[i] = grad
    return grads


def _product(e: Emitter, dy: ir.Value, out: str, others: list[tuple[str, ir.Value | None]], kept: str) -> ir.Value:
    """Einsum(out, others -> kept) of dY and the other operands; a scalar dY multiplies the others' Einsum instead
    (OpenVINO refuses an Einsum operand with no letters)."""
    if out:
        equation = ",".join([out, *(t for t, _ in others)]) + "->" + kept
        return e.op("Einsum", dy, *(value for _, value in others), equation=equation)
    if not others:
        return dy
    equation = ",".join(t for t, _ in others) + "->" + kept
    return e.op("Mul", e.op("Einsum", *(value for _, value in others), equation=equation), dy)


def _refuse_unsupported(node: ir.Node, terms: list[str], shapes: list[tuple[int, ...]]) -> None:
    """ModelError for a letter repeated within an operand (a diagonal) or sized differently across operands
    (broadcast): their gradients are not an Einsum of the same letters."""
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(set(term)) != len(term):
            raise ModelError(f"no gradient rule for Einsum {node.name!r}: a letter repeats within an operand "
                             f"({attr_str(node, 'equation')!r})")
        for letter, size in zip(term, shape, strict=True):
            if sizes.setdefault(letter, size) != size:
                raise ModelError(f"no gradient rule for Einsum {node.name!r}: it broadcasts letter {letter!r} "
                                 f"({attr_str(node, 'equation')!r})")
