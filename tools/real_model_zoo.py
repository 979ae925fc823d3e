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
OPSET_23 = "dynamo23"
"""`dynamo=True` asked for opset 23, where it writes F.scaled_dot_product_attention as an Attention node and
nn.RMSNorm as RMSNormalization: for the architectures that name it."""
OPSET_13 = "legacy13"
"""`dynamo=False` at opset 13, the oldest the tool takes (older exports are still in use): for the architectures that
name it, converted up to opset 16 for training (MaxPool's and Gather's gradients accumulate with reduction="add")."""
ALL_EXPORTERS = (*EXPORTERS, OPSET_23, OPSET_13)


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


class RmsNorm(nn.Module):
    """RMSNorm written out, as Llama's code does: x * rsqrt(mean(x^2) + eps) * w (both exporters write it)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(length: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin tables of rotary position embeddings, (length, head_dim), each frequency twice."""
    frequencies = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(length).float(), frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension's halves, by slicing and concatenation."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class GroupedQueryAttention(nn.Module):
    """Llama's attention: bias-free projections, rotary embeddings on q and k, fewer key/value heads than query
    heads, causal scaled_dot_product_attention. `gqa` says how the key/value heads are repeated to match: "expand"
    (+reshape, Hugging Face's repeat_kv), "interleave" (repeat_interleave), or "sdpa" (by scaled_dot_product_attention
    itself, enable_gqa=True, which the legacy exporter refuses)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, length: int, gqa: str) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.gqa = gqa
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        cos, sin = rotary_tables(length, self.head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(b, kv_heads, t, h) -> (b, heads, t, h), each key/value head serving heads // kv_heads query heads."""
        groups = self.heads // self.kv_heads
        if self.gqa == "interleave":
            return x.repeat_interleave(groups, dim=1)
        b, _, t, h = x.shape
        return x[:, :, None].expand(b, self.kv_heads, groups, t, h).reshape(b, self.heads, t, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).reshape(b, t, 2 * self.kv_heads, self.head_dim).transpose(1, 2).chunk(2, dim=1)
        cos, sin = self.cos[:t], self.sin[:t]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.gqa == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, self.repeat_kv(k), self.repeat_kv(v), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class SwiGlu(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), bias-free."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, grouped-query attention, RMSNorm, an MLP, each with a residual."""

    def __init__(self, mlp: nn.Module, norm: Callable[[int], nn.Module], dim: int, heads: int, kv_heads: int,
                 length: int, gqa: str) -> None:
        super().__init__()
        self.norm1 = norm(dim)
        self.attn = GroupedQueryAttention(dim, heads, kv_heads, length, gqa)
        self.norm2 = norm(dim)
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Llama(nn.Module):
    """A Llama-style decoder: token embedding (no position embedding), blocks with rotary grouped-query attention
    and a SwiGLU MLP (or `mlp`), a final RMSNorm and an LM head, tied to the embedding or not."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2,
                 length: int = 16, tied: bool = False, gqa: str = "expand",
                 norm: Callable[[int], nn.Module] = RmsNorm,
                 mlp: Callable[[int], nn.Module] = lambda dim: SwiGlu(dim, 3 * dim)) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(LlamaBlock(mlp(dim), norm, dim, heads, kv_heads, length, gqa)
                                      for _ in range(layers)))
        self.norm = norm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.tokens(ids))))


class MixtureOfExperts(nn.Module):
    """A mixture-of-experts MLP written the dense way exporters handle: a router's softmax, its top-2 renormalised,
    every expert on every token, combined by a gate mask scattered from the top-2 indices (`combine` "scatter"),
    built by one_hot ("one_hot"), or the top-2 experts' outputs gathered by index ("gather")."""

    def __init__(self, dim: int, experts: int = 4, hidden: int = 48, top: int = 2, combine: str = "scatter") -> None:
        super().__init__()
        self.top, self.combine = top, combine
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(SwiGlu(dim, hidden) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probabilities = self.router(x).softmax(dim=-1)
        weights, index = probabilities.topk(self.top, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        outputs = torch.stack([expert(x) for expert in self.experts], dim=-2)  # (b, t, experts, d)
        if self.combine == "gather":
            chosen = outputs.gather(-2, index.unsqueeze(-1).expand(*index.shape, outputs.shape[-1]))
            return (chosen * weights.unsqueeze(-1)).sum(dim=-2)
        if self.combine == "one_hot":
            gates = (F.one_hot(index, len(self.experts)).to(x.dtype) * weights.unsqueeze(-1)).sum(dim=-2)
        else:
            gates = torch.zeros_like(probabilities).scatter(-1, index, weights)
        return (outputs * gates.unsqueeze(-1)).sum(dim=-2)


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """Whisper's sinusoidal position table, (length, dim): sines then cosines of geometric timescales."""
    increment = math.log(10000) / (dim // 2 - 1)
    scales = torch.exp(-increment * torch.arange(dim // 2).float())
    angles = torch.arange(length).float()[:, None] * scales[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class EncoderAttention(nn.Module):
    """Whisper's attention: separate q, k (bias-free) and v projections, unmasked scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (self.q(x), self.k(x),
                                                                                        self.v(x)))
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))


class WhisperBlock(nn.Module):
    """Pre-norm encoder block: LayerNorm, attention, LayerNorm, a GELU MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = EncoderAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class WhisperEncoder(nn.Module):
    """A Whisper-style audio encoder: two Conv1d with GELU over log-mel frames (the second halving them),
    sinusoidal positions, pre-norm blocks (attention, GELU MLP), a final LayerNorm."""

    def __init__(self, mels: int = 16, dim: int = 32, heads: int = 4, layers: int = 2, frames: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.register_buffer("positions", sinusoids(frames // 2, dim))
        self.layers = nn.ModuleList(WhisperBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Recurrent(nn.Module):
    """A sequence model: a two-layer LSTM, GRU or RNN over float features, a linear head on every step."""

    def __init__(self, cell: Callable[..., nn.Module], features: int = 8, hidden: int = 16, layers: int = 2,
                 bidirectional: bool = False) -> None:
        super().__init__()
        self.rnn = cell(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


class VitEncoder(nn.Module):
    """A ViT written with nn.TransformerEncoder: conv patches, class token, pre-norm GELU layers, a linear head."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2, patch: int = 8, image: int = 32) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.positions = nn.Parameter(torch.zeros(1, 1 + (image // patch) ** 2, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.head(self.encoder(x)[:, 0])


class T5Block(nn.Module):
    """A T5-style encoder block: RMSNorm before bias-free attention and a ReLU MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, bias=False, batch_first=True)
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.ReLU(), nn.Linear(2 * dim, dim, bias=False))

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class T5Encoder(nn.Module):
    """RMSNorm encoder over padded token ids (Embedding with padding_idx, the mask from the ids by masked_fill),
    pooled by a masked mean, a cumulative sum and the mean of the top-k features."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim, padding_idx=0)
        self.blocks = nn.ModuleList(T5Block(dim, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.head = nn.Linear(3 * dim, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        padding = ids == 0
        x = self.tokens(ids)
        for block in self.blocks:
            x = block(x, padding)
        x = self.norm(x).masked_fill(padding.unsqueeze(-1), 0.0)
        mean = x.sum(1) / (~padding).sum(1, keepdim=True).to(x.dtype)
        running = x.cumsum(1)[:, -1]
        top = x.topk(4, dim=1).values.mean(1)
        return self.head(torch.cat([mean, running, top], dim=-1))


class ConvDecoder(nn.Module):
    """Conv1d over a sequence decoded to an image: ConvTranspose2d, GroupNorm, PReLU, InstanceNorm, a channel shuffle,
    PixelShuffle, bilinear and nearest upsampling, adaptive pooling to 4x4 (the legacy exporter refuses sizes that
    do not divide the input's)."""

    def __init__(self, features: int = 8, channels: int = 16) -> None:
        super().__init__()
        self.sequence = nn.Conv1d(features, channels, 3, padding=1)
        self.up = nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1)
        self.group = nn.GroupNorm(4, channels)
        self.prelu = nn.PReLU(channels)
        self.instance = nn.InstanceNorm2d(channels, affine=True)
        self.expand = nn.Conv2d(channels, 4 * channels, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)
        self.bilinear = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.pool = nn.AdaptiveAvgPool2d((4, 4))
        self.head = nn.Linear(16 * channels, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = F.relu(self.sequence(x.transpose(1, 2)))
        x = x.reshape(b, x.shape[1], 4, 4)
        x = self.prelu(self.group(self.up(x)))
        x = x.reshape(b, 4, -1, 8, 8).transpose(1, 2).reshape(b, -1, 8, 8)
        x = self.shuffle(self.expand(self.instance(x)))
        x = self.nearest(self.bilinear(x))
        return self.head(self.pool(x).flatten(1))


class OneOp(nn.Module):
    """A linear layer, one function that exporters may write as a single ONNX op, and a linear head: the op's input
    and output both carry gradients (for the one-op scan of the gradient rules)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], hidden: int = 12, head: int | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.inner = nn.Linear(8, hidden)
        self.head = nn.Linear(head or hidden, 4)  # head: the op's output features, if not `hidden`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fn(self.inner(x)))


class OneImageOp(nn.Module):
    """The same around an op on images: a 3x3 convolution to 6 channels, the op, a linear head."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fn(self.conv(x)).flatten(1))


def _aspp_head() -> nn.Module:
    """DeepLabV3's head on MobileNetV3's activations, small: a convolution, BatchNorm (eps 1e-3) and HardSwish, then
    torchvision's ASPP (dilations 12, 24 and 36 over a 6x6 map; a pooled branch whose BatchNorm sees 2 values, resized
    back to 6x6; dropout), HardSigmoid. Over 2 values BatchNorm is ill-conditioned: the float64 training step matches
    autograd only if both compute with the exported file's float32 constants (tools/real_models.py)."""
    aspp = import_torchvision().models.segmentation.deeplabv3.ASPP(8, [12, 24, 36], 8)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, eps=1e-3), nn.Hardswish(), aspp,
                         nn.Hardsigmoid())


class LevitAttention(nn.Module):
    """LeViT's attention in small: a strided convolution to 3x3 tokens, BatchNorm, HardSwish; queries, keys and values
    from one linear layer with BatchNorm1d over the flattened tokens; scores scaled by `key_dim ** -0.5` (a Python
    float the exported file holds in float32) plus per-head biases gathered by a 2-D index buffer of relative offsets
    (repeated indices); HardSwish, a projection with BatchNorm1d, mean over tokens, BatchNorm1d over the 2 images."""

    def __init__(self, channels: int = 8, heads: int = 2, key_dim: int = 8) -> None:
        super().__init__()
        self.heads, self.key_dim, self.scale = heads, key_dim, key_dim ** -0.5
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, stride=2, padding=1), nn.BatchNorm2d(channels),
                                  nn.Hardswish())
        self.qkv = nn.Linear(channels, heads * 3 * key_dim, bias=False)
        self.qkv_norm = nn.BatchNorm1d(heads * 3 * key_dim)
        points = [(x, y) for x in range(3) for y in range(3)]
        offsets = sorted({(abs(a[0] - b[0]), abs(a[1] - b[1])) for a in points for b in points})
        self.attention_biases = nn.Parameter(torch.zeros(heads, len(offsets)))
        self.register_buffer("attention_bias_idxs", torch.tensor(
            [[offsets.index((abs(a[0] - b[0]), abs(a[1] - b[1]))) for b in points] for a in points]),
            persistent=False)
        self.act = nn.Hardswish()
        self.proj = nn.Linear(heads * key_dim, channels, bias=False)
        self.proj_norm = nn.BatchNorm1d(channels)
        self.head = nn.Sequential(nn.BatchNorm1d(channels), nn.Linear(channels, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.stem(x).flatten(2).transpose(1, 2)
        batch, count, _ = tokens.shape
        qkv = self.qkv_norm(self.qkv(tokens).flatten(0, 1)).reshape(batch, count, self.heads, 3, self.key_dim)
        q, k, v = qkv.permute(3, 0, 2, 1, 4)
        scores = q @ k.transpose(-2, -1) * self.scale + self.attention_biases[:, self.attention_bias_idxs]
        mixed = self.act((scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, count, -1))
        projected = self.proj_norm(self.proj(mixed).flatten(0, 1)).reshape(batch, count, -1)
        return self.head(projected.mean(1))


class GridSampler(nn.Module):
    """A convolution, then bilinear sampling at a learned grid (a spatial transformer's sampler), a linear head."""

    def __init__(self, align_corners: bool) -> None:
        super().__init__()
        self.align_corners = align_corners
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.grid = nn.Parameter(torch.rand(1, 4, 5, 2) * 2.2 - 1.1)  # some samples outside the image
        self.head = nn.Linear(6 * 4 * 5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.grid.expand(x.shape[0], -1, -1, -1)
        sampled = F.grid_sample(self.conv(x), grid, align_corners=self.align_corners)
        return self.head(sampled.flatten(1))


@torch.jit.script
def _tanh_steps(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Three steps of h = tanh(h W): a scripted loop, which the legacy exporter writes as a Loop of trip count 3."""
    for _ in range(3):
        h = torch.tanh(h @ weight)
    return h


class ScriptedLoop(nn.Module):
    """A linear layer, a scripted loop reading its own weight in every step, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 12)
        self.weight = nn.Parameter(torch.randn(12, 12) * 0.3)
        self.head = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_tanh_steps(self.inner(x), self.weight))


class Conditional(nn.Module):
    """A linear layer, torch.cond on the input's sign (the dynamo exporter writes an If whose branches read the
    layer's output and a parameter): ReLU scaled by a parameter only the true branch reads, or tanh; a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 12)
        self.scale = nn.Parameter(torch.randn(12))
        self.head = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return self.head(torch.cond(x.sum() > 0, lambda t: torch.relu(t) * self.scale, torch.tanh, (h,)))


class CondMLP(nn.Module):
    """An MLP with torch.cond in the middle: on a positive input sum another layer's ReLU times `scale`, else tanh
    (tests/test_autodiff_control_flow.py, tools/bench_cond.py; random_feeds' seed 0 at 2048 rows takes the first)."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, width), nn.Linear(width, width)
        self.c, self.d = nn.Linear(width, width), nn.Linear(width, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.b(torch.relu(self.a(x))))
        y = torch.cond(x.sum() > 0, lambda t: torch.relu(self.c(t)) * self.scale, torch.tanh, (h,))
        return self.d(torch.relu(y))


class InnerLoss(nn.Module):
    """Scores from a linear layer, then a loss inside the model (a scalar output, trained with loss "sum")."""

    def __init__(self, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], spatial: bool = False) -> None:
        super().__init__()
        self.loss, self.spatial = loss, spatial
        self.scores = nn.Linear(8, 5)
        self.register_buffer("labels", torch.tensor([[0, 4, 2], [1, 1, 3]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.scores(x)  # (2, 3, 5)
        if self.spatial:
            return self.loss(scores.transpose(1, 2), self.labels)  # (N, C, d) against (N, d)
        return self.loss(scores.flatten(0, 1), self.labels.flatten())


SCATTER_INDEX = torch.tensor([[1, 5, 7], [0, 11, 2]])


def _scatter(h: torch.Tensor) -> torch.Tensor:
    return h.scatter(1, SCATTER_INDEX, 2 * h[:, :3])


def _scatter_add(h: torch.Tensor) -> torch.Tensor:
    return h.scatter_add(1, torch.tensor([[1, 5, 1], [0, 0, 2]]), h[:, 3:6].exp())


def _squashed(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """fn on values squashed into (-0.9, 0.9), the domain of asin, acos and atanh."""
    return lambda h: fn(0.9 * torch.tanh(h))


def _op(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], nn.Module]:
    return lambda: OneOp(fn)


def _fftn_real(h: torch.Tensor) -> torch.Tensor:
    """FNet's token mixing: the real part of a 2-D DFT over sequence and hidden."""
    return torch.fft.fftn(h, dim=(1, 2)).real


def _low_pass(h: torch.Tensor) -> torch.Tensor:
    """A spectral layer: the signal's first 5 of 7 frequencies, back to 8 samples (the dynamo exporter cannot pad
    a complex tensor: no 12 samples from 5 frequencies)."""
    return torch.fft.irfft(torch.fft.rfft(h)[..., :5], n=8)


def _spectrogram(h: torch.Tensor) -> torch.Tensor:
    """Each row's magnitude spectrogram: 4-sample Hann frames every 2, reflect-padded (torch.stft's default)."""
    return torch.stft(h, 4, hop_length=2, window=torch.hann_window(4), return_complex=True).abs().flatten(1)


def _scanned(h: torch.Tensor) -> torch.Tensor:
    """torch's scan operator over the 12 features: a running tanh(carry + h_t) (the dynamo exporter writes a Scan)."""
    from torch._higher_order_ops.scan import scan

    def step(carry: torch.Tensor, column: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        carry = torch.tanh(0.5 * carry + column)
        return carry, carry.clone()

    return scan(step, torch.zeros_like(h[:, 0]), h.transpose(0, 1))[1].transpose(0, 1)


def _relu_rnn(*args, **kwargs) -> nn.Module:
    return nn.RNN(*args, nonlinearity="relu", **kwargs)


def _unpooled(h: torch.Tensor) -> torch.Tensor:
    pooled, indices = F.max_pool2d(h, 2, return_indices=True)
    return F.max_unpool2d(pooled, indices, 2)


def _image_op(make_fn: Callable[[], Callable[[torch.Tensor], torch.Tensor]]) -> Callable[[], nn.Module]:
    """A builder of OneImageOp around a fresh layer from `make_fn` (a layer's weights are the module's own)."""
    def build() -> nn.Module:
        module = OneImageOp(make_fn())
        module(torch.zeros(1, 3, 6, 6))  # sizes the lazy head
        return module
    return build


def _vision(name: str, **kwargs) -> Callable[[], nn.Module]:
    return lambda: getattr(import_torchvision().models, name)(weights=None, **kwargs)


def _without_stochastic_depth(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """`build`'s model with its stochastic depth off (swin_v2_t's builder fixes the rate): drawn in training mode,
    it would differ between the training step and autograd."""
    def built() -> nn.Module:
        model = build()
        for m in model.modules():
            if isinstance(m, import_torchvision().ops.StochasticDepth):
                m.p = 0.0
        return model
    return built


def _vit() -> nn.Module:
    return import_torchvision().models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)


def _swin() -> nn.Module:
    return import_torchvision().models.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        stochastic_depth_prob=0.0, num_classes=10)


def _maxvit() -> nn.Module:
    return import_torchvision().models.MaxVit(
        input_size=(64, 64), stem_channels=16, partition_size=2, block_channels=[16, 32], block_layers=[1, 1],
        head_dim=8, stochastic_depth_prob=0.0, num_classes=10)


class OutTensor(nn.Module):
    """A torchvision segmentation model's "out" tensor, not its dict of outputs (a training loss needs a tensor)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


class LastFlow(nn.Module):
    """RAFT's last flow estimate between two images after `updates` refinements (unrolled by the exporters), not the
    list of every estimate."""

    def __init__(self, model: nn.Module, updates: int = 2) -> None:
        super().__init__()
        self.model, self.updates = model, updates

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return self.model(first, second, num_flow_updates=self.updates)[-1]


def _raft_small() -> nn.Module:
    return LastFlow(import_torchvision().models.optical_flow.raft_small(weights=None))


def _segmentation(name: str, **kwargs) -> Callable[[], nn.Module]:
    return lambda: OutTensor(getattr(import_torchvision().models.segmentation, name)(
        weights=None, weights_backbone=None, num_classes=4, **kwargs))


def _video(name: str, **kwargs) -> Callable[[], nn.Module]:
    return lambda: getattr(import_torchvision().models.video, name)(weights=None, num_classes=10, **kwargs)


def _image() -> tuple[torch.Tensor, ...]:
    """64x64 keeps the last BatchNorm at 2x2: over 1x1 and batch 2, float32 training is ill-conditioned."""
    return (torch.randn(2, 3, 64, 64),)


def _small_image() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 32, 32),)


def _large_image() -> tuple[torch.Tensor, ...]:
    """224x224: AlexNet's features are then 6x6, the size its adaptive pooling asks for; the legacy exporter refuses
    an adaptive pooling whose output size does not divide its input's (1x1 at 64x64)."""
    return (torch.randn(2, 3, 224, 224),)


def _image_pair() -> tuple[torch.Tensor, ...]:
    """Two 128x128 frames: RAFT's correlation pyramid needs feature maps of 16x16 at least (1/8 of the image)."""
    return torch.randn(2, 3, 128, 128), torch.randn(2, 3, 128, 128)


def _clip() -> tuple[torch.Tensor, ...]:
    """A video clip, (batch, channels, 4 frames, 32, 32)."""
    return (torch.randn(2, 3, 4, 32, 32),)


def _tokens() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 50, (2, 16)),)


def _tokens_and_padding() -> tuple[torch.Tensor, ...]:
    padding = torch.zeros(2, 16, dtype=torch.bool)
    padding[1, 12:] = True
    return torch.randint(0, 50, (2, 16)), padding


def _inception_image() -> tuple[torch.Tensor, ...]:
    """Inception v3's smallest input."""
    return (torch.randn(2, 3, 75, 75),)


def _padded_tokens() -> tuple[torch.Tensor, ...]:
    """Token ids with id 0 as padding at the end of the second row."""
    ids = torch.randint(1, 50, (2, 16))
    ids[1, 12:] = 0
    return (ids,)


def _features() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 8),)


def _feature_rows() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 8),)


def _tiny_image() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 6, 6),)


def _sequence_16() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 16, 8),)


def _log_mel() -> tuple[torch.Tensor, ...]:
    """Log-mel-like frames, (batch, 16 mels, 32 frames): the log of positive energies."""
    return (torch.rand(2, 16, 32).clamp(min=1e-4).log10(),)


def _sequence() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 6, 8),)


@dataclass(frozen=True)
class Architecture:
    """A model of the matrix: how to build it, its example inputs, its training loss, whether it is slow, and the
    exporters that can write it."""

    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    loss: str = "cross-entropy"  # or "mse", or "sum" for a model whose output is its loss
    slow: bool = False
    exporters: tuple[str, ...] = EXPORTERS


ARCHITECTURES: dict[str, Architecture] = {
    "resnet18": Architecture(_vision("resnet18", num_classes=10), _image, exporters=(*EXPORTERS, OPSET_13)),
    "resnet50": Architecture(_vision("resnet50", num_classes=10), _image, slow=True),
    "mobilenet_v2": Architecture(_vision("mobilenet_v2", num_classes=10), _image, slow=True),
    "mobilenet_v3_small": Architecture(_vision("mobilenet_v3_small", num_classes=10), _image),
    "squeezenet1_1": Architecture(_vision("squeezenet1_1", num_classes=10), _image),
    "shufflenet_v2_x1_0": Architecture(_vision("shufflenet_v2_x1_0", num_classes=10), _image, slow=True),
    "vit": Architecture(_vit, _small_image),
    "gpt": Architecture(lambda: Gpt(CausalSelfAttention), _tokens, loss="mse", exporters=(*EXPORTERS, OPSET_13)),
    "gpt_sdpa": Architecture(lambda: Gpt(SdpaSelfAttention), _tokens, loss="mse"),
    "gpt_mha": Architecture(lambda: Gpt(MhaSelfAttention), _tokens, loss="mse"),
    "gpt_einsum": Architecture(lambda: Gpt(EinsumSelfAttention), _tokens, loss="mse"),
    "bert": Architecture(Bert, _tokens_and_padding),
    "lstm": Architecture(lambda: Recurrent(nn.LSTM), _sequence, loss="mse"),
    "gru": Architecture(lambda: Recurrent(nn.GRU, bidirectional=True), _sequence, loss="mse"),
    "conv_decoder": Architecture(ConvDecoder, _sequence_16, loss="mse"),
    # torch's legacy exporter has no aten::rms_norm at opset 17.
    "t5_encoder": Architecture(T5Encoder, _padded_tokens, exporters=("dynamo",)),
    "llama": Architecture(Llama, _tokens, loss="mse"),
    # nn.RMSNorm and enable_gqa, which the legacy exporter cannot write, and a tied head.
    "llama_tied": Architecture(lambda: Llama(tied=True, gqa="sdpa", norm=lambda d: nn.RMSNorm(d, eps=1e-6)),
                               _tokens, loss="mse", exporters=("dynamo", OPSET_23)),
    "moe": Architecture(lambda: Llama(tied=True, gqa="interleave", mlp=MixtureOfExperts), _tokens, loss="mse"),
    "moe_one_hot": Architecture(lambda: Llama(mlp=lambda d: MixtureOfExperts(d, combine="one_hot")), _tokens,
                                loss="mse"),
    "moe_gather": Architecture(lambda: Llama(mlp=lambda d: MixtureOfExperts(d, combine="gather")), _tokens,
                               loss="mse"),
    "whisper_encoder": Architecture(WhisperEncoder, _log_mel, loss="mse"),
}

LEGACY_ONLY = ("legacy",)
"""The dynamo exporter of PyTorch 2.13 (onnxscript 0.7.2's aten_conv3d) writes a bias-free Conv3d's zero bias with
shape [out_channels, 2], which onnxruntime refuses to run."""
DYNAMO_ONLY = ("dynamo",)
"""The legacy exporter cannot write sinh, cosh, asinh, acosh, atanh, a non-zero threshold, fold (Col2Im),
max_unpool, torch.fft, a complex torch.stft or torch's scan operator at opset 17; neither exporter writes
torch.cumprod (CumProd is opset 26)."""

MORE_ARCHITECTURES: dict[str, Architecture] = {
    "efficientnet_b0": Architecture(_vision("efficientnet_b0", num_classes=10, stochastic_depth_prob=0.0), _image),
    "convnext_tiny": Architecture(_vision("convnext_tiny", num_classes=10, stochastic_depth_prob=0.0), _image,
                                  slow=True),
    "regnet_y_400mf": Architecture(_vision("regnet_y_400mf", num_classes=10), _image),
    "mnasnet0_5": Architecture(_vision("mnasnet0_5", num_classes=10), _image),
    "googlenet": Architecture(_vision("googlenet", num_classes=10, aux_logits=False, init_weights=False), _image),
    "inception_v3": Architecture(_vision("inception_v3", num_classes=10, aux_logits=False, init_weights=False),
                                 _inception_image, slow=True),
    "resnext50_32x4d": Architecture(_vision("resnext50_32x4d", num_classes=10), _image, slow=True),
    "swin": Architecture(_swin, _small_image),
    "maxvit": Architecture(_maxvit, _image),
    "vit_encoder": Architecture(VitEncoder, _small_image),
    "shufflenet_v2_x0_5": Architecture(_vision("shufflenet_v2_x0_5", num_classes=10), _image),
    "regnet_x_400mf": Architecture(_vision("regnet_x_400mf", num_classes=10), _image),
    "mobilenet_v3_large": Architecture(_vision("mobilenet_v3_large", num_classes=10), _image),
    "lraspp_mobilenet_v3_large": Architecture(_segmentation("lraspp_mobilenet_v3_large"), _image, loss="mse"),
    "r3d_18": Architecture(_video("r3d_18"), _clip, slow=True, exporters=LEGACY_ONLY),
    "mc3_18": Architecture(_video("mc3_18"), _clip, slow=True, exporters=LEGACY_ONLY),
    "r2plus1d_18": Architecture(_video("r2plus1d_18"), _clip, slow=True, exporters=LEGACY_ONLY),
    "deeplabv3_mobilenet_v3_large": Architecture(_segmentation("deeplabv3_mobilenet_v3_large", aux_loss=False),
                                                 _image, loss="mse", slow=True),
    "fcn_resnet50": Architecture(_segmentation("fcn_resnet50", aux_loss=False), _image, loss="mse", slow=True),
}
"""Architectures beyond the matrix, for tools/real_models.py's table (`--more`): each takes 10-300 s to check (the
segmentation networks the longest: their float64 training step, judged where float32 fails or with `--float64`)."""

TRIED_ARCHITECTURES: dict[str, Architecture] = {
    "alexnet": Architecture(_vision("alexnet", num_classes=10), _large_image),
    # At 64x64 the legacy exporter refuses the adaptive pooling from 2x2 to 7x7 (see _large_image).
    "vgg11_bn": Architecture(_vision("vgg11_bn", num_classes=10), _image, slow=True, exporters=DYNAMO_ONLY),
    "wide_resnet50_2": Architecture(_vision("wide_resnet50_2", num_classes=10), _image, slow=True),
    "efficientnet_v2_s": Architecture(_vision("efficientnet_v2_s", num_classes=10, stochastic_depth_prob=0.0), _image,
                                      slow=True),
    "swin_v2_t": Architecture(_without_stochastic_depth(_vision("swin_v2_t", num_classes=10)), _image, slow=True),
    "raft_small": Architecture(_raft_small, _image_pair, loss="mse", slow=True),
}
"""torchvision architectures exported and rewritten through the command line (tools/real_models_cli.py) but not yet
through every check of tools/real_models.py (`--models NAME`): docs/measurements.md, "torchvision beyond the
matrix", says how far each got."""

OP_ARCHITECTURES: dict[str, Architecture] = {
    "op_cross_entropy": Architecture(lambda: InnerLoss(F.cross_entropy), _feature_rows, loss="sum"),
    "op_cross_entropy_spatial": Architecture(lambda: InnerLoss(
        lambda s, t: F.cross_entropy(s, t, torch.tensor([0.5, 1.0, 1.5, 2.0, 0.8], dtype=s.dtype), ignore_index=1),
        spatial=True),
        _feature_rows, loss="sum"),
    "op_cross_entropy_none": Architecture(lambda: InnerLoss(
        lambda s, t: F.cross_entropy(s, t, reduction="none", ignore_index=4).sum()), _feature_rows, loss="sum"),
    "op_nll_loss": Architecture(lambda: InnerLoss(
        lambda s, t: F.nll_loss(F.log_softmax(s, 1), t, reduction="sum")), _feature_rows, loss="sum"),
    "op_scatter": Architecture(_op(_scatter), _features, loss="mse"),
    "op_scatter_add": Architecture(_op(_scatter_add), _features, loss="mse"),
    "op_group_norm": Architecture(_image_op(lambda: nn.GroupNorm(3, 6)), _tiny_image, loss="mse"),
    "op_global_max_pool": Architecture(_image_op(lambda: nn.AdaptiveMaxPool2d(1)), _tiny_image, loss="mse"),
    "op_local_response_norm": Architecture(_image_op(lambda: nn.LocalResponseNorm(3)), _tiny_image, loss="mse"),
    "op_normalize": Architecture(_op(lambda h: F.normalize(h, dim=1)), _features, loss="mse"),
    "op_tan": Architecture(_op(lambda h: torch.tan(0.5 * h)), _features, loss="mse"),
    "op_asin": Architecture(_op(_squashed(torch.asin)), _features, loss="mse"),
    "op_acos": Architecture(_op(_squashed(torch.acos)), _features, loss="mse"),
    "op_atan": Architecture(_op(torch.atan), _features, loss="mse"),
    "op_sinh": Architecture(_op(torch.sinh), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_cosh": Architecture(_op(torch.cosh), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_asinh": Architecture(_op(torch.asinh), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_acosh": Architecture(_op(lambda h: torch.acosh(1.5 + h * h)), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_atanh": Architecture(_op(_squashed(torch.atanh)), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_softsign": Architecture(_op(F.softsign), _features, loss="mse"),
    "op_softshrink": Architecture(_op(lambda h: F.softshrink(h, 0.3)), _features, loss="mse"),
    "op_hardshrink": Architecture(_op(lambda h: F.hardshrink(h, 0.3)), _features, loss="mse"),
    "op_threshold": Architecture(_op(lambda h: F.threshold(h, 0.1, 0.0)), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_prod": Architecture(_op(lambda h: h.reshape(2, 4, 3).prod(-1).repeat(1, 3)), _features, loss="mse"),
    "op_det": Architecture(lambda: OneOp(lambda h: torch.linalg.det(h.reshape(2, 3, 2, 2)), head=3), _features,
                           loss="mse"),
    "op_fold": Architecture(lambda: OneOp(lambda h: F.fold(h.reshape(2, 4, 9), (4, 4), 2).flatten(1), hidden=36,
                                          head=16), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_lp_pool": Architecture(_image_op(lambda: nn.LPPool2d(2, 2)), _tiny_image, loss="mse"),
    "op_max_unpool": Architecture(_image_op(lambda: _unpooled), _tiny_image, loss="mse", exporters=DYNAMO_ONLY),
    "op_rnn_tanh": Architecture(lambda: Recurrent(nn.RNN), _sequence, loss="mse"),
    "op_rnn_relu": Architecture(lambda: Recurrent(_relu_rnn, bidirectional=True), _sequence, loss="mse"),
    "op_grid_sample": Architecture(lambda: GridSampler(align_corners=False), _tiny_image, loss="mse"),
    "op_grid_sample_aligned": Architecture(lambda: GridSampler(align_corners=True), _tiny_image, loss="mse"),
    "op_fft": Architecture(_op(lambda h: torch.fft.fft(h).imag), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_rfft": Architecture(lambda: OneOp(lambda h: torch.view_as_real(torch.fft.rfft(h)).flatten(1), head=14),
                            _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_fftn": Architecture(_op(_fftn_real), _feature_rows, loss="mse", exporters=DYNAMO_ONLY),
    "op_irfft": Architecture(lambda: OneOp(_low_pass, head=8), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_stft": Architecture(lambda: OneOp(_spectrogram, head=21), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_scan": Architecture(_op(_scanned), _features, loss="mse", exporters=DYNAMO_ONLY),
    "op_scripted_loop": Architecture(ScriptedLoop, _features, loss="mse"),  # the dynamo exporter unrolls it itself
    "op_aspp": Architecture(_aspp_head, _tiny_image, loss="mse"),
    "op_levit_attention": Architecture(LevitAttention, _tiny_image, loss="mse"),
    "op_cond": Architecture(Conditional, _features, loss="mse", exporters=DYNAMO_ONLY),
}
"""One small module per op the gradient rules of issue 12 cover, for `tools/real_models.py --ops`: which exporter
writes the op, and whether the model trains."""

LARGE_ARCHITECTURES: dict[str, Architecture] = {
    "densenet121": Architecture(_vision("densenet121", num_classes=10), _image, slow=True),
}
"""Models for the scale benchmark (tools/bench_scale.py), outside the matrix: ~1700 operators to train."""


def architecture(name: str) -> Architecture:
    """The architecture of that name, from the matrix or the large models."""
    return (ARCHITECTURES.get(name) or MORE_ARCHITECTURES.get(name) or TRIED_ARCHITECTURES.get(name)
            or OP_ARCHITECTURES.get(name) or LARGE_ARCHITECTURES[name])


def make(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The architecture's module (seeded weights, eval mode, no dropout, BatchNorm statistics made non-trivial)
    and its example inputs."""
    torch.manual_seed(seed)
    module = architecture(name).build()
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # a random mask in the training step could not be compared with autograd
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
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
        if exporter in ("legacy", OPSET_13):
            torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=13 if exporter == OPSET_13 else 17,
                              do_constant_folding=False, input_names=names, output_names=["output"])
        else:
            # The dynamo exporter's optimizer fuses BatchNorm into Conv whatever the module's mode.
            batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
            program = torch.onnx.export(module, inputs, dynamo=True, input_names=names, output_names=["output"],
                                        optimize=not (batch_norm or training), verbose=False,
                                        opset_version=23 if exporter == OPSET_23 else None)
            program.save(str(path), external_data=True)
    return path
