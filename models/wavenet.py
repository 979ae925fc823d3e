"""WaveNet-style stack: dilated causal convolutions whose skip outputs are summed after the stack.

Every layer's skip output stays alive until the final sum, so inference memory peaks in the middle
of the graph: the one bundled network whose inference, not only training, gains from recomputation.
"""

from __future__ import annotations

import onnx

from ._layers import GraphBuilder, batch_dim


def build_wavenet(
    batch: int | None = 1, length: int = 2048, channels: int = 16, skip_channels: int = 32, layers: int = 8
) -> onnx.ModelProto:
    """Gated dilated convolutions (dilation 1, 2, 4, ...), residual 1x1 convolutions, summed skips."""
    if min(length, channels, skip_channels, layers) <= 0:
        raise ValueError("length, channels, skip_channels and layers must be positive")
    g = GraphBuilder("wavenet")
    x = _conv1d(g, "input", "input_conv", 1, channels, 1)
    skips = []
    for k in range(layers):
        name, dilation = f"layer{k}", 2**k
        filt = g.op("Tanh", [_conv1d(g, x, f"{name}.filter", channels, channels, 2, dilation)], f"{name}.tanh")
        gate = g.op("Sigmoid", [_conv1d(g, x, f"{name}.gate", channels, channels, 2, dilation)], f"{name}.sigmoid")
        gated = g.op("Mul", [filt, gate], f"{name}.gated")
        skips.append(_conv1d(g, gated, f"{name}.skip", channels, skip_channels, 1))
        x = g.op("Add", [x, _conv1d(g, gated, f"{name}.residual", channels, channels, 1)], f"{name}.out")
    total = skips[0]
    for k, skip in enumerate(skips[1:], start=1):
        total = g.op("Add", [total, skip], f"skip_sum{k}")
    y = _conv1d(g, g.op("Relu", [total], "head.relu1"), "head.conv1", skip_channels, skip_channels, 1)
    y = _conv1d(g, g.op("Relu", [y], "head.relu2"), "head.conv2", skip_channels, 1, 1)
    n = batch_dim(batch)
    return g.model([n, 1, length], y, [n, 1, length])


def _conv1d(g: GraphBuilder, x: str, name: str, cin: int, cout: int, kernel: int, dilation: int = 1) -> str:
    """A causal 1-D convolution: left padding of (kernel - 1) * dilation keeps the length."""
    weight = g.weight(f"{name}.weight", (cout, cin, kernel), cin * kernel, gain=1.0)
    bias = g.small(f"{name}.bias", (cout,))
    return g.op("Conv", [x, weight, bias], name, kernel_shape=[kernel], dilations=[dilation],
                pads=[(kernel - 1) * dilation, 0])
