"""Time loading a model and resolving every tensor's shape, on models exported by PyTorch's legacy exporter.

One row per model: nodes, node outputs ONNX shape inference alone leaves without a size, the seconds to load and
check the file (`load_model`), to resolve every shape (`resolve_shapes`: inference, folded shape subgraphs,
onnxruntime as the last resort) and to prepare the training step (load, shapes, autodiff, shapes again), each the
median of `--repeats`. ResNet-50 is exported at batch 8, 224x224 (the issue's preparation target); the other
architectures of `real_model_zoo` at its example inputs; ONNX files given by path as they are.

    python tools/bench_shapes.py
    python tools/bench_shapes.py --models resnet50,vit,gpt_mha,shufflenet_v2_x1_0 my_model.onnx
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import onnx
import torch
from real_model_zoo import export, make
from rich.console import Console
from rich.table import Table

from onnx_remat.passes.load import load_model, read_graph
from onnx_remat.passes.manager import to_proto
from onnx_remat.passes.shapes import is_concrete, resolve_shapes
from onnx_remat.pipeline import prepare

BATCHED_INPUT = {"resnet50": (8, 3, 224, 224)}
"""Architectures exported at a larger input than the zoo's example."""


def exported(name: str, folder: Path) -> Path:
    """The zoo's architecture exported by the legacy exporter, at BATCHED_INPUT's shape where it gives one."""
    path = folder / f"{name}.onnx"
    if name not in BATCHED_INPUT:
        return export(name, "legacy", path)
    module, _ = make(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(*BATCHED_INPUT[name]),), str(path), dynamo=False, opset_version=17,
                          do_constant_folding=False, input_names=["input"], output_names=["output"])
    return path


def median_seconds(work: Callable[[], object], repeats: int) -> float:
    """The median wall time of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def loaded(path: Path) -> onnx.ModelProto:
    """The model as the pipeline holds it before resolving shapes."""
    return to_proto(read_graph(path, {}))


def unknown_after_inference(model: onnx.ModelProto) -> int:
    """Node outputs that ONNX shape inference with data propagation leaves without a concrete shape."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    known = {v.name for v in [*inferred.graph.value_info, *inferred.graph.output] if is_concrete(v)}
    return sum(1 for node in model.graph.node for out in node.output if out and out not in known)


def row(label: str, path: Path, repeats: int) -> list[str]:
    model = loaded(path)
    load = median_seconds(lambda: load_model(path), repeats)
    resolve = median_seconds(lambda: resolve_shapes(model), repeats)
    train = median_seconds(lambda: prepare(path, mode="train"), repeats)
    return [label, str(len(model.graph.node)), str(unknown_after_inference(model)), f"{load:.2f}", f"{resolve:.2f}",
            f"{train:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="ONNX files to time as they are")
    parser.add_argument("--models", default="resnet50", help="zoo architectures, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table("model", "nodes", "unsized by inference", "load s", "resolve s", "train prepare s")
    with tempfile.TemporaryDirectory() as folder:
        for name in filter(None, args.models.split(",")):
            shape = "x".join(map(str, BATCHED_INPUT.get(name, ())))
            table.add_row(*row(f"{name} legacy {shape}".strip(), exported(name, Path(folder)), args.repeats))
        for path in args.paths:
            table.add_row(*row(str(path), path, args.repeats))
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
