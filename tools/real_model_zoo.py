"""Real architectures for the model matrix: torchvision networks and hand-written transformers and RNNs.

Shared by `tools/real_models.py` (the README's table) and `tests/test_real_models.py`. Each entry builds a
PyTorch module with seeded random weights and an example input at small sizes; `export` writes it with one of
PyTorch's two exporters, keeping BatchNorm as a node so the model can be trained (both exporters fold it into
Conv for a module in eval mode with constant folding on).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

EXPORTERS = ("legacy", "dynamo")
"""`torch.onnx.export(dynamo=False)` at opset 17, and the default `dynamo=True` (opset 18 and newer)."""


def import_torchvision():
    """torchvision 0.28's wheel is built against CUDA torch: define its two compiled ops' schemas first."""
    if not hasattr(import_torchvision, "lib"):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.lib = lib
    import torchvision

    return torchvision


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention written out: QKV projection, masked softmax, output projection."""

    def __init__(self, dim: int, heads: int, length: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(length, length, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SdpaSelfAttention(nn.Module):
    """Causal attention through F.scaled_dot_product_attention, as current models write it."""

    def __init__(self, dim: int, heads: int, length: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class EinsumSelfAttention(CausalSelfAttention):
    """The same attention with its products written as torch.einsum (exported as Einsum nodes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = torch.einsum("bhqk,bhkd->bqhd", scores.softmax(dim=-1), v)
        return self.proj(y.reshape(b, t, d))


class MhaSelfAttention(nn.Module):
    """Causal attention through nn.MultiheadAttention."""

    def __init__(self, dim: int, heads: int, length: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.register_buffer("mask", torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        return self.attn(x, x, x, attn_mask=self.mask[:t, :t], need_weights=False)[0]


class GptBlock(nn.Module):
    """Pre-norm decoder block: attention and a GELU MLP, each with a residual."""

    def __init__(self, attention: type[nn.Module], dim: int, heads: int, length: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = attention(dim, heads, length)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """A GPT-style decoder: token and position embeddings, causal blocks, final LayerNorm and LM head."""

    def __init__(self, attention: type[nn.Module], vocab: int = 50, dim: int = 32, heads: int = 4,
                 layers: int = 2, length: int = 16) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*(GptBlock(attention, dim, heads, length) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        position = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(position)
        return self.head(self.ln(self.blocks(x)))


class Bert(nn.Module):
    """A BERT-style encoder: embeddings, nn.TransformerEncoder with a padding mask, a pooled classifier."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, layers: int = 2, length: int = 16) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.norm = nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(dim, 3)

    def forward(self, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        position = torch.arange(ids.shape[1], device=ids.device)
        x = self.norm(self.tokens(ids) + self.positions(position))
        x = self.encoder(x, src_key_padding_mask=padding)
        return self.classifier(x[:, 0])


class Recurrent(nn.Module):
    """A sequence model: a two-layer LSTM or GRU over float features, a linear head on every step."""

    def __init__(self, cell: type[nn.Module], features: int = 8, hidden: int = 16, layers: int = 2,
                 bidirectional: bool = False) -> None:
        super().__init__()
        self.rnn = cell(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def _vision(name: str, **kwargs) -> Callable[[], nn.Module]:
    return lambda: getattr(import_torchvision().models, name)(weights=None, **kwargs)


def _vit() -> nn.Module:
    return import_torchvision().models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)


def _image() -> tuple[torch.Tensor, ...]:
    """64x64 keeps the last BatchNorm at 2x2: over 1x1 and batch 2, float32 training is ill-conditioned."""
    return (torch.randn(2, 3, 64, 64),)


def _small_image() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 32, 32),)


def _tokens() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 50, (2, 16)),)


def _tokens_and_padding() -> tuple[torch.Tensor, ...]:
    padding = torch.zeros(2, 16, dtype=torch.bool)
    padding[1, 12:] = True
    return torch.randint(0, 50, (2, 16)), padding


def _sequence() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 6, 8),)


@dataclass(frozen=True)
class Architecture:
    """A model of the matrix: how to build it, its example inputs, its training loss, and whether it is slow."""

    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    loss: str = "cross-entropy"
    slow: bool = False


ARCHITECTURES: dict[str, Architecture] = {
    "resnet18": Architecture(_vision("resnet18", num_classes=10), _image),
    "resnet50": Architecture(_vision("resnet50", num_classes=10), _image, slow=True),
    "mobilenet_v2": Architecture(_vision("mobilenet_v2", num_classes=10), _image, slow=True),
    "mobilenet_v3_small": Architecture(_vision("mobilenet_v3_small", num_classes=10), _image),
    "squeezenet1_1": Architecture(_vision("squeezenet1_1", num_classes=10), _image),
    "shufflenet_v2_x1_0": Architecture(_vision("shufflenet_v2_x1_0", num_classes=10), _image, slow=True),
    "vit": Architecture(_vit, _small_image),
    "gpt": Architecture(lambda: Gpt(CausalSelfAttention), _tokens, loss="mse"),
    "gpt_sdpa": Architecture(lambda: Gpt(SdpaSelfAttention), _tokens, loss="mse"),
    "gpt_mha": Architecture(lambda: Gpt(MhaSelfAttention), _tokens, loss="mse"),
    "gpt_einsum": Architecture(lambda: Gpt(EinsumSelfAttention), _tokens, loss="mse"),
    "bert": Architecture(Bert, _tokens_and_padding),
    "lstm": Architecture(lambda: Recurrent(nn.LSTM), _sequence, loss="mse"),
    "gru": Architecture(lambda: Recurrent(nn.GRU, bidirectional=True), _sequence, loss="mse"),
}

LARGE_ARCHITECTURES: dict[str, Architecture] = {
    "densenet121": Architecture(_vision("densenet121", num_classes=10), _image, slow=True),
}
"""Models for the scale benchmark (tools/bench_scale.py), outside the matrix: ~1700 operators to train."""


def architecture(name: str) -> Architecture:
    """The architecture of that name, from the matrix or the large models."""
    return ARCHITECTURES.get(name) or LARGE_ARCHITECTURES[name]


def make(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The architecture's module (seeded weights, eval mode, no dropout, BatchNorm statistics made non-trivial)
    and its example inputs."""
    torch.manual_seed(seed)
    module = architecture(name).build()
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # a random mask in the training step could not be compared with autograd
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.75, 1.25)
    with torch.no_grad():
        for p in module.parameters():
            # Exporters merge equal initializers: constant-initialised biases and norm weights, and the layers
            # nn.TransformerEncoder deep-copies from one, would each share one tensor (and one summed gradient).
            p.add_(torch.empty_like(p).uniform_(-0.1, 0.1) if p.numel() > 1 and bool((p == p.flatten()[0]).all())
                   else torch.empty_like(p).uniform_(-0.01, 0.01))
    return module.eval(), architecture(name).inputs()


def export(name: str, exporter: str, path: Path, seed: int = 0, batch: int | None = None,
           training: bool = False) -> Path:
    """Export the architecture to `path` with BatchNorm kept as a node (the dynamo exporter may write
    `path.data` beside it for the weights); `batch` repeats the example inputs to that many rows. For `training`
    the dynamo exporter's optimizer is off: it lifts constants (scales, mask fills) into initializers, which a
    training step would train, and stores weights transposed or packed under new names."""
    module, inputs = make(name, seed)
    if batch is not None:
        inputs = tuple(t.repeat(-(-batch // len(t)), *[1] * (t.dim() - 1))[:batch] for t in inputs)
    names = ["ids", "padding"] if name == "bert" else ["input"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=17, do_constant_folding=False,
                              input_names=names, output_names=["output"])
        else:
            # The dynamo exporter's optimizer fuses BatchNorm into Conv whatever the module's mode.
            batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
            program = torch.onnx.export(module, inputs, dynamo=True, input_names=names, output_names=["output"],
                                        optimize=not (batch_norm or training), verbose=False)
            program.save(str(path), external_data=True)
    return path
