"""Time building the problem and rewriting a real model's training step, and digest what they produce.

Exports torchvision's ResNet-50 (legacy exporter, BatchNorm kept), prepares its training step once, then builds the
problem (analytic costs) and rewrites the prepared onnx-ir model to Chen's sqrt(n) checkpointing
schedule (recomputations included) `--repeats` times each, printing the medians; the digests of the problem and of
the rewritten graph's nodes (names, operators, inputs, outputs, attributes, tags, in order) show that a change of the
code kept both the same.

    python tools/bench_rewrite.py [--model resnet50] [--batch 2] [--size 224] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import onnx
from bench_prepare import export

from onnx_remat.core.devices import get_devices
from onnx_remat.passes.rewrite import rewrite
from onnx_remat.passes.solve.baselines import chen_sqrt_n
from onnx_remat.pipeline import TrainingOptions, costed_problem, prepare


def node_digest(model: onnx.ModelProto) -> str:
    """A hash of the graph's nodes in order (everything a node says, its metadata sorted and less trailing blank
    outputs, which ONNX reads as left out) and its inputs', outputs' and initializers' names."""
    graph = model.graph
    parts = [_trimmed(node).SerializeToString(deterministic=True) for node in graph.node]
    parts += [name.encode() for name in [*(v.name for v in graph.input), *(v.name for v in graph.output),
                                          *sorted(i.name for i in graph.initializer)]]
    return hashlib.sha256(b"|".join(parts)).hexdigest()[:16]


def _trimmed(node: onnx.NodeProto) -> onnx.NodeProto:
    """A copy of `node` without its trailing blank outputs, its metadata sorted by key."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    while copy.output and not copy.output[-1]:
        copy.output.pop()
    metadata = sorted(copy.metadata_props, key=lambda entry: entry.key)
    del copy.metadata_props[:]
    copy.metadata_props.extend(metadata)
    return copy


def timed(run, repeats: int) -> tuple[float, object]:
    """The median seconds of `repeats` calls of `run`, and its last result."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = export(args.model, "legacy", args.batch, args.size, Path(folder) / "model.onnx")
        prepared = prepare(path, "train", training=TrainingOptions(loss="cross-entropy"))
    devices = get_devices(None)
    problem_seconds, costed = timed(lambda: costed_problem(prepared, devices), args.repeats)
    schedule = chen_sqrt_n(costed.problem)
    rewrite_seconds, model = timed(lambda: rewrite(prepared.model, costed.opmap, schedule, costed.problem.devices),
                                   args.repeats)
    problem_digest = hashlib.sha256(repr(costed.problem).encode()).hexdigest()[:16]
    print(f"| {args.model} train batch {args.batch} | operators | nodes out | problem s | problem digest "
          "| rewrite s | rewritten digest |")
    print("| --- | ---: | ---: | ---: | --- | ---: | --- |")
    print(f"| sqrt(n) schedule | {costed.problem.num_ops} | {len(model.graph.node)} | {problem_seconds:.3f} "
          f"| {problem_digest} | {rewrite_seconds:.3f} | {node_digest(model)} |")


if __name__ == "__main__":
    main()
