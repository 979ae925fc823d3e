"""A rewritten model's measured peak per fresh measuring process, with onnxruntime's telemetry off (as the
measurement runs) and on (as it ran before `measure.MEASURING_ENV` turned it off), the two interleaved.

Importing onnxruntime 1.32 starts a thread that sends telemetry over HTTP at a moment set by a timer; a step it lands
in, or the run learning what runtimes keep, counts its resolver threads, buffers and code (`passes/measure.py`). The
table gives per process and setting the device's measured peak (median of the watched runs) and what the runtime was
found to keep, then per setting the median, the range and how many processes measured over the model's budget.

    python tools/telemetry_spread.py out.onnx --devices cpu --processes 6
"""

from __future__ import annotations

import argparse
import statistics

from rich.console import Console
from rich.table import Table

from onnx_remat.core.devices import get_devices
from onnx_remat.core.tags import read_budgets
from onnx_remat.execution import input_values
from onnx_remat.passes import load
from onnx_remat.passes.measure import MEASURING_ENV
from onnx_remat.passes.measure_devices import MeasuredPeaks, _measure_in, _measuring_folder
from onnx_remat.passes.run_devices import build_plan

MIB = 1 << 20
SETTINGS = {
    "off": MEASURING_ENV,
    "on": {name: value for name, value in MEASURING_ENV.items() if name != "ORT_DISABLE_TELEMETRY"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model written by onnx-remat")
    parser.add_argument("--devices", default="cpu", help="its devices (a preset or a device file)")
    parser.add_argument("--processes", type=int, default=6, help="fresh processes per setting")
    args = parser.parse_args()
    model = load.load_model(args.model)
    plan = build_plan(model, get_devices(args.devices))
    device = plan.devices[0].name
    budget = read_budgets(model).get(device)
    samples: dict[str, list[MeasuredPeaks]] = {name: [] for name in SETTINGS}
    table = Table("process", *(f"telemetry {name}: peak MiB, kept KiB" for name in SETTINGS),
                  title=f"{args.model} on {device} (budget {budget / MIB:.2f} MiB)" if budget else args.model)
    with _measuring_folder(plan, input_values(model, None)) as folder:
        for process in range(args.processes):
            cells = []
            for name, env in SETTINGS.items():
                measured = _measure_in(folder, 3, env)
                samples[name].append(measured)
                cells.append(f"{measured.peak_bytes[0] / MIB:.2f}, {measured.kept_bytes[0] / 1024:.0f}")
            table.add_row(str(process + 1), *cells)
    table.add_section()
    table.add_row("median", *(_median_cell(samples[name]) for name in SETTINGS))
    table.add_row("range", *(_range_cell(samples[name]) for name in SETTINGS))
    if budget:
        table.add_row("over budget", *(str(sum(s.peak_bytes[0] > budget for s in samples[name])) for name in SETTINGS))
    Console().print(table)


def _median_cell(samples: list[MeasuredPeaks]) -> str:
    peaks, kept = [s.peak_bytes[0] for s in samples], [s.kept_bytes[0] for s in samples]
    return f"{statistics.median(peaks) / MIB:.2f}, {statistics.median(kept) / 1024:.0f}"


def _range_cell(samples: list[MeasuredPeaks]) -> str:
    peaks, kept = [s.peak_bytes[0] for s in samples], [s.kept_bytes[0] for s in samples]
    return f"{min(peaks) / MIB:.2f}-{max(peaks) / MIB:.2f}, {min(kept) / 1024:.0f}-{max(kept) / 1024:.0f}"


if __name__ == "__main__":
    main()
