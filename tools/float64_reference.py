"""onnx's reference runtime for float64 training steps (onnxruntime has no float64 Conv), with a Conv that fits in
memory.

onnx's reference Conv writes a dilated kernel out in full and unfolds the input over it: DeepLabV3's ASPP convolution
of dilation 36 (3x3 read as 73x73) over 960 channels allocates a 10 GB kernel and a 5 GB unfolded input, and the
check was killed out of memory. `Conv` here sums one kernel tap at a time: one output-sized product per tap.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops import op_conv


class Conv(op_conv.Conv):
    """Conv with explicit pads (NOTSET or VALID) as a sum over kernel taps; any other auto_pad runs onnx's own."""

    def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None,  # noqa: N803
             pads=None, strides=None):
        if auto_pad not in (None, "NOTSET", "VALID"):
            return super()._run(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides)
        rank = X.ndim - 2
        pads = [0] * 2 * rank if auto_pad == "VALID" or pads is None else pads
        return (convolve(X, W, B, dilations or [1] * rank, group or 1, pads, strides or [1] * rank),)


def convolve(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, dilations: list[int], group: int,
             pads: list[int], strides: list[int]) -> np.ndarray:
    """ONNX Conv of `x` (N, C, *spatial) by `w` (M, C/group, *kernel): for each kernel tap, the strided window of the
    padded input it reads, contracted with that tap's weights over the group's channels."""
    rank = x.ndim - 2
    padded = np.pad(x, [(0, 0), (0, 0), *zip(pads[:rank], pads[rank:], strict=True)])
    kernel = w.shape[2:]
    out = [(padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(rank)]
    grouped = padded.reshape(x.shape[0], group, x.shape[1] // group, *padded.shape[2:])
    weights = w.reshape(group, w.shape[0] // group, w.shape[1], *kernel)
    y = np.zeros((x.shape[0], group, w.shape[0] // group, *out), dtype=np.result_type(x, w))
    for tap in itertools.product(*(range(k) for k in kernel)):
        window = tuple(slice(t * d, t * d + s * (n - 1) + 1, s)
                       for t, d, s, n in zip(tap, dilations, strides, out, strict=True))
        y += np.einsum("goc,ngc...->ngo...", weights[(..., *tap)], grouped[(..., *window)])
    y = y.reshape(x.shape[0], w.shape[0], *out)
    return y if bias is None else y + bias.reshape(1, -1, *[1] * rank)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every graph output of `model`, by name, from onnx's reference runtime with this module's Conv."""
    values = ReferenceEvaluator(model, new_ops=[Conv]).run(None, feeds)
    return dict(zip([o.name for o in model.graph.output], values, strict=True))
