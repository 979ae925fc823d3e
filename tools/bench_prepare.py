"""Time preparing a real model's training step: load, shapes, autodiff, sizes and costs, up to the solver's problem.

Exports torchvision's ResNet-50 (BatchNorm kept) at batch 8, 224x224 with each of PyTorch's exporters, then
prepares its training step several times and prints the median of each phase.

    python tools/bench_prepare.py [--model resnet50] [--batch 8] [--size 224] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from real_model_zoo import EXPORTERS, import_torchvision

from onnx_remat.core.devices import get_devices
from onnx_remat.pipeline import TrainingOptions, costed_problem, prepare


def export(name: str, exporter: str, batch: int, size: int, path: Path) -> Path:
    """The torchvision model with random weights, BatchNorm kept as a node."""
    module = getattr(import_torchvision().models, name)(weights=None).eval()
    example = (torch.randn(batch, 3, size, size),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, example, str(path), dynamo=False, do_constant_folding=False,
                              input_names=["input"], output_names=["output"])
        else:
            torch.onnx.export(module, example, dynamo=True, optimize=False, input_names=["input"],
                              output_names=["output"]).save(str(path))
    return path


def phases(path: Path) -> dict[str, float]:
    """Seconds of preparing the training step (load, shapes, autodiff) and of building the costed problem."""
    start = time.perf_counter()
    prepared = prepare(path, "train", training=TrainingOptions(loss="cross-entropy"))
    middle = time.perf_counter()
    graph = costed_problem(prepared, get_devices(None))
    end = time.perf_counter()
    return {"prepare": middle - start, "problem": end - middle, "total": end - start,
            "operators": graph.problem.num_ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"| {args.model} batch {args.batch} {args.size}x{args.size} | operators | load+shapes+autodiff s "
          "| sizes+costs+problem s | total s (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for exporter in EXPORTERS:
            path = export(args.model, exporter, args.batch, args.size, Path(folder) / f"{exporter}.onnx")
            runs = [phases(path) for _ in range(args.repeats)]
            median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            print(f"| {exporter} | {median['operators']:.0f} | {median['prepare']:.2f} | {median['problem']:.2f} "
                  f"| {median['total']:.2f} |")


if __name__ == "__main__":
    main()
