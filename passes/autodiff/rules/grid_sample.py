"""Gradients of spatial transformers' ops: GridSample (opset 16 and 20) in its bilinear mode with zero padding, for
2-D images, to the image and to the grid; AffineGrid (opset 20), 2-D and 3-D."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_int, attr_str, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]
BILINEAR = ("bilinear", "linear")
"""The mode's name at opset 16 and from opset 20."""


@dataclass(frozen=True)
class _Axis:
    """One image axis at every sample: the lower corner's weight and the sampled position's factor per grid unit."""

    low: ir.Value  # floor of the position, as a float
    upper_weight: ir.Value  # position - low: the weight of low + 1; 1 - it is the weight of low
    scale: float  # d position / d grid coordinate


def _axis(e: Emitter, coordinate: ir.Value, size: int, align_corners: bool) -> _Axis:
    """Unnormalize a grid coordinate in [-1, 1] to a pixel position: (g + 1)/2 (size - 1) with align_corners,
    ((g + 1) size - 1)/2 without."""
    scale = (size - 1) / 2 if align_corners else size / 2
    position = e.op("Add", e.scale(coordinate, scale), e.scalar((size - 1) / 2))
    low = e.op("Floor", position)
    return _Axis(low, e.op("Sub", position, low), scale)


def _corner(e: Emitter, y: ir.Value, x: ir.Value, height: int, width: int, dtype: ir.DataType
            ) -> tuple[ir.Value, ir.Value]:
    """(flat index into H*W, clamped to the image; 1 where the corner is inside the image, else 0, in `dtype`)."""
    inside = [e.op("GreaterOrEqual", v, e.scalar(0.0)) for v in (y, x)]
    inside += [e.op("LessOrEqual", y, e.scalar(height - 1)), e.op("LessOrEqual", x, e.scalar(width - 1))]
    valid = e.op("Cast", e.op("And", e.op("And", inside[0], inside[1]), e.op("And", inside[2], inside[3])),
                 to=dtype)
    row = e.op("Clip", y, e.scalar(0.0), e.scalar(height - 1))
    column = e.op("Clip", x, e.scalar(0.0), e.scalar(width - 1))
    flat = e.op("Add", e.scale(row, width), column)
    return e.op("Cast", flat, to=ir.DataType.INT64), valid


def grid_sample(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Each output mixes four pixels with weights (1 - u or u)(1 - v or v): the image gets dy times the weight
    scattered to each pixel, the grid dy times the pixels' differences along each axis."""
    image, grid = present(node.inputs[0]), present(node.inputs[1])
    _require_supported(e, node, image)
    n, c, height, width = e.info.shape(image)
    grid_shape = e.info.shape(grid)
    samples = grid_shape[1] * grid_shape[2]
    align = bool(attr_int(node, "align_corners", 0))
    points = e.reshape(grid, [n, 1, samples, 2])
    xs, ys = (_axis(e, e.op("Gather", points, e.ints([k]), axis=3), size, align) for k, size in ((0, width),
                                                                                                   (1, height)))
    x_high, y_high = e.op("Add", xs.low, e.scalar(1.0)), e.op("Add", ys.low, e.scalar(1.0))
    corners = [_corner(e, y, x, height, width, e.info.dtype(image)) for y in (ys.low, y_high) for x in (xs.low, x_high)]
    wx = [e.op("Sub", e.scalar(1.0), xs.upper_weight), xs.upper_weight]
    wy = [e.op("Sub", e.scalar(1.0), ys.upper_weight), ys.upper_weight]
    dy = e.reshape(dys[0], [n, c, samples, 1])
    flat_shape = e.ints([n, c, samples, 1])
    indices = [e.op("Expand", e.reshape(index, [n, 1, samples, 1]), flat_shape) for index, _ in corners]
    grads = {}
    if needs[0]:
        updates = [e.op("Mul", dy, e.op("Mul", e.op("Mul", wy[k // 2], wx[k % 2]), corners[k][1])) for k in range(4)]
        scattered = e.op("ScatterElements", e.zeros([n, c, height * width, 1]), e.op("Concat", *indices, axis=2),
                         e.op("Concat", *updates, axis=2), axis=2, reduction="add")
        grads[0] = e.reshape(scattered, [n, c, height, width])
    if needs[1]:
        pixels = e.reshape(image, [n, c, height * width, 1])
        v = [e.op("Mul", e.op("GatherElements", pixels, indices[k], axis=2), corners[k][1]) for k in range(4)]
        along_x = e.op("Add", e.op("Mul", e.op("Sub", v[1], v[0]), wy[0]), e.op("Mul", e.op("Sub", v[3], v[2]), wy[1]))
        along_y = e.op("Add", e.op("Mul", e.op("Sub", v[2], v[0]), wx[0]), e.op("Mul", e.op("Sub", v[3], v[1]), wx[1]))
        dx, dy_grid = (e.scale(e.reduce_sum(e.op("Mul", dy, along), [1], keepdims=True), scale)
                       for along, scale in ((along_x, xs.scale), (along_y, ys.scale)))
        grads[1] = e.reshape(e.op("Concat", dx, dy_grid, axis=3), grid_shape)
    return grads


def _require_supported(e: Emitter, node: ir.Node, image: ir.Value) -> None:
    """ModelError unless the node samples a 2-D image bilinearly with zero padding."""
    mode, padding = attr_str(node, "mode", "bilinear"), attr_str(node, "padding_mode", "zeros")
    if mode not in BILINEAR or padding != "zeros" or len(e.info.shape(image)) != 4:
        raise ModelError(f"GridSample {node.name!r}: only 2-D images sampled in mode bilinear with padding_mode zeros "
                         f"have a gradient here, not mode {mode!r} with {padding!r}: sample so")


def _base_grid(size: Sequence[int], align_corners: bool) -> np.ndarray:
    """AffineGrid's positions before the transform, one row per output position (x fastest): columns x, y (, z), 1."""
    axes = [np.linspace(-1.0, 1.0, n) if align_corners else (2 * np.arange(n) + 1) / n - 1 for n in size]
    mesh = np.meshgrid(*axes, indexing="ij")  # over (d,) h, w: x varies along the last axis
    return np.stack([*(m.reshape(-1) for m in mesh[::-1]), np.ones(int(np.prod(size)))], axis=1)


def affine_grid(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """AffineGrid (opset 20): grid = base theta^T per sample, so dtheta = dgrid^T base, summed over positions."""
    theta = present(node.inputs[0])
    n, dims, _ = e.info.shape(theta)
    spatial = [int(v) for v in e.info.static(node.inputs[1])][2:]
    base = _base_grid(spatial, bool(attr_int(node, "align_corners", 0))).astype(e.dtype)
    flat = e.op("Transpose", e.reshape(dys[0], [n, -1, dims]), perm=[0, 2, 1])  # n, dims, positions
    return {0: e.op("MatMul", flat, e.const(base))}
