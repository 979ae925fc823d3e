"""Gradients of data movement: reshapes, transposes, concatenation, splitting, slicing, padding."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, attr_ints, attr_str
from onnx_remat.passes.autodiff.rules import padding

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def reshape_back(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Reshape, Flatten, Squeeze, Unsqueeze: reshape dy to the input's shape."""
    return {0: e.reshape(dys[0], e.info.shape(node.inputs[0]))}


def trilu(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Trilu keeps a triangle and zeroes the rest: dy through the same Trilu (same k and upper)."""
    return {0: e.op("Trilu", dys[0], *node.inputs[1:2], upper=attr_int(node, "upper", 1))}


def transpose(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Transpose dy by the inverse permutation."""
    rank = len(e.info.shape(node.inputs[0]))
    perm = attr_ints(node, "perm", list(reversed(range(rank))))
    return {0: e.transpose(dys[0], np.argsort(perm).tolist())}


SLICED_CONCAT_INPUTS = 4
"""A Concat of at most this many inputs gets one Slice of dy per input, each an operator of its own freed after its
own readers; a wider one one Split, whose parts all live until the last reader of any. Per-input operators for all of
DenseNet-121's Concats (up to 32 inputs) grow its training problem from 1555 to 2066 operators and its minimum search
at a 30 s limit from 6.8 to 26.5 CPU s, for a minimum found no lower (61.87 against 60.46 MiB;
tools/bench_concat_split.py)."""


def concat(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Cut dy into the inputs' extents along the axis: Slices for a narrow Concat, one Split for a wide one."""
    rank = len(e.info.shape(node.outputs[0]))
    axis = attr_int(node, "axis") % rank
    sizes = [e.info.shape(i)[axis] for i in node.inputs]
    if len(sizes) > SLICED_CONCAT_INPUTS:
        parts = e.ops("Split", [dys[0], e.ints(sizes)], len(sizes), axis=axis)
        return {i: part for i, part in enumerate(parts) if needs[i]}
    ends = np.cumsum(sizes).tolist()
    starts = [0, *ends[:-1]]
    return {i: e.op("Slice", dys[0], e.ints([starts[i]]), e.ints([ends[i]]), e.ints([axis]))
            for i in range(len(sizes)) if needs[i]}


def split(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Concatenate the outputs' gradients (the builder gives zeros where none reaches an output)."""
    rank = len(e.info.shape(node.inputs[0]))
    return {0: e.op("Concat", *dys, axis=attr_int(node, "axis", 0) % rank)}


def slice_(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Zero-pad dy back for unit steps; scatter it to the selected positions otherwise."""
    shape = e.info.shape(node.inputs[0])
    ranges = _slice_ranges(e, node, shape)
    if all(r.step == 1 for r in ranges):
        pads = [r.start for r in ranges] + [n - max(r.stop, r.start) for r, n in zip(ranges, shape, strict=True)]
        return {0: e.op("Pad", dys[0], e.ints(pads))}
    picked = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)[np.ix_(*[list(r) for r in ranges])]
    flat = e.op("ScatterElements", e.zeros([math.prod(shape)]), e.const(picked.ravel()),
                e.reshape(dys[0], [-1]), axis=0)
    return {0: e.reshape(flat, shape)}


def _slice_ranges(e: Emitter, node: ir.Node, shape: Sequence[int]) -> list[range]:
    """Per input axis, the indices a Slice node selects (ONNX clamping follows Python's)."""
    starts, ends = (e.info.static(node.inputs[i]).tolist() for i in (1, 2))
    inputs = [*node.inputs, None, None]
    axes = e.info.static(inputs[3]).tolist() if inputs[3] else list(range(len(starts)))
    steps = e.info.static(inputs[4]).tolist() if inputs[4] else [1] * len(starts)
    ranges = [range(n) for n in shape]
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        ranges[axis % len(shape)] = range(*slice(start, end, step).indices(shape[axis % len(shape)]))
    return ranges


def pad(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Constant-mode Pad: slice away the padding (and zero-pad back what negative pads cropped); the other modes
    add the padding's gradient to the elements it copies (padding.copied_back)."""
    mode = attr_str(node, "mode", "constant")
    shape = e.info.shape(node.inputs[0])
    if mode != "constant":
        return {0: padding.copied_back(e, node, dys[0], mode, shape)}
    rank = len(shape)
    pads = padding.full_pads(e, node, rank)
    begin, end = pads[:rank], pads[rank:]
    kept = [n - max(-b, 0) - max(-f, 0) for n, b, f in zip(shape, begin, end, strict=True)]
    starts = [max(b, 0) for b in begin]
    dx = e.op("Slice", dys[0], e.ints(starts), e.ints([s + k for s, k in zip(starts, kept, strict=True)]))
    cropped = [max(-p, 0) for p in pads]
    return {0: e.op("Pad", dx, e.ints(cropped)) if any(cropped) else dx}


def _unshuffled(e: Emitter, dy: ir.Value, grouped: Sequence[int], perm: Sequence[int],
                shape: Sequence[int]) -> ir.Value:
    """Undo reshape(x, grouped) -> Transpose(perm) -> reshape: dy to the transposed shape, back by the inverse
    permutation, then to the input's shape."""
    moved = e.reshape(dy, [grouped[p] for p in perm])
    return e.reshape(e.transpose(moved, np.argsort(perm).tolist()), shape)


def depth_to_space(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """A fixed permutation of elements (channel blocks to pixels, DCR or CRD order): dy permuted back."""
    n, c, h, w = shape = e.info.shape(node.inputs[0])
    b = attr_int(node, "blocksize")
    if attr_str(node, "mode", "DCR") == "CRD":
        return {0: _unshuffled(e, dys[0], [n, c // b**2, b, b, h, w], [0, 1, 4, 2, 5, 3], shape)}
    return {0: _unshuffled(e, dys[0], [n, b, b, c // b**2, h, w], [0, 3, 4, 1, 5, 2], shape)}


def space_to_depth(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """A fixed permutation of elements (pixel blocks to channels): dy permuted back."""
    n, c, h, w = shape = e.info.shape(node.inputs[0])
    b = attr_int(node, "blocksize")
    return {0: _unshuffled(e, dys[0], [n, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], shape)}


def tile(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Every copy's gradient summed: dy split into (repeats, size) per axis, summed over the repeats."""
    shape = e.info.shape(node.inputs[0])
    repeats = e.info.static(node.inputs[1]).tolist()
    split = [d for r, n in zip(repeats, shape, strict=True) for d in (r, n)]
    summed = e.reduce_sum(e.reshape(dys[0], split), list(range(0, 2 * len(shape), 2)), keepdims=False)
    return {0: summed}
