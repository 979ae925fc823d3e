"""Pad's amounts per axis (opset 18's `axes` input spread over every axis), and the gradient of its reflect, edge
and wrap modes (torch.stft's reflect padding, F.pad's replicate and circular): each padded element is a copy of an
input element, so its gradient adds to that element's."""

from __future__ import annotations

import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter

BEFORE_ALL = -(2**62)
"""A Slice end before every element, for a slice that steps back through element 0."""


def full_pads(e: Emitter, node: ir.Node, rank: int) -> list[int]:
    """The node's pads as [begin of each axis..., end of each axis...] over all `rank` axes."""
    pads = [int(p) for p in e.info.static(node.inputs[1]).tolist()]
    given = node.inputs[3] if len(node.inputs) > 3 else None
    if given is None:
        return pads
    axes = [int(a) % rank for a in e.info.static(given).tolist()]
    full = [0] * (2 * rank)
    for k, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
    return full


def copied_back(e: Emitter, node: ir.Node, dy: ir.Value, mode: str, shape: tuple[int, ...]) -> ir.Value:
    """The gradient of a reflect, edge or wrap Pad: axis by axis, the padding's gradient added to the elements it
    copies, the middle's kept."""
    rank = len(shape)
    pads = full_pads(e, node, rank)
    grad = dy
    for axis, length in enumerate(shape):
        before, after = pads[axis], pads[rank + axis]
        if before < 0 or after < 0 or max(before, after) > (length - 1 if mode == "reflect" else length):
            raise ModelError(f"Pad {node.name!r}: a {mode} padding of ({before}, {after}) on an axis of {length} "
                             "has no gradient here (negative, or wider than the axis)")
        if before or after:
            grad = _axis_back(e, grad, axis, rank, (before, length, after), mode)
    return grad


def _axis_back(e: Emitter, g: ir.Value, axis: int, rank: int, parts: tuple[int, int, int], mode: str) -> ir.Value:
    """One axis: g's (before, length, after) parts, the outer two added where they were copied from."""
    before, length, after = parts
    total = [e.op("Slice", g, e.ints([before]), e.ints([before + length]), e.ints([axis]))]
    for count, start, at_start in ((before, 0, True), (after, before + length, False)):
        if count:
            part = _edge_part(e, g, start, start + count, axis, mode)
            width = 1 if mode == "edge" else count
            total.append(e.op("Pad", part, e.ints(_placement(axis, rank, length, width, mode, at_start))))
    return e.op("Sum", *total) if len(total) > 1 else total[0]


def _edge_part(e: Emitter, g: ir.Value, start: int, end: int, axis: int, mode: str) -> ir.Value:
    """g[start:end] along `axis`: reversed for reflect (the copies run away from the edge), summed for edge (all
    copies of one element), as is for wrap."""
    if mode == "reflect":
        return e.op("Slice", g, e.ints([end - 1]), e.ints([start - 1 if start else BEFORE_ALL]), e.ints([axis]),
                    e.ints([-1]))
    part = e.op("Slice", g, e.ints([start]), e.ints([end]), e.ints([axis]))
    return e.reduce_sum(part, [axis], keepdims=True) if mode == "edge" else part


def _placement(axis: int, rank: int, length: int, width: int, mode: str, at_start: bool) -> list[int]:
    """Pads that put a `width`-wide padding gradient at the elements it copied, on an axis of `length`: reflect's
    next to the edge element, edge's on it, wrap's at the other end."""
    offset = {"reflect": 1, "edge": 0, "wrap": length - width}[mode]
    first = offset if at_start else length - width - offset
    pads = [0] * (2 * rank)
    pads[axis], pads[rank + axis] = first, length - width - first
    return pads
