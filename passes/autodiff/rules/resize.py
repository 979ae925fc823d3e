"""Gradient of Resize: interpolation is linear in the input and separable by axis, so dx is dy multiplied, axis by
axis, by the transposed interpolation matrix, found by resizing an identity with the node's own attributes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import Emitter
from onnx_remat.passes.autodiff.graph_info import attr_ints, attr_str, has_attr

Grads = Sequence[ir.Value]
Needs = Sequence[bool]
PROBED_AWAY = ("axes", "keep_aspect_ratio_policy")
"""Attributes the probe does without: it is given every axis's scale or size, stretched."""


def resize(e: Emitter, node: ir.Node, dys: Grads, needs: Needs) -> dict[int, ir.Value]:
    """dy times each resized axis's interpolation matrix transposed (that axis swapped last for a MatMul)."""
    _refuse_unsupported(node)
    shape, rank = e.info.shape(node.inputs[0]), len(e.info.shape(node.inputs[0]))
    dx = dys[0]
    for axis in range(rank):
        matrix = _axis_matrix(e, node, shape, axis)
        if matrix.shape[0] == matrix.shape[1] and np.array_equal(matrix, np.eye(len(matrix))):
            continue
        swap = list(range(rank))
        swap[axis], swap[-1] = swap[-1], swap[axis]
        product = e.op("MatMul", e.transpose(dx, swap), e.const(matrix.astype(e.dtype)))
        dx = e.transpose(product, swap)
    return {0: dx}


def _refuse_unsupported(node: ir.Node) -> None:
    """Crop-and-resize reads a region of interest and aspect-kept sizes couple the axes: neither is separable."""
    if attr_str(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        raise ModelError(f"Resize {node.name!r}: coordinate_transformation_mode=tf_crop_and_resize has no gradient "
                         "here")
    if attr_str(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ModelError(f"Resize {node.name!r}: only keep_aspect_ratio_policy=stretch has a gradient here")


def _requested(e: Emitter, node: ir.Node, rank: int) -> tuple[str, np.ndarray]:
    """Whether the node gives `scales` or `sizes`, and their values for every axis (over `axes` if given)."""
    inputs = [*node.inputs, None, None, None]
    which, position = ("sizes", 3) if inputs[3] is not None and e.info.static(inputs[3]).size else ("scales", 2)
    given = e.info.static(inputs[position])
    axes = [a % rank for a in attr_ints(node, "axes")] if has_attr(node, "axes") else list(range(rank))
    full = np.array(e.info.shape(node.inputs[0]) if which == "sizes" else [1.0] * rank, dtype=given.dtype)
    full[axes] = given
    return which, full


def _axis_matrix(e: Emitter, node: ir.Node, shape: Sequence[int], axis: int) -> np.ndarray:
    """The (output, input) interpolation matrix along `axis`: an identity spread over `axis` and another axis,
    resized along `axis` alone with the node's attributes."""
    rank, size = len(shape), shape[axis]
    other = (axis + 1) % rank
    probe_shape = [1] * rank
    probe_shape[axis] = probe_shape[other] = size
    which, full = _requested(e, node, rank)
    request = np.array(probe_shape if which == "sizes" else [1.0] * rank, dtype=full.dtype)
    request[axis] = full[axis]
    proto = ir.serde.serialize_node(node)
    attributes = [a for a in proto.attribute if a.name not in PROBED_AWAY]
    probe = helper.make_node("Resize", ["x", "", "", "request"] if which == "sizes" else ["x", "", "request"],
                             ["y"])
    probe.attribute.extend(attributes)
    graph = helper.make_graph([probe], "probe", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, None),
                                                 helper.make_tensor_value_info("request", _tensor_type(request), None)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", e.info.opset)])
    (output,) = ReferenceEvaluator(model).run(None, {"x": np.eye(size).reshape(probe_shape), "request": request})
    resized = np.asarray(output)
    return np.moveaxis(resized, axis, 0).reshape(resized.shape[axis], size)


def _tensor_type(values: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(values.dtype)
