"""The U-Net of the XEngine paper (Fig. 6): conv-InstanceNorm-LeakyReLU blocks, MaxPool down,
ConvTranspose up, Concat skips, and a final 1x1 convolution that outputs the segmentation mask."""

from __future__ import annotations

import onnx

from ._layers import GraphBuilder, batch_dim


def _block(g: GraphBuilder, x: str, name: str, cin: int, cout: int) -> str:
    """Twice: 3x3 convolution, InstanceNormalization, LeakyReLU."""
    for k in (1, 2):
        y = g.conv(x, f"{name}.conv{k}", cin, cout, 3)
        scale, bias = g.small(f"{name}.norm{k}.scale", (cout,), center=1.0), g.small(f"{name}.norm{k}.bias", (cout,))
        y = g.op("InstanceNormalization", [y, scale, bias], f"{name}.norm{k}", epsilon=1e-5)
        x, cin = g.op("LeakyRelu", [y], f"{name}.lrelu{k}", alpha=0.01), cout
    return x


def _up(g: GraphBuilder, x: str, name: str, cin: int, cout: int) -> str:
    """A 2x2, stride-2 transposed convolution that doubles the resolution."""
    w = g.weight(f"{name}.weight", (cin, cout, 2, 2), cin)
    return g.op("ConvTranspose", [x, w, g.small(f"{name}.bias", (cout,))], name, kernel_shape=[2, 2], strides=[2, 2])


def build_unet(
    batch: int | None = 1,
    resolution: int = 64,
    depth: int = 3,
    width: int = 8,
    in_channels: int = 3,
    num_classes: int = 2,
) -> onnx.ModelProto:
    """U-Net with `depth` poolings and skips (the paper has 3); level l has width * 2**l channels."""
    if resolution % 2**depth:
        raise ValueError(f"U-Net of depth {depth} needs a resolution divisible by {2**depth}, got {resolution}")
    g = GraphBuilder("unet")
    x, cin, skips = "input", in_channels, []
    for level in range(depth):
        x = _block(g, x, f"down{level}", cin, width * 2**level)
        skips.append(x)
        x, cin = g.maxpool(x, f"down{level}.pool"), width * 2**level
    x = _block(g, x, "bottleneck", cin, width * 2**depth)
    x = _up(g, x, "bottleneck.up", width * 2**depth, width * 2 ** (depth - 1))
    for level in reversed(range(depth)):
        x = g.op("Concat", [x, skips[level]], f"up{level}.concat", axis=1)
        x = _block(g, x, f"up{level}", width * 2 ** (level + 1), width * 2**level)
        if level > 0:
            x = _up(g, x, f"up{level}.up", width * 2**level, width * 2 ** (level - 1))
    x = g.conv(x, "head", width, num_classes, 1, bias=True)
    b = batch_dim(batch)
    return g.model([b, in_channels, resolution, resolution], x, [b, num_classes, resolution, resolution])
