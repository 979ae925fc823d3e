"""Measure each distinct node of a model alone in onnxruntime against the memory the problem predicts for it.

Every node is cut out into a one-node model (its float inputs as graph inputs, the rest as initializers holding
the values a run of the whole model gave them), run in a fresh process, and its activation peak measured
(`passes/measure.py`); predicted is its outputs plus the workspace model's scratch. Nodes with the same op,
attributes and input shapes are measured once. The table lists the largest misses first: where the workspace model
(`passes/workspace.py`) needs a rule.

    python tools/node_memory.py model.onnx --mode train --rows 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from rich.console import Console
from rich.table import Table

from onnx_remat.passes.execute import random_feeds, run
from onnx_remat.passes.measure import measure_activation_peak, predicted_activation_peak
from onnx_remat.pipeline import prepare

KIB = 1024


def node_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every node output's value in one run of the model on random inputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {output.name for output in probe.graph.output}
    names = [o for node in probe.graph.node for o in node.output if o and o not in declared]
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    feeds = random_feeds(model)
    outputs = [output.name for output in probe.graph.output]
    return {**feeds, **dict(zip(outputs, run(probe, feeds), strict=True))}


def alone(model: onnx.ModelProto, node: onnx.NodeProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """`node` as a one-node model: float activations as inputs, everything else as initializers."""
    weights = {init.name: init for init in model.graph.initializer}
    inputs, inits = [], []
    for name in dict.fromkeys(n for n in node.input if n):
        if name in weights:
            inits.append(weights[name])
        elif np.issubdtype(values[name].dtype, np.floating):
            inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(values[name].dtype), list(values[name].shape)))
        else:
            inits.append(numpy_helper.from_array(values[name], name))
    outputs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(values[o].dtype),
                                             list(values[o].shape)) for o in node.output if o]
    graph = helper.make_graph([node], "alone", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


def signature(node: onnx.NodeProto, values: dict[str, np.ndarray], weights: set[str]) -> tuple:
    """What a node's memory depends on: op, attributes and input shapes."""
    shapes = tuple(None if n not in values else values[n].shape for n in node.input if n not in weights)
    return node.op_type, tuple(a.SerializeToString() for a in node.attribute), shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--mode", choices=("infer", "train"), default="infer")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = prepare(args.model, args.mode).proto
    values = node_values(model)
    weights = {init.name for init in model.graph.initializer}
    seen, rows = set(), []
    with tempfile.TemporaryDirectory() as folder:
        for node in model.graph.node:
            key = signature(node, values, weights)
            if key in seen or any(n and n not in values and n not in weights for n in node.input):
                continue
            seen.add(key)
            single = alone(model, node, values)
            path = Path(folder) / "node.onnx"
            onnx.save(single, path)
            measured = measure_activation_peak(path, repeats=args.repeats)
            rows.append((measured - predicted_activation_peak(single), measured, node))
    table = Table(title=f"{args.model.name} ({args.mode}): {len(rows)} distinct nodes, largest misses first")
    for column in ("node", "op", "input shapes", "measured KiB", "predicted KiB", "missed KiB"):
        table.add_column(column)
    for missed, measured, node in sorted(rows, key=lambda r: -abs(r[0]))[:args.rows]:
        shapes = " ".join(str(list(values[n].shape)) for n in node.input if n in values)
        table.add_row(node.name, node.op_type, shapes, f"{measured / KIB:.0f}", f"{(measured - missed) / KIB:.0f}",
                      f"{missed / KIB:+.0f}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
