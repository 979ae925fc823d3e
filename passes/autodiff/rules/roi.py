"""Gradients of region-of-interest pooling w.r.t. the feature map (the regions get none, as in torchvision):
RoiAlign (opset 10, and 16 with coordinate_transformation_mode) in avg mode, and MaxRoiPool. Both need the regions
as constants (an initializer, or computed from them): their sampling positions are fixed when the step is built."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_float, attr_int, attr_ints, attr_str, present

Grads = Sequence[ir.Value]
Needs = Sequence[bool]


def roi_align(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Each region's output is separable bilinear sampling, Y_r = A_r X_b A'_r^T / count_r (A_r: each output row's
    weights over the map's rows, A'_r over its columns): dX_b sums A_r^T dY_r A'_r / count_r over b's regions."""
    if attr_str(node, "mode", "avg") != "avg":
        raise ModelError(f"RoiAlign {node.name!r}: only mode=avg has a gradient here, not 'max'")
    batch, channels, height, width = e.info.shape(node.inputs[0])
    rois, images = _static_regions(e, node, node.inputs[1]), _static_regions(e, node, node.inputs[2])
    scale = attr_float(node, "spatial_scale", 1.0)
    half_pixel = e.info.opset >= 16 and attr_str(node, "coordinate_transformation_mode", "half_pixel") == "half_pixel"
    out_h, out_w = attr_int(node, "output_height", 1), attr_int(node, "output_width", 1)
    ratio = attr_int(node, "sampling_ratio", 0)
    rows, columns = [], []
    for x1, y1, x2, y2 in rois * scale - (0.5 if half_pixel else 0.0):
        rows.append(_bilinear_weights(y1, y2, out_h, height, ratio, half_pixel))
        columns.append(_bilinear_weights(x1, x2, out_w, width, ratio, half_pixel))
    per_region = _spread(e, dys[0], np.stack(rows).astype(e.dtype), np.stack(columns).astype(e.dtype))
    return {0: _to_images(e, per_region, images.astype(np.int64), (batch, channels, height, width))}


def _bilinear_weights(start: float, end: float, bins: int, size: int, ratio: int, half_pixel: bool) -> np.ndarray:
    """(bins, size): each output bin's mean bilinear weight on each input position along one axis, as onnxruntime
    samples it (ratio samples per bin, or ceil(extent / bins) for ratio 0; none outside [-1, size])."""
    extent = end - start if half_pixel else max(end - start, 1.0)
    step = extent / bins
    grid = ratio if ratio > 0 else math.ceil(extent / bins)
    weights = np.zeros((bins, size))
    for b in range(bins):
        for k in range(grid):
            at = start + b * step + (k + 0.5) * step / grid
            if at < -1.0 or at > size:
                continue
            at = max(at, 0.0)
            low = min(int(at), size - 1)
            high = min(low + 1, size - 1)
            frac = at - low if low < size - 1 else 0.0
            weights[b, low] += (1 - frac) / grid
            weights[b, high] += frac / grid
    return weights


def _spread(e: Emitter, dy: ir.Value, rows: np.ndarray, columns: np.ndarray) -> ir.Value:
    """Per region, rows^T dy columns: (regions, C, out_h, out_w) -> (regions, C, H, W)."""
    regions, out_h, height = rows.shape
    width = columns.shape[2]
    tall = e.op("MatMul", e.const(rows.transpose(0, 2, 1).reshape(regions, 1, height, out_h)), dy)
    return e.op("MatMul", tall, e.const(columns.reshape(regions, 1, -1, width)))


def _to_images(e: Emitter, per_region: ir.Value, images: np.ndarray, shape: tuple[int, int, int, int]) -> ir.Value:
    """Sum each region's (C, H, W) gradient into its image's."""
    batch = shape[0]
    owners = (np.arange(batch)[:, None] == images[None, :]).astype(e.dtype)  # (batch, regions)
    flat = e.reshape(per_region, [len(images), math.prod(shape[1:])])
    return e.reshape(e.op("MatMul", e.const(owners), flat), shape)


def max_roi_pool(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """Each output is its bin's maximum: dy goes to the first position holding it (torchvision's argmax), found by
    gathering each bin's positions (padded with -inf to the largest bin) and ArgMax; an empty bin's output is 0 and
    passes nothing."""
    batch, channels, height, width = e.info.shape(node.inputs[0])
    rois = _static_regions(e, node, node.inputs[1])
    out_h, out_w = attr_ints(node, "pooled_shape")
    scale = attr_float(node, "spatial_scale", 1.0)
    bins = [_pool_bins(roi[1:], scale, (out_h, out_w), (height, width)) for roi in rois]
    largest = max([1, *(len(cells) for region in bins for cells in region)])
    positions = np.zeros((len(rois), out_h * out_w, largest), dtype=np.int64)
    padding = np.ones(positions.shape, dtype=bool)
    for r, (roi, region) in enumerate(zip(rois, bins, strict=True)):
        for b, cells in enumerate(region):
            positions[r, b, : len(cells)] = int(roi[0]) * height * width + np.asarray(cells, dtype=np.int64)
            padding[r, b, : len(cells)] = False
    x = e.reshape(e.transpose(present(node.inputs[0]), [1, 0, 2, 3]), [channels, batch * height * width])
    values = e.op("Where", e.const(padding), e.scalar(-np.inf), e.op("Gather", x, e.const(positions), axis=1))
    first = e.op("ArgMax", values, axis=3, keepdims=1, select_last_index=0)  # (C, regions, bins, 1)
    spread = e.op("Expand", e.const(positions), e.ints([channels, *positions.shape]))
    at = e.reshape(e.op("GatherElements", spread, first, axis=3), [channels, -1])
    filled = (~padding[:, :, 0]).reshape(1, -1).astype(e.dtype)  # (1, regions * bins): empty bins pass nothing
    dy = e.op("Mul", e.reshape(e.transpose(dys[0], [1, 0, 2, 3]), [channels, -1]), e.const(filled))
    sums = e.op("ScatterElements", e.zeros([channels, batch * height * width]), at, dy, axis=1, reduction="add")
    return {0: e.transpose(e.reshape(sums, [channels, batch, height, width]), [1, 0, 2, 3])}


def _pool_bins(box: np.ndarray, scale: float, pooled: tuple[int, int], size: tuple[int, int]) -> list[list[int]]:
    """Each bin's positions (row * W + column) in one region, as onnxruntime's MaxRoiPool divides it (corners
    rounded half away from zero)."""
    x1, y1, x2, y2 = (int(math.copysign(math.floor(abs(float(v)) * scale + 0.5), v)) for v in box)
    extent_h, extent_w = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
    (out_h, out_w), (height, width) = pooled, size
    cells = []
    for ph in range(out_h):
        top = min(max(math.floor(ph * extent_h / out_h) + y1, 0), height)
        bottom = min(max(math.ceil((ph + 1) * extent_h / out_h) + y1, 0), height)
        for pw in range(out_w):
            left = min(max(math.floor(pw * extent_w / out_w) + x1, 0), width)
            right = min(max(math.ceil((pw + 1) * extent_w / out_w) + x1, 0), width)
            cells.append([h * width + w for h in range(top, bottom) for w in range(left, right)])
    return cells


def _static_regions(e: Emitter, node: ir.Node, value: ir.Value | None) -> np.ndarray:
    """The regions (or their images) as numbers; ModelError naming the node where they depend on a graph input."""
    try:
        return np.asarray(e.info.static(value))
    except ModelError:
        raise ModelError(f"{node.op_type} {node.name!r}: its regions depend on the graph's inputs; its gradient "
                         "needs them constant (an initializer)") from None
