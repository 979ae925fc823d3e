"""VGG16 and VGG19 (Simonyan and Zisserman): 3x3 conv + ReLU stacks, five max pools, three FC layers."""

from __future__ import annotations

import onnx

from ._layers import GraphBuilder, batch_dim

# Convolutions per stage; stage s has width * 2**min(s, 3) channels.
STAGES = {"vgg16": (2, 2, 3, 3, 3), "vgg19": (2, 2, 4, 4, 4)}


def _build_vgg(
    name: str, batch: int | None, resolution: int, width: int, fc_width: int, num_classes: int
) -> onnx.ModelProto:
    """A VGG with the given convolutions per stage; `resolution` must be a multiple of 32."""
    if resolution % 32:
        raise ValueError(f"VGG needs a resolution divisible by 32, got {resolution}")
    g = GraphBuilder(name)
    x, cin = "input", 3
    for s, convs in enumerate(STAGES[name], start=1):
        cout = width * 2 ** min(s - 1, 3)
        for k in range(1, convs + 1):
            x = g.op("Relu", [g.conv(x, f"features.conv{s}_{k}", cin, cout, 3, bias=True)], f"features.relu{s}_{k}")
            cin = cout
        x = g.maxpool(x, f"features.pool{s}")
    x = g.op("Flatten", [x], "flatten", axis=1)
    fin = cin * (resolution // 32) ** 2
    for k, fout in enumerate((fc_width, fc_width), start=6):
        x = g.op("Relu", [g.gemm(x, f"classifier.fc{k}", fin, fout)], f"classifier.relu{k}")
        fin = fout
    x = g.gemm(x, "classifier.fc8", fin, num_classes, gain=1.0)
    b = batch_dim(batch)
    return g.model([b, 3, resolution, resolution], x, [b, num_classes])


def build_vgg16(
    batch: int | None = 1, resolution: int = 32, width: int = 16, fc_width: int = 128, num_classes: int = 10
) -> onnx.ModelProto:
    """VGG16; the paper's size is resolution=224, width=64, fc_width=4096, num_classes=1000."""
    return _build_vgg("vgg16", batch, resolution, width, fc_width, num_classes)


def build_vgg19(
    batch: int | None = 1, resolution: int = 32, width: int = 16, fc_width: int = 128, num_classes: int = 10
) -> onnx.ModelProto:
    """VGG19; the paper's size is resolution=224, width=64, fc_width=4096, num_classes=1000."""
    return _build_vgg("vgg19", batch, resolution, width, fc_width, num_classes)
