"""One table row per rewrite made through the command line, as a user makes it: `onnx-remat IN OUT --mode MODE --budget
BUDGET`, then `onnx-remat run OUT --devices cpu --check --repeats 3` (shared by tools/hf_models.py and
tools/real_models_cli.py)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

COLUMNS = ("rewrite exit", "s", "recomputed nodes", "run predicted", "measured / budget", "verdict", "max diff")
HEADER = " | ".join(COLUMNS) + " |"
ALIGNMENT = " --- | ---: | ---: | --- | --- | --- | --- |"


def cli(*arguments: str) -> tuple[int, float, str]:
    """`onnx-remat ARGUMENTS` beside this Python: exit code, wall seconds, stdout and stderr."""
    start = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("onnx-remat")), *arguments], capture_output=True,
                          text=True, check=False)
    return done.returncode, time.perf_counter() - start, done.stdout + done.stderr


def row(model: Path, mode: str, time_limit: float, folder: Path, budget: str = "min",
        options: tuple[str, ...] = ()) -> list[str]:
    """The cells of COLUMNS: the rewrite of `model` at `budget` (with further command-line `options`), then
    `run --check` of it; a failing command's last line where its figures would be."""
    report = report_path(model, mode, budget, folder)
    out = report.with_suffix(".onnx")
    code, seconds, said = cli(str(model), str(out), "--mode", mode, "--budget", budget, "--time-limit",
                              str(time_limit), "--report", str(report), "--force", "-q", *options)
    if code != 0:
        return [str(code), f"{seconds:.1f}", "-", "-", "-", said.strip().splitlines()[-1][:80], "-"]
    recomputed = json.loads(report.read_text())["recomputed_nodes"]
    code, _, said = cli("run", str(out), "--devices", "cpu", "--check", "--repeats", "3")
    peak = re.search(r"predicted peak ([\d.]+ \w+), measured peak ([\d.]+ \w+)(?: \(([^)]*)\))? \(budget ([\d.]+ \w+), "
                     r"([^)]*)\)", said)
    difference = re.search(r"largest difference to the whole model in onnxruntime: (\S+)", said)
    if peak is None:
        return ["0", f"{seconds:.1f}", str(recomputed), "-", "-", f"run exit {code}", "-"]
    spread = f" ({peak[3]})" if peak[3] else ""
    return ["0", f"{seconds:.1f}", str(recomputed), peak[1], f"{peak[2]}{spread} / {peak[4]}", peak[5],
            difference[1] if difference else "-"]


def report_path(model: Path, mode: str, budget: str, folder: Path) -> Path:
    """Where `row` has the rewrite of `model` in `mode` at `budget` write its `--report` (the rewrite beside it)."""
    return folder / f"{model.stem}.{mode}.{budget.rstrip('%')}.json"


@contextlib.contextmanager
def output_folder(out: Path | None) -> Iterator[Path]:
    """Where a table's exports and rewrites go: `out`, created if missing, or a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory() as temporary:
        folder = out or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
