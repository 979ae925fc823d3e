"""Three ways onnxruntime (CPU) can sum gradient rows picked with repeats, how fast and how right: ScatterND with
reduction="add" (what Gather/GatherND gradients were), ScatterElements with reduction="add" on broadcast int32 indices,
and a one-hot MatMul (what they are: passes/autodiff/rules/gather.py).

For each shape (ROWS x WIDTH table, PICKS picks of random rows, standard normal updates) and thread count, runs each
node alone in a session as onnx-remat runs models (passes/execute.ort_session) --runs times and prints a markdown row:
median milliseconds, how many runs differ from the first, and how many runs lost an update (an error above 1e-3 to the
float64 sum: ScatterND's kernel adds index rows on several threads unsynchronised, microsoft/onnxruntime#18048).

    python tools/bench_scatter_add.py [--shapes 4x8192x1024,500x64x512] [--threads 1,2,4] [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_remat.passes.execute import ort_session

LOST = 1e-3
"""An error to the float64 sum above this is a lost update: rounding alone stays near 1e-5 at these sizes."""


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[int]]], rows: int,
           width: int) -> onnx.ModelProto:
    """A graph of `nodes` from named inputs (element type, shape) to `out` (rows x width float)."""
    graph = helper.make_graph(nodes, "scatter_add", [helper.make_tensor_value_info(name, kind, shape) for name, (
        kind, shape) in inputs.items()], [helper.make_tensor_value_info("out", TensorProto.FLOAT, [rows, width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def variants(rows: int, width: int, picked: np.ndarray,
             updates: np.ndarray) -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """Name -> (model, feeds) of each way to sum `updates` into the rows `picked`."""
    picks, zeros, floats = len(picked), np.zeros((rows, width), np.float32), TensorProto.FLOAT
    scatter_nd = _model([helper.make_node("ScatterND", ["data", "idx", "upd"], ["out"], reduction="add")],
                        {"data": (floats, [rows, width]), "idx": (TensorProto.INT64, [picks, 1]),
                         "upd": (floats, [picks, width])}, rows, width)
    elements = _model([helper.make_node("ScatterElements", ["data", "idx", "upd"], ["out"], axis=0,
                                        reduction="add")],
                      {"data": (floats, [rows, width]), "idx": (TensorProto.INT32, [picks, width]),
                       "upd": (floats, [picks, width])}, rows, width)
    one_hot = _model([helper.make_node("MatMul", ["hot", "upd"], ["out"])],
                     {"hot": (floats, [rows, picks]), "upd": (floats, [picks, width])}, rows, width)
    hot = (np.arange(rows)[:, None] == picked[None, :]).astype(np.float32)
    return {
        "ScatterND add": (scatter_nd, {"data": zeros, "idx": picked[:, None], "upd": updates}),
        "ScatterElements add": (elements, {"data": zeros, "idx": np.repeat(picked[:, None], width, 1).astype(np.int32),
                                           "upd": updates}),
        "one-hot MatMul": (one_hot, {"hot": hot, "upd": updates}),
    }


def measure(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int, runs: int,
            exact: np.ndarray) -> tuple[float, int, int]:
    """Median ms over `runs` runs after a warm-up, runs differing from the first, runs that lost an update."""
    session = ort_session(model, threads=threads)
    session.run(None, feeds)
    seconds, outputs = [], []
    for _ in range(runs):
        started = time.perf_counter()
        outputs.append(session.run(None, feeds)[0])
        seconds.append(time.perf_counter() - started)
    differing = sum(not np.array_equal(output, outputs[0]) for output in outputs)
    lost = sum(float(np.max(np.abs(output - exact))) > LOST for output in outputs)
    return statistics.median(seconds) * 1e3, differing, lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="4x8192x1024,500x64x512", help="ROWSxWIDTHxPICKS, comma-separated")
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print("| rows x width, picks | threads | variant | median ms | runs differing | runs losing an update |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for spec in args.shapes.split(","):
        rows, width, picks = (int(part) for part in spec.split("x"))
        rng = np.random.default_rng(0)
        picked = rng.integers(0, rows, picks)
        updates = rng.standard_normal((picks, width)).astype(np.float32)
        exact = np.zeros((rows, width))
        np.add.at(exact, picked, updates.astype(np.float64))
        for threads in (int(t) for t in args.threads.split(",")):
            for name, (model, feeds) in variants(rows, width, picked, updates).items():
                ms, differing, lost = measure(model, feeds, threads, args.runs, exact)
                print(f"| {rows} x {width}, {picks} | {threads} | {name} | {ms:.2f} | {differing} / {args.runs} | "
                      f"{lost} / {args.runs} |", flush=True)


if __name__ == "__main__":
    main()
