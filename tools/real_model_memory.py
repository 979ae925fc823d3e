"""Measured memory of real exports' rewrites: is each within its budget and near its prediction?

For each architecture of the zoo, exporter and mode (infer, train), the model is rewritten at keep-all (100%), 50% and
its minimum, and each rewrite is run by `onnx-remat run`'s machinery on one onnxruntime CPU device, with its peak
measured in a fresh process. The table gives, per rewrite: the budget, the report's predicted peak (the solver's
simulation of the problem), `run`'s predicted peak (from the rewritten graph) and its ratio to the report's (the two
predictions agree within 10%), the measured peak (the median over `--repeats` fresh processes, each the median of 3
runs, and their range) and its ratio to the report's prediction, what the runtime kept from its first run (median)
beside what the predictions count for it (onnxruntime's bytes per node by op type, passes/runtime_kept.py) and the
nodes, whether it is within its budget as `run` judges it (yes: every process within; NO: every one over; spread: the
budget lies inside their spread, passes/verdict.py), whether the rewrite measures no heavier than the keep-all one
(the model as it runs without onnx-remat's recomputation, when 100% is among `--budgets`), and how many nodes
onnxruntime ran ahead of the file's order (read from its profiler; the schedule's order is the file's).

    python tools/real_model_memory.py --models resnet18,gpt,lstm --exporters legacy --modes infer,train
    python tools/real_model_memory.py --models mobilenet_v3_small --modes train --budgets min --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from real_model_zoo import ARCHITECTURES, EXPORTERS, architecture, export

from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import RematError
from onnx_remat.execution import input_values, run_on_devices
from onnx_remat.passes import load
from onnx_remat.passes.execute import executed_node_names
from onnx_remat.passes.measure_devices import measure_device_peaks
from onnx_remat.passes.run_devices import build_plan
from onnx_remat.passes.runtime_kept import SGEMM_STACK_BYTES
from onnx_remat.passes.verdict import Verdict, judge
from onnx_remat.pipeline import TrainingOptions, remat

MIB = 2**20
BATCHES = {"gpt": 256, "gpt_sdpa": 256, "gpt_mha": 256, "gpt_einsum": 256, "bert": 256, "t5_encoder": 256, "vit": 128,
           "lstm": 2048, "gru": 2048, "llama": 256, "llama_tied": 256, "moe": 256, "moe_one_hot": 256,
           "moe_gather": 256, "whisper_encoder": 256}
"""Rows per input where 32 leaves most tensors small: under the measurement's mmap threshold (passes/measure.py) they
come from a heap the warm-up run touched and escape the measurement (BERT at 32 rows measured 62-84% of its
prediction at a 64 KiB threshold, at 256 rows 99%)."""
BUDGETS = ("100%", "50%", "min")
PREDICTION_TOLERANCE = 0.10
"""How far a measured peak, or `run`'s prediction, may be from the report's prediction and still count as matching
it."""
MEASUREMENT_NOISE = 0.005
"""Relative spread of repeated measurements of one model (0.2% seen on ResNet-18). A rewrite counts as heavier than
keep-all only if its lightest measurement is above keep-all's heaviest by more than this and a worker thread's GEMM
stack (runtime_kept.SGEMM_STACK_BYTES, kept or not by a race): on models of a few MiB a rewrite with no recomputation
measured 'heavier' than the same schedule at keep-all by 50 KiB in one process each (gpt dynamo inference)."""


@dataclass
class Measured:
    """One rewrite's budget, predictions and measurement (bytes), or why it could not be made."""

    model: str
    batch: int
    exporter: str
    mode: str
    budget: str
    budget_bytes: int | None = None
    report_peak: int | None = None
    run_peak: int | None = None
    measured_peaks: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()
    predicted_kept: int | None = None
    nodes: int | None = None
    recomputed_nodes: int | None = None
    ahead_of_order: int | None = None
    failure: str = ""

    @property
    def measured_peak(self) -> int | None:
        return int(statistics.median(self.measured_peaks)) if self.measured_peaks else None

    @property
    def ratio(self) -> float | None:
        return None if not (self.report_peak and self.measured_peak) else self.measured_peak / self.report_peak

    @property
    def run_ratio(self) -> float | None:
        """`run`'s prediction (from the rewritten graph) over the report's (the solver's simulation)."""
        return None if not (self.report_peak and self.run_peak) else self.run_peak / self.report_peak


def measure(name: str, batch: int, exporter: str, mode: str, budget: str, path: Path, time_limit: float,
            repeats: int) -> Measured:
    """Rewrite `path` at `budget`, run the rewrite once on the CPU and measure its peak in `repeats` fresh processes."""
    row = Measured(name, batch, exporter, mode, budget)
    try:
        result = remat(path, budget, mode=mode, training=TrainingOptions(loss=architecture(name).loss),
                       time_limit=time_limit, find_minimum=budget == "min")
        out = path.with_name(f"{path.stem}.{mode}.{budget.rstrip('%')}.onnx")
        result.save(out)
        run = run_on_devices(out, None, repeats=1, measure_memory=False)
    except RematError as exc:
        row.failure = str(exc)[:120]
        return row
    row.budget_bytes = result.report.budget_bytes
    row.report_peak = result.report.predicted_peak_bytes
    (row.run_peak,) = run.predicted_peak_bytes.values()
    model = load.load_model(out)
    plan, feeds = build_plan(model, get_devices(None)), input_values(model, None)
    measured = [measure_device_peaks(plan, feeds) for _ in range(max(repeats, 1))]
    row.measured_peaks = tuple(peaks.peak_bytes[0] for peaks in measured)
    row.kept = tuple(peaks.kept_bytes[0] for peaks in measured)
    row.predicted_kept = plan.kept_bytes[0]
    row.nodes = len(model.graph.node)
    row.recomputed_nodes = result.report.recomputed_nodes
    row.ahead_of_order = ahead_of_file_order(model, executed_node_names(out, feeds))
    return row


def ahead_of_file_order(model: onnx.ModelProto, ran: list[str]) -> int:
    """How many of the nodes onnxruntime `ran` (in order) it ran while a node before them in the file had yet to run;
    nodes not in the file (function bodies onnxruntime inlined) are left out, the nodes run ahead of them counted."""
    position = {node.name: index for index, node in enumerate(model.graph.node)}
    ahead, earliest_after = 0, len(position)
    for index in reversed([position[name] for name in ran if name in position]):
        ahead += index > earliest_after
        earliest_after = min(earliest_after, index)
    return ahead


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.2f}"


def _range(values: tuple[int, ...]) -> str:
    return "-" if not values else f"{min(values) / MIB:.2f}-{max(values) / MIB:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _within(ratio: float | None) -> str:
    """Whether a ratio of two peaks is within PREDICTION_TOLERANCE of 1."""
    return "-" if ratio is None else ("yes" if abs(ratio - 1) <= PREDICTION_TOLERANCE else "NO")


COLUMNS = ("model", "batch", "exporter", "mode", "budget", "budget MiB", "report peak MiB", "run peak MiB",
           "run/report", "predictions agree", "measured MiB", "measured range MiB", "measured/report",
           "kept KiB", "predicted kept KiB", "nodes", "recomputed nodes", "nodes run ahead of file order",
           "within budget", "within 10%", "no heavier than keep-all", "failure")


def _verdict(peaks: tuple[int, ...], budget: int | None) -> str:
    """`run`'s verdict on the fresh processes' peaks: yes (all within), NO (all over), or spread (`passes.verdict`)."""
    if not peaks or budget is None:
        return "-"
    return {Verdict.WITHIN: "yes", Verdict.SPREAD: "spread", Verdict.OVER: "NO"}[judge(peaks, budget)]


def _row(row: Measured, keep_all: Measured | None) -> list[str]:
    measured = row.measured_peak
    lighter = "-" if keep_all is None or not (row.measured_peaks and keep_all.measured_peaks) else \
        ("yes" if min(row.measured_peaks) <= max(keep_all.measured_peaks) * (1 + MEASUREMENT_NOISE) + SGEMM_STACK_BYTES
         else "NO")
    return [row.model, str(row.batch), row.exporter, row.mode, row.budget, _mib(row.budget_bytes),
            _mib(row.report_peak), _mib(row.run_peak), _ratio(row.run_ratio), _within(row.run_ratio),
            _mib(measured), _range(row.measured_peaks),
            _ratio(row.ratio), "-" if not row.kept else f"{statistics.median(row.kept) / 1024:.0f}",
            "-" if row.predicted_kept is None else f"{row.predicted_kept / 1024:.0f}",
            "-" if row.nodes is None else str(row.nodes),
            "-" if row.recomputed_nodes is None else str(row.recomputed_nodes),
            "-" if row.ahead_of_order is None else str(row.ahead_of_order),
            _verdict(row.measured_peaks, row.budget_bytes),
            _within(row.ratio),
            lighter, row.failure]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ARCHITECTURES))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds each rewrite may take")
    parser.add_argument("--budgets", default=",".join(BUDGETS), help="budgets to rewrite at (100%% first gives the "
                        "keep-all peak the others are compared with)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh-process measurements of each rewrite")
    parser.add_argument("--batch", type=int, default=None,
                        help="rows per input (default 32, more for the small-tensor models of BATCHES): tensors under "
                        "the measurement's mmap threshold come from a heap the warm-up run touched and escape the "
                        "measurement")
    args = parser.parse_args()
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    print(lines[0], file=sys.stderr)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            for exporter in [e for e in args.exporters.split(",") if e in architecture(name).exporters]:
                batch = args.batch or BATCHES.get(name, 32)
                path = export(name, exporter, Path(folder) / f"{name}.{exporter}.onnx", batch=batch)
                for mode in args.modes.split(","):
                    keep_all = None
                    for budget in args.budgets.split(","):
                        row = measure(name, batch, exporter, mode, budget, path, args.time_limit, args.repeats)
                        keep_all = keep_all or (row if budget == "100%" else None)
                        lines.append("| " + " | ".join(_row(row, None if row is keep_all else keep_all)) + " |")
                        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
