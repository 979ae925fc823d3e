"""Gradients of linear-algebra ops beyond products: Det (opset 11-22) by cofactors, exact for singular matrices
(standard ONNX has no matrix inverse)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def det(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """d det(A) / dA_ij is the cofactor (-1)^(i+j) det(A without row i and column j): every minor is gathered
    (batch, i, j, n-1, n-1) and goes through one Det."""
    a = node.inputs[0]
    shape = e.info.shape(a)
    n, batch = shape[-1], len(shape) - 2
    if n == 1:
        return {0: e.reshape(dys[0], shape)}
    others = np.array([[k for k in range(n) if k != i] for i in range(n)], dtype=np.int64)  # (n, n-1)
    rows = e.op("Gather", a, e.const(others), axis=batch)  # batch, i, n-1, n
    minors = e.op("Gather", rows, e.const(others), axis=batch + 2)  # batch, i, n-1, j, n-1
    square = e.transpose(minors, [*range(batch), batch, batch + 2, batch + 1, batch + 3])
    signs = (-1.0) ** np.add.outer(np.arange(n), np.arange(n))
    cofactors = e.op("Mul", e.op("Det", square), e.const(signs.astype(e.dtype)))
    return {0: e.op("Mul", cofactors, e.op("Unsqueeze", dys[0], e.ints([batch, batch + 1])))}
