"""Gradients of Fourier transforms, DFT (opset 17, and 20 with the axis an input) and STFT (opset 17): the
gradient of a transform is a transform of the gradient. A complex tensor is its real and imaginary parts in a last
axis of 2 (a real one has 1); the adjoint of the n-point DFT matrix F is conj(F)^T = n * F^-1."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int

Grads = Sequence[ir.Value]
Needs = Sequence[bool]

AXIS_INPUT_SINCE = 20
"""DFT takes its axis as an input from opset 20, as an attribute (default 1) before."""


def dft(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """DFT of x padded or cut to n along the axis: the forward transform's gradient is n * inverse DFT of dy (its
    one-sided dy padded with zeros to n), the inverse's is the forward DFT of dy / n, IRFFT's (inverse and one-sided:
    bins 1..n-m stand for two each) the one-sided DFT of dy / n with those bins doubled; then cut or padded back to
    x's length, and the real part for a real x."""
    x = node.inputs[0]
    shape = e.info.shape(x)
    axis = _axis(e, node, len(shape))
    inverse, onesided = attr_int(node, "inverse", 0), attr_int(node, "onesided", 0)
    given = node.inputs[1] if len(node.inputs) > 1 else None
    n = int(e.info.static(given)) if given is not None else 2 * (shape[axis] - 1) if inverse and onesided \
        else shape[axis]
    if not inverse:
        grad, length = e.scale(transform(e, dys[0], n, axis, inverse=True), n), n
    elif not onesided:
        grad, length = e.scale(transform(e, dys[0], n, axis), 1 / n), n
    else:
        length = n // 2 + 1
        bins = np.arange(length)
        weights = np.where((bins >= 1) & (bins <= n - length), 2 / n, 1 / n).astype(e.dtype)
        grad = e.op("Mul", transform(e, dys[0], n, axis, onesided=True),
                    e.const(weights.reshape([length if a == axis else 1 for a in range(len(shape))])))
    return {0: _like(e, grad, length, shape, axis)}


def transform(e: Emitter, signal: ir.Value, n: int, axis: int, inverse: bool = False, onesided: bool = False,
              ) -> ir.Value:
    """A DFT node of `signal`, padded or cut to n along `axis`, in the model's opset's form."""
    length = e.const(np.asarray(n, dtype=np.int64))
    flags = {"inverse": int(inverse), "onesided": int(onesided)}
    if e.info.opset >= AXIS_INPUT_SINCE:
        return e.op("DFT", signal, length, e.const(np.asarray(axis, dtype=np.int64)), **flags)
    return e.op("DFT", signal, length, axis=axis, **flags)


def stft(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """STFT: frame f is window * signal[f * step : f * step + L], transformed. Each frame's gradient is
    L * inverse DFT of its dy (padded to L where one-sided); the signal's sums the frames back where they overlap
    (a ConvTranspose with a one-hot kernel) times the window; the window's sums each frame's gradient times the
    frame."""
    signal, window = node.inputs[0], node.inputs[2] if len(node.inputs) > 2 else None
    batch, samples, parts = e.info.shape(signal)
    step = int(e.info.static(node.inputs[1]))
    length = e.info.shape(window)[0] if window is not None else int(e.info.static(node.inputs[3]))
    frames = e.info.shape(node.outputs[0])[1]
    per_frame = e.scale(transform(e, dys[0], length, 2, inverse=True), length)  # (batch, frames, L, 2)
    if parts == 1:
        per_frame = e.op("Slice", per_frame, e.ints([0]), e.ints([1]), e.ints([3]))
    grads: dict[int, ir.Value] = {}
    if needs[0]:
        windowed = per_frame if window is None else e.op("Mul", per_frame, e.reshape(window, [length, 1]))
        grads[0] = _overlap_add(e, windowed, (batch, frames, length, parts), step, samples)
    if len(needs) > 2 and needs[2]:
        starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
        framed = e.op("Gather", signal, e.const(starts.astype(np.int64)), axis=1)  # (batch, frames, L, parts)
        grads[2] = e.reduce_sum(e.op("Mul", framed, per_frame), [0, 1, 3], keepdims=False)
    return grads


def _overlap_add(e: Emitter, pieces: ir.Value, shape: tuple[int, int, int, int], step: int, samples: int,
                 ) -> ir.Value:
    """Sum (batch, frames, L, parts) pieces into (batch, samples, parts), frame f at sample f * step."""
    batch, frames, length, parts = shape
    columns = e.reshape(e.transpose(pieces, [0, 3, 2, 1]), [batch * parts, length, frames])
    one_hot = np.eye(length, dtype=e.dtype).reshape(length, 1, length)
    summed = e.op("ConvTranspose", columns, e.const(one_hot), strides=[step])  # (batch * parts, 1, covered)
    covered = (frames - 1) * step + length
    rows = e.transpose(e.reshape(summed, [batch, parts, covered]), [0, 2, 1])
    if covered == samples:
        return rows
    return e.op("Pad", rows, e.ints([0, 0, 0, 0, samples - covered, 0]))


def _axis(e: Emitter, node: ir.Node, rank: int) -> int:
    """The node's transform axis, counted from the front."""
    if e.info.opset >= AXIS_INPUT_SINCE:
        given = node.inputs[2] if len(node.inputs) > 2 else None
        axis = int(e.info.static(given)) if given is not None else -2
    else:
        axis = attr_int(node, "axis", 1)
    return axis % rank


def _like(e: Emitter, grad: ir.Value, length: int, shape: tuple[int, ...], axis: int) -> ir.Value:
    """A transform's gradient, `length` long along `axis`, cut or padded with zeros to the input's shape there, and
    its real part where the input is real."""
    rank = len(shape)
    if length < shape[axis]:
        pads = [0] * (2 * rank)
        pads[rank + axis] = shape[axis] - length
        grad = e.op("Pad", grad, e.ints(pads))
    cut = [(a, end) for a, end in ((axis, shape[axis]), (rank - 1, shape[-1])) if (length if a == axis else 2) > end]
    if not cut:
        return grad
    return e.op("Slice", grad, e.ints([0] * len(cut)), e.ints([end for _, end in cut]), e.ints([a for a, _ in cut]))
