"""Hugging Face transformers models, as a user has them, through the command line: export, rewrite, run.

Builds tiny random-weight models from `transformers`' own classes (GPT-2, BERT with a padding mask, Llama and
Mistral with grouped-query attention, ViT, the T5 encoder; 2 layers, width 64, batch 2, 16 tokens or 32x32 images),
exports each with both PyTorch exporters (dropout off, so outputs compare), then per model and mode runs
`onnx-remat M.onnx OUT.onnx --mode MODE --budget min --time-limit T` and `onnx-remat run OUT.onnx --devices cpu
--check --repeats 3`, and prints a markdown table: the rewrite's exit code and wall seconds, the nodes recomputed,
run's predicted and measured peak against the budget, its verdict and the largest difference to the whole model.

`transformers` is a benchmark-only dependency (`pip install transformers`), never one of the package. The legacy
exporter fails in PyTorch itself on the causal language models of transformers 5 (`aten::diff`); the table says so.

    python tools/hf_models.py [--models gpt2,bert,llama,mistral,vit,t5_encoder] [--modes infer,train]
        [--time-limit 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from real_model_zoo import import_torchvision

BATCH, TOKENS, VOCAB = 2, 16, 500


def _models() -> dict[str, Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]]:
    """Name -> a builder of (model, named example inputs)."""
    import_torchvision()  # transformers imports torchvision, whose compiled ops need their schemas first
    import transformers as hf

    def tokens() -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(0, VOCAB, (BATCH, TOKENS))}

    def padded() -> dict[str, torch.Tensor]:
        mask = torch.ones(BATCH, TOKENS, dtype=torch.int64)
        mask[1, TOKENS * 5 // 8:] = 0
        return {**tokens(), "attention_mask": mask}

    decoder = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
               "intermediate_size": 128, "vocab_size": VOCAB, "max_position_embeddings": 64}
    encoder = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 128}
    return {
        "gpt2": lambda: (hf.GPT2LMHeadModel(hf.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB,
                                                          n_positions=64)), tokens()),
        "bert": lambda: (hf.BertForSequenceClassification(hf.BertConfig(**encoder, vocab_size=VOCAB,
                                                                         max_position_embeddings=64)), padded()),
        "llama": lambda: (hf.LlamaForCausalLM(hf.LlamaConfig(**decoder)), tokens()),
        "mistral": lambda: (hf.MistralForCausalLM(hf.MistralConfig(**decoder, sliding_window=8)), tokens()),
        "vit": lambda: (hf.ViTForImageClassification(hf.ViTConfig(**encoder, image_size=32, patch_size=8,
                                                                   num_labels=10)),
                        {"pixel_values": torch.randn(BATCH, 3, 32, 32)}),
        "t5_encoder": lambda: (hf.T5EncoderModel(hf.T5Config(num_layers=2, num_heads=4, d_model=64, d_kv=16, d_ff=128,
                                                             vocab_size=VOCAB)), tokens()),
    }


class FirstOutput(torch.nn.Module):
    """The model's first output (logits, or the last hidden state) as a plain tensor."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs, return_dict=False)[0]


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


def export(name: str, exporter: str, path: Path) -> str:
    """Write `name` with `exporter` ("legacy" or "dynamo") to `path`; "" or the exporter's error in one line."""
    torch.manual_seed(0)
    model, inputs = _models()[name]()
    model.config.use_cache = False
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    extra = {"external_data": False} if exporter == "dynamo" else {}
    try:
        with _stdout_to_stderr():  # the exporter's progress lines and graph dumps stay out of the table
            torch.onnx.export(FirstOutput(model), tuple(inputs.values()), str(path), dynamo=exporter == "dynamo",
                              input_names=list(inputs), output_names=["output"], do_constant_folding=False,
                              **extra)
    except Exception as error:  # noqa: BLE001  # the exporter's own failure is a row of the table
        return f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return ""


def _cli(*arguments: str) -> tuple[int, float, str]:
    """`onnx-remat ARGUMENTS` beside this Python: exit code, wall seconds, stdout and stderr."""
    start = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("onnx-remat")), *arguments], capture_output=True,
                          text=True, check=False)
    return done.returncode, time.perf_counter() - start, done.stdout + done.stderr


def row(model: Path, mode: str, time_limit: float, folder: Path) -> list[str]:
    """One table row: the rewrite at the minimum budget, then `run --check` of it."""
    out, report = folder / f"{model.stem}.{mode}.onnx", folder / f"{model.stem}.{mode}.json"
    code, seconds, said = _cli(str(model), str(out), "--mode", mode, "--budget", "min", "--time-limit",
                               str(time_limit), "--report", str(report), "--force", "-q")
    if code != 0:
        return [str(code), f"{seconds:.1f}", "-", "-", "-", said.strip().splitlines()[-1][:80], "-"]
    recomputed = json.loads(report.read_text())["recomputed_nodes"]
    code, _, said = _cli("run", str(out), "--devices", "cpu", "--check", "--repeats", "3")
    peak = re.search(r"predicted peak ([\d.]+ \w+), measured peak ([\d.]+ \w+)(?: \(([^)]*)\))? \(budget ([\d.]+ \w+), "
                     r"([^)]*)\)", said)
    difference = re.search(r"largest difference to the whole model in onnxruntime: (\S+)", said)
    if peak is None:
        return ["0", f"{seconds:.1f}", str(recomputed), "-", "-", f"run exit {code}", "-"]
    spread = f" ({peak[3]})" if peak[3] else ""
    return ["0", f"{seconds:.1f}", str(recomputed), peak[1], f"{peak[2]}{spread} / {peak[4]}", peak[5],
            difference[1] if difference else "-"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,llama,mistral,vit,t5_encoder")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--time-limit", type=float, default=30)
    parser.add_argument("--out", type=Path, help="keep the exports and rewrites here (default: a temporary folder)")
    args = parser.parse_args()
    print("| model | exporter | mode | rewrite exit | s | recomputed nodes | run predicted | measured / budget "
          "| verdict | max diff |")
    print("| --- | --- | --- | --- | ---: | ---: | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.out or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            for exporter in ("dynamo", "legacy"):
                path = folder / f"{name}_{exporter}.onnx"
                failed = export(name, exporter, path)
                for mode in args.modes.split(","):
                    cells = ["-", "-", "-", "-", "-", f"export failed: {failed}", "-"] if failed else \
                        row(path, mode, args.time_limit, folder)
                    print(f"| {name} | {exporter} | {mode} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
