"""tools/float64_reference.py's Conv, which sums kernel taps instead of writing a dilated kernel out, against torch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from float64_reference import convolve  # noqa: E402

CONVS = [  # (input shape, weight shape, dilations, group, pads, strides)
    ((2, 4, 6, 6), (3, 4, 3, 3), [12, 12], 1, [12, 12, 12, 12], [1, 1]),  # ASPP: dilation wider than the map
    ((2, 6, 7, 5), (6, 1, 3, 3), [1, 2], 6, [1, 0, 2, 1], [2, 1]),  # depthwise, asymmetric pads, strided
    ((1, 4, 9), (6, 2, 2), [3], 2, [0, 1], [2]),  # grouped, 1-D
    ((1, 2, 4, 5, 3), (2, 2, 2, 3, 1), [1, 2, 1], 1, [1, 0, 0, 0, 2, 0], [1, 1, 2]),  # 3-D
]


def torch_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, dilations: list[int], group: int, pads: list[int],
               strides: list[int]) -> np.ndarray:
    rank = x.ndim - 2
    widths = [p for i in reversed(range(rank)) for p in (pads[i], pads[i + rank])]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    return conv(F.pad(torch.tensor(x), widths), torch.tensor(w), torch.tensor(b), stride=strides, dilation=dilations,
                groups=group).numpy()


@pytest.mark.parametrize(("x_shape", "w_shape", "dilations", "group", "pads", "strides"), CONVS)
def test_conv_equals_torch(x_shape: tuple[int, ...], w_shape: tuple[int, ...], dilations: list[int], group: int,
                           pads: list[int], strides: list[int]) -> None:
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    got = convolve(x, w, b, dilations, group, pads, strides)
    np.testing.assert_allclose(got, torch_conv(x, w, b, dilations, group, pads, strides), rtol=1e-12, atol=1e-12)
