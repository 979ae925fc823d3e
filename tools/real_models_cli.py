"""The zoo's architectures through the command line, as a user runs them: export, rewrite, run.

Each architecture of tools/real_model_zoo.py (by default those beyond the matrix, `MORE_ARCHITECTURES`) is exported
with each exporter it names (the training export with the dynamo exporter's optimizer off), then per mode and budget
`onnx-remat M.onnx OUT.onnx --mode MODE --budget BUDGET --time-limit T` (`--loss` the architecture's in train mode)
and `onnx-remat run OUT.onnx --devices cpu --check --repeats 3` (tools/command_rows.py). The markdown table gives the
exporter's opset, the rewrite's exit code and wall seconds, the nodes recomputed, run's predicted and measured peak
against the budget, its verdict and the largest difference to the whole model; an export that fails, the
exporter's message.

    python tools/real_models_cli.py [--models alexnet,r3d_18] [--exporters legacy,dynamo] [--modes infer,train]
        [--budgets min,50%] [--time-limit 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import onnx
from command_rows import ALIGNMENT, HEADER, output_folder, row
from real_model_zoo import EXPORTERS, MORE_ARCHITECTURES, architecture, export

ESCAPE = r"\x1b\[[0-9;]*m"
"""A terminal colour code: the dynamo exporter colours its error messages."""


def exported(name: str, exporter: str, path: Path, training: bool) -> tuple[str, str]:
    """Export `name` to `path`: its opset, or "-" and the exporter's error in one line."""
    try:
        export(name, exporter, path, training=training)
    except Exception as error:  # noqa: BLE001  # the exporter's own failure is a row of the table
        return "-", f"export failed: {type(error).__name__}: {re.sub(ESCAPE, '', str(error).splitlines()[0])[:120]}"
    model = onnx.load(str(path), load_external_data=False)
    return str(next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))), ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MORE_ARCHITECTURES))
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--budgets", default="min,50%")
    parser.add_argument("--time-limit", type=float, default=30)
    parser.add_argument("--out", type=Path, help="keep the exports and rewrites here (default: a temporary folder)")
    args = parser.parse_args()
    print("| model | exporter | opset | mode | budget | " + HEADER)
    print("| --- | --- | --- | --- | --- |" + ALIGNMENT)
    with output_folder(args.out) as folder:
        for name in args.models.split(","):
            for exporter in [e for e in args.exporters.split(",") if e in architecture(name).exporters]:
                for mode in args.modes.split(","):
                    path = folder / f"{name}.{exporter}.{mode}.onnx"
                    opset, failed = exported(name, exporter, path, training=mode == "train")
                    options = ("--loss", architecture(name).loss) if mode == "train" else ()
                    for budget in args.budgets.split(","):
                        cells = ["-", "-", "-", "-", "-", failed, "-"] if failed else \
                            row(path, mode, args.time_limit, folder, budget, options)
                        print(f"| {name} | {exporter} | {opset} | {mode} | {budget} | " + " | ".join(cells) + " |",
                              flush=True)


if __name__ == "__main__":
    main()
