"""Builders for the paper's networks and more, with onnx.helper and numpy only (no torch).

Every builder returns an opset-17, IR-version-10 float32 `onnx.ModelProto` with graph input `input`,
graph output `output`, readable unique node names and seeded random weights; `batch=None` gives a
symbolic batch dimension `batch`. Defaults are small; the paper's sizes are reachable by arguments.

- `vgg16`, `vgg19`: 3x3 conv + ReLU stages, max pools, three FC layers
- `resnet18`, `resnet34`: BasicBlocks, `resnet50`: Bottlenecks, with inference-form BatchNormalization
- `unet`: the XEngine paper's U-Net (Fig. 6): conv-InstanceNorm-LeakyReLU blocks, Concat skips
- `mobilenet_v2`: inverted residuals, depthwise convolutions, Clip as ReLU6
- `transformer_encoder`: post-LayerNorm multi-head attention + GELU feed-forward layers
- `wavenet`: dilated causal 1-D convolutions with skip outputs summed after the stack

`FIXTURES` is the directory of small models exported from PyTorch by tools/export_fixtures.py:
`resnet18_small.onnx`, `unet_small.onnx`, `transformer_small.onnx`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx

from .mobilenet import build_mobilenet_v2
from .resnet import build_resnet18, build_resnet34, build_resnet50
from .transformer import build_transformer_encoder
from .unet import build_unet
from .vgg import build_vgg16, build_vgg19
from .wavenet import build_wavenet

FIXTURES = Path(__file__).parent / "fixtures"

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "vgg16": build_vgg16,
    "vgg19": build_vgg19,
    "resnet18": build_resnet18,
    "resnet34": build_resnet34,
    "resnet50": build_resnet50,
    "unet": build_unet,
    "mobilenet_v2": build_mobilenet_v2,
    "transformer_encoder": build_transformer_encoder,
    "wavenet": build_wavenet,
}


def build(name: str, **kwargs: object) -> onnx.ModelProto:
    """Build the registered model `name` with the builder's keyword arguments."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name](**kwargs)


__all__ = [
    "FIXTURES",
    "MODELS",
    "build",
    "build_mobilenet_v2",
    "build_resnet18",
    "build_resnet34",
    "build_resnet50",
    "build_transformer_encoder",
    "build_unet",
    "build_vgg16",
    "build_vgg19",
    "build_wavenet",
]
