"""The training step of an MLP with torch.cond in the middle (real_model_zoo.CondMLP, dynamo exporter), rewritten at
its minimum and halfway from there to keep-all's peak, run as `onnx-remat run --devices cpu` runs it on either branch:
per budget and branch, the budget, the plan's predicted peak and the peak measured in fresh processes (median).

    python tools/bench_cond.py [--rows 2048] [--width 128] [--processes 3] [--time-limit 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from real_model_zoo import CondMLP

from onnx_remat.core.devices import get_devices
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.measure_devices import measure_device_peaks
from onnx_remat.passes.run_devices import build_plan
from onnx_remat.pipeline import TrainingOptions, prepare, remat

MIB = 2**20


def export(path: Path, rows: int, width: int) -> None:
    """CondMLP with seed-0 weights, as the dynamo exporter writes it (constants kept)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(CondMLP(width), (torch.ones(rows, 32),), dynamo=True, optimize=False,
                                    verbose=False)
    program.save(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--processes", type=int, default=3, help="fresh processes measuring each peak")
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    devices = get_devices("cpu")
    options = TrainingOptions(loss="sum")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cond_mlp.onnx"
        export(path, args.rows, args.width)
        step = prepare(path, mode="train", training=options).proto
        keep_all = remat(path, "100%", mode="train", training=options, devices=devices,
                         time_limit=args.time_limit).report
        budgets = {"min": keep_all.minimum_budget_bytes,
                   "halfway": (keep_all.minimum_budget_bytes + keep_all.predicted_peak_bytes) // 2}
        print("| budget | MiB | recomputations | branch | predicted MiB | measured MiB | measured/budget |")
        print("|---|---:|---:|---|---:|---:|---:|")
        for label, budget in budgets.items():
            result = remat(path, budget, mode="train", training=options, devices=devices,
                           time_limit=args.time_limit)
            plan = build_plan(result.model, devices)
            feeds = random_feeds(step, seed=0)
            for branch, sign in (("relu * scale", 1.0), ("tanh", -1.0)):
                feeds["x"] = sign * np.abs(feeds["x"])
                measured = statistics.median(measure_device_peaks(plan, feeds).peak_bytes[0]
                                             for _ in range(args.processes))
                print(f"| {label} | {budget / MIB:.2f} | {len(result.report.recomputations)} | {branch} | "
                      f"{plan.peak_bytes[0] / MIB:.2f} | {measured / MIB:.2f} | {measured / budget:.3f} |")


if __name__ == "__main__":
    main()
