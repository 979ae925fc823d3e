"""Hugging Face transformers models, as a user has them, through the command line: export, rewrite, run.

Builds tiny random-weight models from `transformers`' own classes: encoders (BERT, DistilBERT, RoBERTa, ALBERT,
DeBERTa-v2, ELECTRA, MPNet, with a padding mask; the T5 encoder; FNet, whose token mixing is torch.fft.fftn), decoders
(GPT-2, Llama and Mistral with grouped-query attention, GPT-NeoX, Phi, Qwen2, Gemma, OPT, BLOOM, Falcon; Qwen3,
Phi-3's fused qkv, Gemma 2 and 3 with logit soft-capping and sliding windows, OLMo 2, StableLM, GPT-BigCode's
multi-query attention, GPT-J's interleaved rotary), sparse mixtures of experts (Qwen3-MoE, Mixtral: top-k routing, the
experts gathered per token by transformers' "batched_mm" experts implementation, whose shapes do not depend on the
routing; its default, grouped_mm, fails in both exporters, the legacy one at its token count, aten::histc),
state-space and recurrent decoders (Mamba's selective scan and Mamba-2's chunked segment sums, their reference PyTorch
paths; RWKV), encoder-decoders (BART, Whisper, T5), vision (ViT, CLIP's vision tower, DINOv2, ConvNeXt, Swin, Swin V2,
SegFormer, MobileViT, PoolFormer, ResNet) and audio (wav2vec 2.0); 2 layers or stages, width 64 or less, batch 2, 16
tokens or 32x32 images. It exports each with both PyTorch exporters (every dropout probability zero, so outputs
compare), then per model and mode runs `onnx-remat M.onnx OUT.onnx --mode MODE --budget min --time-limit T` and
`onnx-remat run OUT.onnx --devices cpu --check --repeats 3`, and prints a markdown table: the rewrite's exit code and
wall seconds, the nodes recomputed, run's predicted and measured peak against the budget, its verdict and the largest
difference to the whole model.

`transformers` is a benchmark-only dependency (`pip install transformers`), never one of the package. Decoders get an
all-ones attention mask beside their tokens, as users export them: without one, transformers 5 looks for packed
sequences with `torch.diff`, which the legacy exporter cannot write (`aten::diff`).

    python tools/hf_models.py [--models gpt2,bert,llama] [--modes infer,train]
        [--time-limit 30] [--batch 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from command_rows import ALIGNMENT, HEADER, output_folder, row
from real_model_zoo import import_torchvision

BATCH, TOKENS, VOCAB = 2, 16, 500
Built = tuple[torch.nn.Module, dict[str, torch.Tensor]]
ESCAPE = r"\x1b\[[0-9;]*m"
"""A terminal colour code: the dynamo exporter colours its error messages."""


def _models(batch: int = BATCH) -> dict[str, Callable[[], Built]]:
    """Name -> a builder of (model, named example inputs of `batch` rows)."""
    import_torchvision()  # transformers imports torchvision, whose compiled ops need their schemas first
    import transformers as hf

    def tokens() -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(0, VOCAB, (batch, TOKENS))}

    def causal() -> dict[str, torch.Tensor]:
        """Tokens and an all-ones attention mask, as users export decoders: without a mask, transformers 5 looks for
        packed sequences with torch.diff, which the legacy exporter cannot write (aten::diff)."""
        ids = tokens()["input_ids"]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def padded() -> dict[str, torch.Tensor]:
        mask = torch.ones(batch, TOKENS, dtype=torch.int64)
        mask[1, TOKENS * 5 // 8:] = 0
        return {**tokens(), "attention_mask": mask}

    def images() -> dict[str, torch.Tensor]:
        return {"pixel_values": torch.randn(batch, 3, 32, 32)}

    def seq2seq() -> dict[str, torch.Tensor]:
        return {**tokens(), "decoder_input_ids": torch.randint(0, VOCAB, (batch, TOKENS // 2))}

    def build(model_class: type, config: Any, inputs: Callable[[], dict[str, torch.Tensor]]) -> Built:
        return model_class(_without_dropout(config)), inputs()

    encoder = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 128}
    text = {**encoder, "vocab_size": VOCAB, "max_position_embeddings": 64}
    decoder = {**text, "num_key_value_heads": 2}
    two_by_two = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                  "d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": VOCAB,
                  "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
    return {
        "gpt2": lambda: build(hf.GPT2LMHeadModel, hf.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB,
                                                                n_positions=64), causal),
        "bert": lambda: build(hf.BertForSequenceClassification, hf.BertConfig(**text), padded),
        "llama": lambda: build(hf.LlamaForCausalLM, hf.LlamaConfig(**decoder), causal),
        "mistral": lambda: build(hf.MistralForCausalLM, hf.MistralConfig(**decoder, sliding_window=8), causal),
        "vit": lambda: build(hf.ViTForImageClassification,
                             hf.ViTConfig(**encoder, image_size=32, patch_size=8, num_labels=10), images),
        "t5_encoder": lambda: build(hf.T5EncoderModel, hf.T5Config(num_layers=2, num_heads=4, d_model=64, d_kv=16,
                                                                   d_ff=128, vocab_size=VOCAB), tokens),
        "distilbert": lambda: build(hf.DistilBertModel, hf.DistilBertConfig(
            n_layers=2, n_heads=4, dim=64, hidden_dim=128, vocab_size=VOCAB, max_position_embeddings=64), padded),
        "roberta": lambda: build(hf.RobertaModel, hf.RobertaConfig(**{**text, "max_position_embeddings": 66}), padded),
        "albert": lambda: build(hf.AlbertModel, hf.AlbertConfig(**text, embedding_size=32), padded),
        "deberta_v2": lambda: build(hf.DebertaV2Model, hf.DebertaV2Config(**text), padded),
        "electra": lambda: build(hf.ElectraModel, hf.ElectraConfig(**text, embedding_size=32), padded),
        "fnet": lambda: build(hf.FNetModel, hf.FNetConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64),
            tokens),
        "gpt_neox": lambda: build(hf.GPTNeoXForCausalLM, hf.GPTNeoXConfig(**text), causal),
        "phi": lambda: build(hf.PhiForCausalLM, hf.PhiConfig(**decoder), causal),
        "qwen2": lambda: build(hf.Qwen2ForCausalLM, hf.Qwen2Config(**decoder), causal),
        "gemma": lambda: build(hf.GemmaForCausalLM, hf.GemmaConfig(**decoder, head_dim=16), causal),
        "opt": lambda: build(hf.OPTForCausalLM, hf.OPTConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=64, ffn_dim=128, word_embed_proj_dim=64,
            vocab_size=VOCAB, max_position_embeddings=64), causal),
        "bloom": lambda: build(hf.BloomForCausalLM, hf.BloomConfig(n_layer=2, n_head=4, hidden_size=64,
                                                                   vocab_size=VOCAB), causal),
        "falcon": lambda: build(hf.FalconForCausalLM, hf.FalconConfig(num_hidden_layers=2, num_attention_heads=4,
                                                                      hidden_size=64, vocab_size=VOCAB), causal),
        "bart": lambda: build(hf.BartForConditionalGeneration, hf.BartConfig(**two_by_two, max_position_embeddings=64),
                              seq2seq),
        "whisper": lambda: build(hf.WhisperForConditionalGeneration, hf.WhisperConfig(
            **two_by_two, num_mel_bins=16, max_source_positions=16, max_target_positions=16),
            lambda: {"input_features": torch.randn(batch, 16, 32),
                     "decoder_input_ids": torch.randint(0, VOCAB, (batch, TOKENS // 2)),
                     "decoder_attention_mask": torch.ones(batch, TOKENS // 2, dtype=torch.int64)}),
        "clip_vision": lambda: build(hf.CLIPVisionModel, hf.CLIPVisionConfig(**encoder, image_size=32, patch_size=8),
                                     images),
        "wav2vec2": lambda: build(hf.Wav2Vec2Model, hf.Wav2Vec2Config(
            **encoder, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4), lambda: {"input_values": torch.randn(batch, 800)}),
        "convnext": lambda: build(hf.ConvNextForImageClassification, hf.ConvNextConfig(
            hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10, image_size=32), images),
        "swin": lambda: build(hf.SwinForImageClassification, hf.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10), images),
        "segformer": lambda: build(hf.SegformerForSemanticSegmentation, hf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5),
            images),
        "dinov2": lambda: build(hf.Dinov2Model, hf.Dinov2Config(**encoder, image_size=32, patch_size=8), images),
        "mobilevit": lambda: build(hf.MobileViTForImageClassification, hf.MobileViTConfig(
            image_size=32, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 24, 32, 40, 160],
            num_labels=10), images),
        "qwen3": lambda: build(hf.Qwen3ForCausalLM, hf.Qwen3Config(**decoder, head_dim=16), causal),
        "qwen3_moe": lambda: build(hf.Qwen3MoeForCausalLM, hf.Qwen3MoeConfig(
            **decoder, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            experts_implementation="batched_mm"), causal),
        "mixtral": lambda: build(hf.MixtralForCausalLM, hf.MixtralConfig(
            **decoder, num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm"), causal),
        "phi3": lambda: build(hf.Phi3ForCausalLM, hf.Phi3Config(**decoder, pad_token_id=0), causal),
        "gemma2": lambda: build(hf.Gemma2ForCausalLM, hf.Gemma2Config(
            **decoder, head_dim=16, sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
            causal),
        "gemma3": lambda: build(hf.Gemma3ForCausalLM, hf.Gemma3TextConfig(
            **decoder, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]), causal),
        "olmo2": lambda: build(hf.Olmo2ForCausalLM, hf.Olmo2Config(**decoder), causal),
        "stablelm": lambda: build(hf.StableLmForCausalLM, hf.StableLmConfig(**decoder), causal),
        "gpt_bigcode": lambda: build(hf.GPTBigCodeForCausalLM, hf.GPTBigCodeConfig(
            n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=64, multi_query=True), causal),
        "gptj": lambda: build(hf.GPTJForCausalLM, hf.GPTJConfig(n_layer=2, n_head=4, n_embd=64, rotary_dim=8,
                                                                vocab_size=VOCAB, n_positions=64), causal),
        "mamba": lambda: build(hf.MambaForCausalLM, hf.MambaConfig(
            num_hidden_layers=2, hidden_size=64, state_size=8, vocab_size=VOCAB), tokens),
        "mamba2": lambda: build(hf.Mamba2ForCausalLM, hf.Mamba2Config(
            num_hidden_layers=2, hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=1, chunk_size=8,
            vocab_size=VOCAB), tokens),
        "rwkv": lambda: build(hf.RwkvForCausalLM, hf.RwkvConfig(
            num_hidden_layers=2, hidden_size=64, attention_hidden_size=64, intermediate_size=128, vocab_size=VOCAB,
            context_length=64), tokens),
        "t5": lambda: build(hf.T5ForConditionalGeneration, hf.T5Config(
            num_layers=2, num_decoder_layers=2, num_heads=4, d_model=64, d_kv=16, d_ff=128, vocab_size=VOCAB,
            decoder_start_token_id=0), seq2seq),
        "mpnet": lambda: build(hf.MPNetModel, hf.MPNetConfig(**text), padded),
        "poolformer": lambda: build(hf.PoolFormerForImageClassification, hf.PoolFormerConfig(
            num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
            padding=[2, 1], num_labels=10), images),
        "hf_resnet": lambda: build(hf.ResNetForImageClassification, hf.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10), images),
        "swinv2": lambda: build(hf.Swinv2ForImageClassification, hf.Swinv2Config(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10), images),
    }


def _without_dropout(config: Any) -> Any:
    """`config` with every dropout probability, stochastic depth rate (Swin, SegFormer) and SpecAugment masking
    probability (wav2vec 2.0) zero: models that call functional dropout (OPT, BART) would otherwise export
    training-mode Dropout nodes, and the others draw their drops and masks in forward, which differ from run to run,
    so no two runs (nor an export and autograd) could be compared."""
    for key, value in config.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key or "drop_path" in key
                                         or key in ("layerdrop", "mask_time_prob", "mask_feature_prob")):
            setattr(config, key, 0.0)
    return config


class FirstOutput(torch.nn.Module):
    """The model's first output (logits, or the last hidden state) as a plain tensor, its inputs passed by name."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True)), return_dict=False)[0]


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to 2 for a while: the legacy exporter prints its graph from C++ when it fails."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def module(name: str, batch: int = BATCH) -> tuple[FirstOutput, dict[str, torch.Tensor]]:
    """The model `name` (seeded weights, no cache, every dropout off, in training mode) as the exporters see it, and
    its named example inputs. Every parameter gets seeded noise: initialized alike (LayerNorm's ones, zero biases),
    the legacy exporter writes them as one initializer, whose gradient is then no single parameter's."""
    torch.manual_seed(0)
    model, inputs = _models(batch)[name]()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.02)
    model.config.use_cache = False
    for part in model.modules():
        if isinstance(part, torch.nn.Dropout):
            part.p = 0.0
    model.train()
    return FirstOutput(model, list(inputs)), inputs


def export(name: str, exporter: str, path: Path, training: bool = False, batch: int = BATCH) -> str:
    """Write `name` with `exporter` ("legacy" or "dynamo") to `path`; "" or the exporter's error in one line. For
    `training` the dynamo exporter's optimizer is off: it stores weights transposed or sliced under new names and
    lifts constants into initializers, which a training step would train."""
    model, inputs = module(name, batch)
    extra = {"external_data": False, "optimize": not training} if exporter == "dynamo" else {}
    try:
        with _stdout_to_stderr():  # the exporter's progress lines and graph dumps stay out of the table
            torch.onnx.export(model, tuple(inputs.values()), str(path),
                              dynamo=exporter == "dynamo", input_names=list(inputs), output_names=["output"],
                              do_constant_folding=False, **extra)
    except Exception as error:  # noqa: BLE001  # the exporter's own failure is a row of the table
        return f"{type(error).__name__}: {re.sub(ESCAPE, '', str(error).splitlines()[0])[:120]}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--time-limit", type=float, default=30)
    parser.add_argument("--batch", type=int, default=BATCH, help="rows per input: at the default 2 the tensors are a "
                        "few KiB, near the measurement's resolution; 32 or more for memory figures")
    parser.add_argument("--out", type=Path, help="keep the exports and rewrites here (default: a temporary folder)")
    args = parser.parse_args()
    print("| model | exporter | mode | " + HEADER)
    print("| --- | --- | --- |" + ALIGNMENT)
    with output_folder(args.out) as folder:
        for name in args.models.split(",") if args.models else _models():
            for exporter in ("dynamo", "legacy"):
                path = folder / f"{name}_{exporter}.onnx"
                failed = export(name, exporter, path, batch=args.batch)
                for mode in args.modes.split(","):
                    cells = ["-", "-", "-", "-", "-", f"export failed: {failed}", "-"] if failed else \
                        row(path, mode, args.time_limit, folder)
                    print(f"| {name} | {exporter} | {mode} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
