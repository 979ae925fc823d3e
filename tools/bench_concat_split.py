"""What a wide Concat's gradient as one Split costs at the minimum budget: DenseNet-121's training step with Concats
of up to `SLICED_CONCAT_INPUTS` inputs (4, the default) or of every width (64) given per-input Slices.

For each width, builds the training step of MODEL (an ONNX file, e.g. DenseNet-121 exported as tools/real_model_zoo.py
does it) with roofline costs and runs the minimum-budget search at each limit, printing a markdown row: operators,
keep-all, the minimum found and proven (MiB), the search's CPU and wall seconds. The search is bounded by work that
scales with the limit (min_budget.search_runs), so its CPU seconds compare the two graphs on a loaded machine too.

    python tools/bench_concat_split.py MODEL.onnx [--limits 0,30] [--widths 4,64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from onnx_remat.core.devices import get_devices
from onnx_remat.passes.autodiff.rules import shape
from onnx_remat.passes.solve.min_budget import minimum_budget
from onnx_remat.pipeline import costed_problem, prepare

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--limits", default="0,30", help="comma-separated seconds of the minimum search")
    parser.add_argument("--widths", default="4,64", help="comma-separated SLICED_CONCAT_INPUTS values")
    args = parser.parse_args()
    print("| sliced Concats up to | operators | limit s | keep-all MiB | minimum found MiB | proven MiB "
          "| search CPU s | search wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for width in (int(w) for w in args.widths.split(",")):
        shape.SLICED_CONCAT_INPUTS = width  # read by the Concat rule as the training step is built
        problem = costed_problem(prepare(args.model, "train"), get_devices(None), "analytic").problem
        for limit in (float(s) for s in args.limits.split(",")):
            cpu, wall = time.process_time(), time.perf_counter()
            found = minimum_budget(problem, 0, limit)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(f"| {width} | {problem.num_ops} | {limit:g} | {problem.keep_all_bytes(0) / MIB:.2f} "
                  f"| {found.feasible / MIB:.2f} | {found.lower / MIB:.2f} | {cpu:.2f} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
