"""Gradients of the ops with weights: Gemm, MatMul, Conv, ConvTranspose."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float, attr_int, attr_ints, attr_str, has_attr, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def gemm(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Y = alpha * op(A) op(B) + beta * C, with op a transpose when transA/transB is set."""
    a, b = (present(v) for v in node.inputs[:2])
    alpha, beta = attr_float(node, "alpha", 1.0), attr_float(node, "beta", 1.0)
    ta, tb, dy = attr_int(node, "transA", 0), attr_int(node, "transB", 0), dys[0]
    grads = {}
    if needs[0]:  # d op(A) = alpha dY op(B)^T
        wb, wa = b, alpha
        if len(set(e.info.shape(b))) == 1 and b.is_initializer():  # see _shared_weight_product
            wb, wa = e.scale(b, 2.0), alpha / 2
        grads[0] = (e.op("Gemm", wb, dy, alpha=wa, transA=tb, transB=1) if ta
                    else e.op("Gemm", dy, wb, alpha=wa, transB=1 - tb))
    if needs[1]:  # d op(B) = alpha op(A)^T dY
        grads[1] = (e.op("Gemm", dy, a, alpha=alpha, transA=1, transB=ta) if tb
                    else e.op("Gemm", a, dy, alpha=alpha, transA=1 - ta))
    if len(node.inputs) > 2 and needs[2]:
        dc = e.sum_to(dy, e.info.shape(node.outputs[0]), e.info.shape(node.inputs[2]))
        grads[2] = e.scale(dc, beta)
    return grads


def matmul(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Batched, broadcasting matmul: dA = dY B^T, dB = A^T dY, summed over broadcast batch axes."""
    a, b = (present(v) for v in node.inputs[:2])
    a_shape, b_shape, y_shape = e.info.shape(a), e.info.shape(b), e.info.shape(node.outputs[0])
    a2_shape = (1, *a_shape) if len(a_shape) == 1 else a_shape  # a vector is a row
    b2_shape = (*b_shape, 1) if len(b_shape) == 1 else b_shape  # a vector is a column
    y2_shape = (*y_shape, 1) if len(b_shape) == 1 else y_shape
    y2_shape = (*y2_shape[:-1], 1, y2_shape[-1]) if len(a_shape) == 1 else y2_shape
    a2 = a if a2_shape == a_shape else e.reshape(a, a2_shape)
    b2 = b if b2_shape == b_shape else e.reshape(b, b2_shape)
    dy = dys[0] if y2_shape == y_shape else e.reshape(dys[0], y2_shape)
    grads = {}
    if needs[0]:
        square = b2_shape[-1] == b2_shape[-2] and b.is_initializer()
        da = _shared_weight_product(e, square, dy, y2_shape, b2, (*y2_shape[:-1], b2_shape[-2]),
                                    lambda g, w: e.op("MatMul", g, _swap_last(e, w, len(b2_shape))))
        grads[0] = _unpromote(e, e.sum_to(da, (*y2_shape[:-1], b2_shape[-2]), a2_shape), a2_shape, a_shape)
    if needs[1]:
        db = e.op("MatMul", _swap_last(e, a2, len(a2_shape)), dy)
        db = e.sum_to(db, (*y2_shape[:-2], a2_shape[-1], y2_shape[-1]), b2_shape)
        grads[1] = _unpromote(e, db, b2_shape, b_shape)
    return grads


def _unpromote(e: Emitter, x: ir.Value, shape: tuple[int, ...], original: tuple[int, ...]) -> ir.Value:
    """Reshape a matrix back to the vector it was promoted from."""
    return x if shape == original else e.reshape(x, original)


def _swap_last(e: Emitter, x: ir.Value, rank: int) -> ir.Value:
    """Transpose the last two axes."""
    return e.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


@dataclass(frozen=True)
class Window:
    """Explicit sliding-window geometry per spatial axis (auto_pad resolved)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]

    @property
    def pads(self) -> list[int]:
        """ONNX pads: all begins, then all ends."""
        return [*self.begin, *self.end]


def window(node: ir.Node, kernel: Sequence[int], in_spatial: Sequence[int]) -> Window:
    """Read kernel/strides/dilations/pads of a Conv or pooling node, resolving auto_pad against the input size."""
    rank = len(kernel)
    strides = tuple(attr_ints(node, "strides", [1] * rank))
    dilations = tuple(attr_ints(node, "dilations", [1] * rank))
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = attr_ints(node, "pads", [0] * 2 * rank)
        return Window(tuple(kernel), strides, dilations, tuple(pads[:rank]), tuple(pads[rank:]))
    if auto_pad == "VALID":
        return Window(tuple(kernel), strides, dilations, (0,) * rank, (0,) * rank)
    total = [max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
             for n, k, s, d in zip(in_spatial, kernel, strides, dilations, strict=True)]
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end))


def conv(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Input gradient by ConvTranspose, weight gradient by a Conv with batch and channels swapped."""
    x, w = (present(v) for v in node.inputs[:2])
    x_shape, w_shape, dy = e.info.shape(x), e.info.shape(w), dys[0]
    dy_shape = e.info.shape(node.outputs[0])
    win = window(node, w_shape[2:], x_shape[2:])
    group = attr_int(node, "group", 1)
    grads = {}
    if needs[0]:
        out_pad = [n - ((o - 1) * s + (k - 1) * d + 1 - b - f) for n, o, k, s, d, b, f in
                   zip(x_shape[2:], dy_shape[2:], win.kernel, win.strides, win.dilations, win.begin, win.end,
                       strict=True)]
        attrs = {"strides": list(win.strides), "dilations": list(win.dilations), "pads": win.pads, "group": group,
                 "output_padding": out_pad}
        grads[0] = _shared_weight_product(e, _square_per_group(w_shape, group), dy, dy_shape, w, x_shape,
                                          lambda a, b: e.op("ConvTranspose", a, b, **attrs))
    if needs[1]:
        grads[1] = conv_weight_grad(e, x, x_shape, dy, dy_shape, w_shape, win, group)
    if len(node.inputs) > 2 and needs[2]:
        grads[2] = e.reduce_sum(dy, [0, *range(2, len(dy_shape))], keepdims=False)
    return grads


def conv_transpose(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """ConvTranspose is the adjoint of Conv: input gradient by Conv, weight gradient as for Conv."""
    x, w = (present(v) for v in node.inputs[:2])
    x_shape, w_shape, dy = e.info.shape(x), e.info.shape(w), dys[0]
    dy_shape = e.info.shape(node.outputs[0])
    if has_attr(node, "output_shape") or attr_str(node, "auto_pad", "NOTSET") != "NOTSET":
        raise ModelError(f"ConvTranspose {node.name!r}: output_shape/auto_pad are not supported, give explicit pads")
    win = window(node, w_shape[2:], x_shape[2:])
    group = attr_int(node, "group", 1)
    grads = {}
    if needs[0]:
        attrs = {"strides": list(win.strides), "dilations": list(win.dilations), "pads": win.pads, "group": group}
        dx = _shared_weight_product(e, _square_per_group(w_shape, group), dy, dy_shape, w, x_shape,
                                    lambda a, b: e.op("Conv", a, b, **attrs))
        full = [(o + b + f - (k - 1) * d - 1) // s + 1 for o, b, f, k, d, s in
                zip(dy_shape[2:], win.begin, win.end, win.kernel, win.dilations, win.strides, strict=True)]
        grads[0] = _crop(e, dx, x_shape, full)  # output_padding >= stride leaves extra rows
    if needs[1]:
        grads[1] = conv_weight_grad(e, dy, dy_shape, x, x_shape, w_shape, win, group)
    if len(node.inputs) > 2 and needs[2]:
        grads[2] = e.reduce_sum(dy, [0, *range(2, len(dy_shape))], keepdims=False)
    return grads


def _shared_weight_product(e: Emitter, square: bool, act: ir.Value, act_shape: Sequence[int], w: ir.Value,
                           out_shape: Sequence[int], product: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
    """`product(act, w)` for a backward op that reads the forward op's weight `w` in another role.

    OpenVINO 2026.4 (CPU) computes wrong results when one weight constant with equal channel (or
    matrix) axes feeds two Conv/ConvTranspose or MatMul nodes in different roles. For such weights
    this reads w * 2 instead (a distinct constant once folded; exact in floating point) and halves
    the smaller of the activation and the result.
    """
    if not square:
        return product(act, w)
    halve_act = math.prod(act_shape) <= math.prod(out_shape)
    out = product(e.scale(act, 0.5) if halve_act else act, e.scale(w, 2.0))
    return out if halve_act else e.scale(out, 0.5)


def _square_per_group(w_shape: Sequence[int], group: int) -> bool:
    """Whether a Conv or ConvTranspose weight has equal channel axes within each group, where OpenVINO 2026.4
    miscomputes it shared by the forward and backward ops (_shared_weight_product): measured on grouped weights
    [4, 2, k, k] with group 2 (input gradient off by 72-130%); depthwise weights ([C, 1, k, k], group C) are right."""
    return w_shape[0] // group == w_shape[1] and (group == 1 or w_shape[1] > 1)


def _crop(e: Emitter, x: ir.Value, shape: Sequence[int], full_spatial: Sequence[int]) -> ir.Value:
    """Slice the spatial axes of x (currently full_spatial long) down to shape[2:]."""
    if list(full_spatial) == list(shape[2:]):
        return x
    spatial = list(range(2, len(shape)))
    return e.op("Slice", x, e.ints([0] * len(spatial)), e.ints(shape[2:]), e.ints(spatial))


def conv_weight_grad(e: Emitter, x: ir.Value, x_shape: Sequence[int], dy: ir.Value, dy_shape: Sequence[int],
                     w_shape: Sequence[int], win: Window, group: int) -> ir.Value:
    """dW[m, c, k] = sum_{n,o} dy[n, m, o] x[n, group(m) c, o*s + k*d - pad]: a Conv of x by dy.

    Batch becomes the channel axis: x -> [C/g, g*N, *in], dy -> [M, N, *out]; the Conv swaps
    strides and dilations and yields [C/g, M, *k'] (k' >= k), transposed to [M, C/g, *k].
    """
    n, c = x_shape[:2]
    spatial = list(range(2, len(x_shape)))
    cg = c // group
    if group == 1:
        xt = e.transpose(x, [1, 0, *spatial])
    else:
        split = e.reshape(x, (n, group, cg, *x_shape[2:]))
        xt = e.reshape(e.transpose(split, [2, 1, 0, *(a + 1 for a in spatial)]), (cg, group * n, *x_shape[2:]))
    dyt = e.transpose(dy, [1, 0, *spatial])
    z = e.op("Conv", xt, dyt, strides=list(win.dilations), dilations=list(win.strides), pads=win.pads, group=group)
    z = e.transpose(z, [1, 0, *spatial])
    full = [(i + b + f - ((o - 1) * s + 1)) // d + 1 for i, o, s, d, b, f in
            zip(x_shape[2:], dy_shape[2:], win.strides, win.dilations, win.begin, win.end, strict=True)]
    return _crop(e, z, w_shape, full)
