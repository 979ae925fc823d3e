"""ResNet18 and ResNet34 (BasicBlocks) and ResNet50 (Bottlenecks), He et al., with inference-form BatchNormalization."""

from __future__ import annotations

import onnx

from ._layers import GraphBuilder, batch_dim

BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3), "resnet50": (3, 4, 6, 3)}
EXPANSION = {"resnet18": 1, "resnet34": 1, "resnet50": 4}
"""Output channels of a block per channel of its stage width: 4 for Bottlenecks."""
# Scale of each residual branch's last BatchNorm, so activations stay O(1) through the residual adds.
RESIDUAL_GAMMA = 0.2


def _basic_block(g: GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    """conv3x3-bn-relu-conv3x3-bn plus the identity (or a strided 1x1 conv-bn), then ReLU."""
    y = g.conv_bn(x, f"{name}.conv1", cin, cout, 3, stride, bn_name=f"{name}.bn1")
    y = g.conv_bn(y, f"{name}.conv2", cout, cout, 3, act=None, gamma=RESIDUAL_GAMMA, bn_name=f"{name}.bn2")
    if stride != 1 or cin != cout:
        x = g.conv_bn(x, f"{name}.downsample.0", cin, cout, 1, stride, act=None, bn_name=f"{name}.downsample.1")
    return g.op("Relu", [g.op("Add", [y, x], f"{name}.add")], f"{name}.relu")


def _bottleneck(g: GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    """conv1x1-bn-relu-conv3x3(stride)-bn-relu-conv1x1(4x)-bn plus the identity (or a 1x1 conv-bn), then ReLU."""
    width = cout // 4
    y = g.conv_bn(x, f"{name}.conv1", cin, width, 1, bn_name=f"{name}.bn1")
    y = g.conv_bn(y, f"{name}.conv2", width, width, 3, stride, bn_name=f"{name}.bn2")
    y = g.conv_bn(y, f"{name}.conv3", width, cout, 1, act=None, gamma=RESIDUAL_GAMMA, bn_name=f"{name}.bn3")
    if stride != 1 or cin != cout:
        x = g.conv_bn(x, f"{name}.downsample.0", cin, cout, 1, stride, act=None, bn_name=f"{name}.downsample.1")
    return g.op("Relu", [g.op("Add", [y, x], f"{name}.add")], f"{name}.relu")


def _build_resnet(name: str, batch: int | None, resolution: int, width: int, num_classes: int) -> onnx.ModelProto:
    """A torchvision-style ResNet; stage widths are width * (1, 2, 4, 8), times 4 at Bottleneck outputs."""
    g = GraphBuilder(name)
    x = g.conv_bn("input", "conv1", 3, width, 7, 2, bn_name="bn1")
    x = g.maxpool(x, "maxpool", kernel=3, stride=2, pad=1)
    cin = width
    for s, blocks in enumerate(BLOCKS[name]):
        cout = width * 2**s * EXPANSION[name]
        block = _bottleneck if EXPANSION[name] > 1 else _basic_block
        for k in range(blocks):
            stride = 2 if s > 0 and k == 0 else 1
            x = block(g, x, f"layer{s + 1}.{k}", cin, cout, stride)
            cin = cout
    x = g.classifier_head(x, cin, num_classes)
    b = batch_dim(batch)
    return g.model([b, 3, resolution, resolution], x, [b, num_classes])


def build_resnet18(
    batch: int | None = 1, resolution: int = 64, width: int = 16, num_classes: int = 10
) -> onnx.ModelProto:
    """ResNet18; the paper's size is resolution=224, width=64, num_classes=1000."""
    return _build_resnet("resnet18", batch, resolution, width, num_classes)


def build_resnet34(
    batch: int | None = 1, resolution: int = 64, width: int = 16, num_classes: int = 10
) -> onnx.ModelProto:
    """ResNet34; the paper's size is resolution=224, width=64, num_classes=1000."""
    return _build_resnet("resnet34", batch, resolution, width, num_classes)


def build_resnet50(
    batch: int | None = 1, resolution: int = 64, width: int = 16, num_classes: int = 10
) -> onnx.ModelProto:
    """ResNet50; the paper's size is resolution=224, width=64, num_classes=1000."""
    return _build_resnet("resnet50", batch, resolution, width, num_classes)
