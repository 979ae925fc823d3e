"""timm's vision models, as a user has them, through the command line and against PyTorch autograd.

Builds small random-weight models from `timm`'s own classes, one or two of each family (ResNet, ResNetV2 with weight
standardization, EfficientNet as TinyNet, MobileNetV3 and V4, ConvNeXt-V2 with GRN, ViT, DeiT distilled, Swin-V2,
MLP-Mixer, LeViT, PoolFormer, RegNet, MobileViT, EdgeNeXt, GhostNet-V2, NF-RegNet with ScaledStdConv, FastViT,
EVA-02 with rotary embeddings, TinyViT): one block a stage, narrow, batch 2, 32x32 images (64x64 where the model
downsamples further), every dropout and drop-path rate zero, BatchNorm statistics non-trivial. Each is exported in eval
mode with BatchNorm kept, as the README says (legacy `dynamo=False` at opset 17 without constant folding, and
`dynamo=True, optimize=False`), then for each mode and budget `onnx-remat M.onnx OUT.onnx --mode MODE --budget BUDGET`
(`--loss mse` and the module's frozen buffers in train mode) and `onnx-remat run OUT.onnx --devices cpu --check
--repeats 3` (tools/command_rows.py); and the training step's loss and gradients are compared with PyTorch autograd in
float64: the step in float32 within 1e-4, else (the model is ill-conditioned: BatchNorm over few values, PyTorch's own
float32 error as large) the step built in float64 and run by onnx's reference runtime within 1e-8.

`timm` is a benchmark-only dependency (`pip install timm==1.0.31`), never one of the package.

    python tools/timm_models.py [--models vit,resnet] [--exporters legacy,dynamo] [--modes infer,train]
        [--budgets min,50%] [--time-limit 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import torch
from command_rows import ALIGNMENT, HEADER, output_folder, report_path, row
from hf_grads import check_built_step
from hf_models import ESCAPE, _stdout_to_stderr
from real_model_zoo import import_torchvision
from real_models import (
    Outcome,
    frozen_in,
)
from torch import nn

from onnx_remat.core.errors import one_line

BATCH, CLASSES, LOSS = 2, 10, "mse"
EXPORTERS = ("legacy", "dynamo")


def _models() -> dict[str, tuple[Callable[[], nn.Module], int]]:
    """Name -> (a builder of the random-weight model, its input's side in pixels)."""
    import_torchvision()  # timm imports torchvision, whose compiled ops need their schemas first
    import timm
    from timm.models.metaformer import GroupNorm1, MetaFormer
    from timm.models.mlp_mixer import MlpMixer

    def create(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
        return lambda: timm.create_model(name, pretrained=False, num_classes=CLASSES, **kwargs)

    no_drop = {"drop_rate": 0.0, "drop_path_rate": 0.0}
    vit = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 64, "num_heads": 2, **no_drop}
    swin = {"img_size": 32, "patch_size": 2, "window_size": 4, "embed_dim": 16, "depths": (1, 1), "num_heads": (1, 2),
            **no_drop}
    return {
        "resnet": (create("resnet18", layers=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16, **no_drop), 32),
        "resnetv2": (create("resnetv2_50", layers=(1, 1, 1, 1), channels=(128, 128, 256, 256), stem_chs=32,
                            **no_drop), 32),
        "tinynet": (create("tinynet_e", **no_drop), 64),
        "mobilenetv3": (create("mobilenetv3_small_050", **no_drop), 64),
        "mobilenetv4": (create("mobilenetv4_conv_small_050", **no_drop), 64),
        "convnextv2": (create("convnextv2_atto", depths=(1, 1, 1, 1), dims=(16, 32, 64, 128), **no_drop), 32),
        "vit": (create("vit_tiny_patch16_224", **vit), 32),
        "deit": (create("deit_tiny_distilled_patch16_224", **vit), 32),
        "swinv2": (create("swinv2_tiny_window8_256", **swin), 32),
        "mixer": (lambda: MlpMixer(num_classes=CLASSES, img_size=32, patch_size=8, num_blocks=2, embed_dim=64,
                                   **no_drop), 32),
        "levit": (create("levit_128s", img_size=64, embed_dim=(32, 48, 64), depth=(1, 1, 1), num_heads=(2, 2, 2),
                         key_dim=8, **no_drop), 64),
        "poolformer": (lambda: MetaFormer(num_classes=CLASSES, depths=(1, 1, 1, 1), dims=(16, 32, 48, 64),
                                          downsample_norm=None, mlp_act=nn.GELU, mlp_bias=True, norm_layers=GroupNorm1,
                                          layer_scale_init_values=1e-5, res_scale_init_values=None,
                                          use_mlp_head=False, **no_drop), 32),
        "regnet": (create("regnetx_002", **no_drop), 64),
        "mobilevit": (create("mobilevit_xxs", **no_drop), 64),
        "edgenext": (create("edgenext_xx_small", depths=(1, 1, 1, 1), **no_drop), 64),
        "ghostnetv2": (create("ghostnetv2_100", drop_rate=0.0), 64),
        "nf_regnet": (create("nf_regnet_b0", **no_drop), 32),
        "fastvit": (create("fastvit_t8", **no_drop), 64),
        "eva": (create("eva02_tiny_patch14_224", **vit), 32),
        "tiny_vit": (create("tiny_vit_5m_224", depths=(1, 1, 1, 1), **no_drop), 64),
    }


def module(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The model `name` in eval mode (seeded weights, each parameter with seeded noise so that no two initializers are
    equal, which exporters would merge into one; BatchNorm statistics non-trivial) and its example input."""
    build, side = _models()[name]
    torch.manual_seed(0)
    model = build()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.02)
        for part in model.modules():
            if isinstance(part, nn.modules.batchnorm._BatchNorm):
                part.running_mean.uniform_(-0.1, 0.1)
                part.running_var.uniform_(0.75, 1.25)
    return model.eval(), torch.randn(BATCH, 3, side, side)


def export(name: str, exporter: str, path: Path) -> str:
    """Write `name` with `exporter` to `path`, in eval mode with BatchNorm kept; "" or the exporter's error in one
    line."""
    model, image = module(name)
    try:
        with warnings.catch_warnings(), _stdout_to_stderr():
            warnings.simplefilter("ignore")
            if exporter == "legacy":
                torch.onnx.export(model, (image,), str(path), dynamo=False, opset_version=17,
                                  do_constant_folding=False, input_names=["input"], output_names=["output"])
            else:
                torch.onnx.export(model, (image,), dynamo=True, optimize=False, input_names=["input"],
                                  output_names=["output"]).save(str(path), external_data=False)
    except Exception as error:  # noqa: BLE001  # the exporter's own failure is a row of the table
        return f"{type(error).__name__}: {re.sub(ESCAPE, '', str(error).splitlines()[0])[:120]}"
    return ""


def _with_named_input(model: nn.Module, image: torch.Tensor) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return model, {"input": image}


def check_gradients(name: str, exporter: str, path: Path) -> Outcome:
    """The training step's loss and gradients (mse on the logits) against autograd in float64; the step built in
    float64 where float32 exceeds twice PyTorch's own float32 error (or 1e-4)."""
    outcome = Outcome(name, exporter)
    try:
        check_built_step(lambda: _with_named_input(*module(name)), path, outcome)
    except Exception as error:  # noqa: BLE001  # every failure, the tool's own or a traceback, is a row
        outcome.errors.append(f"{type(error).__name__}: {one_line(error)[:160]}")
    return outcome


def gradient_cell(outcome: Outcome) -> str:
    """The gradient check in one cell: worst error, its precision, PyTorch's own float32 error, and any failure."""
    if outcome.gradient_error is None:
        return "-"
    cell = (f"{outcome.gradient_error:.1e} ({outcome.gradient_precision}, {outcome.gradients_compared} grads; "
            f"torch f32 {outcome.torch_float32_error:.1e})")
    return cell if not outcome.problems() else f"{cell} FAIL"


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def report_cell(report: Path, measured: str) -> str:
    """The report's predicted peak and the measured peak (`run`'s median, the cell "12.3 MiB (...) / budget") over
    it: issue 12 wants it within 10%; "-" where the rewrite failed."""
    figure = re.match(r"([\d.]+) (\w+)", measured)
    if not report.exists() or figure is None:
        return "-"
    predicted = json.loads(report.read_text())["predicted_peak_bytes"]
    return f"{predicted / 2**20:.2f} MiB ({float(figure[1]) * UNITS[figure[2]] / predicted:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--budgets", default="min,50%")
    parser.add_argument("--time-limit", type=float, default=30)
    parser.add_argument("--out", type=Path, help="keep the exports and rewrites here (default: a temporary folder)")
    args = parser.parse_args()
    print("| model | exporter | opset | nodes | mode | budget | " + HEADER
          + " report predicted (measured / it) | grad error | failure |")
    print("| --- | --- | ---: | ---: | --- | --- |" + ALIGNMENT + " --- | --- | --- |")
    with output_folder(args.out) as folder:
        for name in args.models.split(",") if args.models else _models():
            for exporter in args.exporters.split(","):
                path = folder / f"{name}_{exporter}.onnx"
                failed = export(name, exporter, path)
                if failed:
                    print(f"| {name} | {exporter} | - | - | - | - |" + " - |" * 10 + f" export failed: {failed} |",
                          flush=True)
                    continue
                proto = onnx.load(str(path), load_external_data=False)
                opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
                gradients = check_gradients(name, exporter, path) if "train" in args.modes else None
                for mode in args.modes.split(","):
                    options = ("--loss", LOSS, *(f for p in frozen_in(module(name)[0], path)
                                                  for f in ("--freeze", p))) if mode == "train" else ()
                    for budget in args.budgets.split(","):
                        cells = row(path, mode, args.time_limit, folder, budget, options)
                        cells.append(report_cell(report_path(path, mode, budget, folder), cells[4]))
                        grads = gradient_cell(gradients) if gradients and mode == "train" else "-"
                        failure = "; ".join(gradients.problems())[:160] if gradients and mode == "train" else ""
                        print(f"| {name} | {exporter} | {opset} | {len(proto.graph.node)} | {mode} | {budget} | "
                              + " | ".join(cells) + f" | {grads} | {failure} |", flush=True)


if __name__ == "__main__":
    main()
