"""MobileNetV2 (Sandler et al.): inverted residuals with depthwise convolutions, Clip as ReLU6."""

from __future__ import annotations

import onnx

from ._layers import GraphBuilder, batch_dim

# (expansion t, output channels c, repeats n, first stride s), as in the paper's Table 2.
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
RESIDUAL_GAMMA = 0.2


def _divisible(channels: float, divisor: int = 8) -> int:
    """Round to the nearest multiple of `divisor`, never below 90% of `channels` (torchvision's rule)."""
    rounded = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * channels else rounded


def _inverted_residual(g: GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int, expand: int) -> str:
    """1x1 expansion (if any), 3x3 depthwise, linear 1x1 projection, identity skip when shapes allow."""
    hidden, residual = cin * expand, stride == 1 and cin == cout
    y = g.conv_bn(x, f"{name}.expand", cin, hidden, 1, act="relu6") if expand != 1 else x
    y = g.conv_bn(y, f"{name}.depthwise", hidden, hidden, 3, stride, group=hidden, act="relu6")
    y = g.conv_bn(y, f"{name}.project", hidden, cout, 1, act=None, gamma=RESIDUAL_GAMMA if residual else 1.0)
    return g.op("Add", [x, y], f"{name}.add") if residual else y


def build_mobilenet_v2(
    batch: int | None = 1, resolution: int = 64, width_mult: float = 0.5, num_classes: int = 10
) -> onnx.ModelProto:
    """MobileNetV2; the paper's size is resolution=224, width_mult=1.0, num_classes=1000."""
    g = GraphBuilder("mobilenet_v2")
    cin = _divisible(32 * width_mult)
    x = g.conv_bn("input", "features.0", 3, cin, 3, 2, act="relu6")
    index = 1
    for expand, channels, repeats, first_stride in SETTINGS:
        cout = _divisible(channels * width_mult)
        for k in range(repeats):
            x = _inverted_residual(g, x, f"features.{index}", cin, cout, first_stride if k == 0 else 1, expand)
            cin, index = cout, index + 1
    last = _divisible(1280 * max(1.0, width_mult))
    x = g.conv_bn(x, f"features.{index}", cin, last, 1, act="relu6")
    x = g.classifier_head(x, last, num_classes)
    b = batch_dim(batch)
    return g.model([b, 3, resolution, resolution], x, [b, num_classes])
