"""Gradients of region-of-interest pooling w.r.t. the feature map (the regions get none, as in torchvision):
RoiAlign (opset 10, and 16 with coordinate_transformation_mode) in avg mode, and MaxRoiPool, whose bins need the
regions as constants (an initializer, or computed from them)."""

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
    weights over the map's rows, A'_r over its columns): dX_b sums A_r^T dY_r A'_r / count_r over b's regions. The
    weights are constants for constant regions, else computed in the graph (then with a fixed sampling_ratio)."""
    if attr_str(node, "mode", "avg") != "avg":
        raise ModelError(f"RoiAlign {node.name!r}: only mode=avg has a gradient here, not 'max'")
    shape = batch, channels, height, width = e.info.shape(node.inputs[0])
    scale = attr_float(node, "spatial_scale", 1.0)
    half_pixel = e.info.opset >= 16 and attr_str(node, "coordinate_transformation_mode", "half_pixel") == "half_pixel"
    out_h, out_w = attr_int(node, "output_height", 1), attr_int(node, "output_width", 1)
    ratio = attr_int(node, "sampling_ratio", 0)
    rois, images = _constant(e, node.inputs[1]), _constant(e, node.inputs[2])
    if rois is not None:
        rows, columns = [], []
        for x1, y1, x2, y2 in rois * scale - (0.5 if half_pixel else 0.0):
            rows.append(_bilinear_weights(y1, y2, out_h, height, ratio, half_pixel))
            columns.append(_bilinear_weights(x1, x2, out_w, width, ratio, half_pixel))
        row_weights = e.const(np.stack(rows).astype(e.dtype))
        column_weights = e.const(np.stack(columns).astype(e.dtype))
    elif ratio > 0:
        corners = e.op("Sub", e.scale(present(node.inputs[1]), scale), e.scalar(0.5 if half_pixel else 0.0))
        row_weights = _sampled_weights(e, corners, (1, 3), (out_h, height, ratio), half_pixel)
        column_weights = _sampled_weights(e, corners, (0, 2), (out_w, width, ratio), half_pixel)
    else:
        raise ModelError(f"RoiAlign {node.name!r}: regions from the graph's inputs with adaptive sampling "
                         "(sampling_ratio 0) have no gradient here: export with a fixed sampling_ratio (torchvision's "
                         "MultiScaleRoIAlign uses 2)")
    regions = e.info.shape(node.inputs[1])[0]
    tall = e.op("MatMul", e.op("Unsqueeze", e.transpose(row_weights, [0, 2, 1]), e.ints([1])), dys[0])
    per_region = e.op("MatMul", tall, e.op("Unsqueeze", column_weights, e.ints([1])))  # (regions, C, H, W)
    flat = e.reshape(per_region, [regions, channels * height * width])
    return {0: e.reshape(e.op("MatMul", _owners(e, node.inputs[2], images, batch), flat), shape)}


def _sampled_weights(e: Emitter, corners: ir.Value, axes: tuple[int, int], sizes: tuple[int, int, int],
                     half_pixel: bool) -> ir.Value:
    """(regions, bins, size) in the graph: `_bilinear_weights` for each region's corners (columns `axes` of the
    scaled, shifted regions), with a fixed number of samples per bin."""
    bins, size, grid = sizes
    start, end = (e.op("Slice", corners, e.ints([a]), e.ints([a + 1]), e.ints([1])) for a in axes)  # (regions, 1)
    extent = e.op("Sub", end, start)
    if not half_pixel:
        extent = e.op("Max", extent, e.scalar(1.0))
    offsets = (np.arange(bins)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid).reshape(1, -1) / bins
    at = e.op("Add", start, e.op("Mul", extent, e.const(offsets.astype(e.dtype))))  # (regions, bins * grid)
    inside = e.op("And", e.op("GreaterOrEqual", at, e.scalar(-1.0)), e.op("LessOrEqual", at, e.scalar(float(size))))
    at = e.op("Max", at, e.scalar(0.0))
    low = e.op("Min", e.op("Floor", at), e.scalar(float(size - 1)))
    frac = e.op("Where", e.op("GreaterOrEqual", low, e.scalar(float(size - 1))), e.scalar(0.0), e.op("Sub", at, low))
    share = e.op("Where", inside, e.scalar(1.0 / grid), e.scalar(0.0))
    high = e.op("Min", e.op("Add", low, e.scalar(1.0)), e.scalar(float(size - 1)))
    positions = e.const(np.arange(size, dtype=e.dtype))
    weights = [e.op("Mul", e.op("Cast", e.op("Equal", e.op("Unsqueeze", index, e.ints([2])), positions),
                                to=ir.DataType.from_numpy(e.dtype)),
                    e.op("Unsqueeze", e.op("Mul", share, part), e.ints([2])))
               for index, part in ((low, e.op("Sub", e.scalar(1.0), frac)), (high, frac))]
    per_sample = e.reshape(e.op("Add", *weights), [-1, bins, grid, size])
    return e.reduce_sum(per_sample, [2], keepdims=False)


def _owners(e: Emitter, images: ir.Value | None, known: np.ndarray | None, batch: int) -> ir.Value:
    """(batch, regions): 1 where the region is on that image."""
    if known is not None:
        return e.const((np.arange(batch)[:, None] == known.astype(np.int64)[None, :]).astype(e.dtype))
    ids = e.op("Unsqueeze", present(images), e.ints([0]))
    on = e.op("Equal", e.const(np.arange(batch, dtype=e.info.np_dtype(images))[:, None]), ids)
    return e.op("Cast", on, to=ir.DataType.from_numpy(e.dtype))


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


def _constant(e: Emitter, value: ir.Value | None) -> np.ndarray | None:
    """The value's numbers where they depend on no graph input, else None."""
    try:
        return np.asarray(e.info.static(value))
    except ModelError:
        return None


def _static_regions(e: Emitter, node: ir.Node, value: ir.Value | None) -> np.ndarray:
    """The regions (or their images) as numbers; ModelError naming the node where they depend on a graph input."""
    try:
        return np.asarray(e.info.static(value))
    except ModelError:
        raise ModelError(f"{node.op_type} {node.name!r}: its regions depend on the graph's inputs; its gradient "
                         "needs them constant (an initializer)") from None
