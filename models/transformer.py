"""A post-LayerNorm transformer encoder stack (like torch.nn.TransformerEncoderLayer) in opset-17 ops:
MatMul/Add projections, multi-head attention through Reshape/Transpose, Softmax, LayerNormalization,
and GELU written with Erf (the Gelu op needs opset 20)."""

from __future__ import annotations

import numpy as np
import onnx

from ._layers import GraphBuilder, batch_dim


def _layernorm(g: GraphBuilder, x: str, name: str, d_model: int) -> str:
    """LayerNormalization over the last axis with random affine parameters."""
    scale, bias = g.small(f"{name}.weight", (d_model,), center=1.0), g.small(f"{name}.bias", (d_model,))
    return g.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=1e-5)


def _heads(g: GraphBuilder, x: str, name: str, perm: list[int]) -> str:
    """Split the last axis into heads ([b, s, h, d]) and transpose by `perm`."""
    return g.op("Transpose", [g.op("Reshape", [x, "heads.shape"], f"{name}.split")], f"{name}.heads", perm=perm)


def _attention(g: GraphBuilder, x: str, name: str, d_model: int, heads: int) -> str:
    """Multi-head scaled dot-product self-attention with an output projection."""
    q = _heads(g, g.linear(x, f"{name}.q_proj", d_model, d_model), f"{name}.q", [0, 2, 1, 3])
    k = _heads(g, g.linear(x, f"{name}.k_proj", d_model, d_model), f"{name}.k", [0, 2, 3, 1])
    v = _heads(g, g.linear(x, f"{name}.v_proj", d_model, d_model), f"{name}.v", [0, 2, 1, 3])
    scores = g.op("Mul", [g.op("MatMul", [q, k], f"{name}.scores"), "attention.scale"], f"{name}.scaled")
    probs = g.op("Softmax", [scores], f"{name}.softmax", axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v], f"{name}.context")], f"{name}.merge", perm=[0, 2, 1, 3])
    context = g.op("Reshape", [context, "model.shape"], f"{name}.concat_heads")
    return g.linear(context, f"{name}.out_proj", d_model, d_model)


def _gelu(g: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    erf = g.op("Erf", [g.op("Mul", [x, "gelu.inv_sqrt2"], f"{name}.scale")], f"{name}.erf")
    half = g.op("Mul", [g.op("Add", [erf, "gelu.one"], f"{name}.add_one"), "gelu.half"], f"{name}.half")
    return g.op("Mul", [x, half], name)


def _encoder_layer(g: GraphBuilder, x: str, name: str, d_model: int, heads: int, ffn: int) -> str:
    """Self-attention and a GELU feed-forward network, each with a residual add and LayerNorm after it."""
    x = g.op("Add", [x, _attention(g, x, f"{name}.self_attn", d_model, heads)], f"{name}.attn_residual")
    x = _layernorm(g, x, f"{name}.norm1", d_model)
    y = _gelu(g, g.linear(x, f"{name}.linear1", d_model, ffn, gain=2.0), f"{name}.gelu")
    x = g.op("Add", [x, g.linear(y, f"{name}.linear2", ffn, d_model)], f"{name}.ffn_residual")
    return _layernorm(g, x, f"{name}.norm2", d_model)


def build_transformer_encoder(
    batch: int | None = 1, seq_len: int = 32, d_model: int = 64, heads: int = 4, layers: int = 2, ffn_mult: int = 4
) -> onnx.ModelProto:
    """`layers` encoder layers on an input of embeddings [batch, seq_len, d_model]; output has the same shape."""
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
    g = GraphBuilder("transformer_encoder")
    g.const("heads.shape", np.array([0, 0, heads, d_model // heads], np.int64))
    g.const("model.shape", np.array([0, 0, d_model], np.int64))
    g.const("attention.scale", np.array((d_model // heads) ** -0.5, np.float32))
    g.const("gelu.inv_sqrt2", np.array(2**-0.5, np.float32))
    g.const("gelu.one", np.array(1.0, np.float32))
    g.const("gelu.half", np.array(0.5, np.float32))
    x = "input"
    for k in range(layers):
        x = _encoder_layer(g, x, f"layers.{k}", d_model, heads, d_model * ffn_mult)
    b = batch_dim(batch)
    return g.model([b, seq_len, d_model], x, [b, seq_len, d_model])
