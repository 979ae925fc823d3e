"""The same rewrites measured by the measuring child of two commits in turn: what a change of the measurement moves.

Each rewrite's plan is built once (this tree's `build_plan`) and saved as `measure_devices` saves it; then the child
(`python -P -m onnx_remat.passes.measure_devices FOLDER 3`) of the commit `--before` and of `--after` run in turn,
`--processes` fresh processes each, every one importing its commit's package from a tree of `git archive` laid out
as the package (`onnx_remat/passes` is the repository's `passes/`), the editable install's finder dropped. Prints a
markdown table: budget, `run`'s prediction, each side's measured median (range) and its ratio to the prediction, MiB.

    python tools/measure_ab.py --before HEAD~1 --after HEAD /work/runs/hf32/segformer_legacy.infer.onnx
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import onnx

from onnx_remat.core.devices import get_devices
from onnx_remat.core.tags import read_budgets
from onnx_remat.passes.execute import random_feeds
from onnx_remat.passes.measure import MEASURING_ENV
from onnx_remat.passes.measure_devices import _measuring_folder
from onnx_remat.passes.run_devices import build_plan

MIB = 2**20
REPOSITORY = Path(__file__).resolve().parent.parent
PACKAGE_FOLDERS = {"onnx_remat": "", "passes": "passes", "models": "models"}  # repository folder -> inside the package
DROP_EDITABLE_FINDER = ("import sys\n"
                        'sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]\n')


def source_tree(commit: str, folder: Path) -> Path:
    """`commit`'s package as an importable tree in `folder` (for PYTHONPATH), with a sitecustomize that drops the
    editable install's finder, which would otherwise import this worktree's package."""
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", commit, *PACKAGE_FOLDERS], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            inside = PACKAGE_FOLDERS[top]
            member.name = "/".join(part for part in ("onnx_remat", inside, rest) if part)
            tar.extract(member, folder, filter="data")
    (folder / "sitecustomize.py").write_text(DROP_EDITABLE_FINDER)
    return folder


def measured(folder: Path, tree: Path) -> int:
    """The peak one fresh measuring child of `tree` reads for the plan in `folder` (median of its 3 watched runs)."""
    environment = dict(os.environ, **MEASURING_ENV, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-P", "-m", "onnx_remat.passes.measure_devices", str(folder), "3"],
                          capture_output=True, text=True, env=environment, cwd=tree, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"][0])


def row(model_path: Path, trees: dict[str, Path], processes: int) -> str:
    model = onnx.load(str(model_path))
    plan = build_plan(model, get_devices("cpu"))
    samples: dict[str, list[int]] = {side: [] for side in trees}
    with _measuring_folder(plan, random_feeds(model, seed=0)) as folder:
        for _ in range(processes):
            for side, tree in trees.items():
                samples[side].append(measured(folder, tree))
    predicted = plan.peak_bytes[0]
    budget = next(iter(read_budgets(model).values()), 0)
    cells = [model_path.name.removesuffix(".onnx"), f"{budget / MIB:.3f}", f"{predicted / MIB:.3f}"]
    for peaks in samples.values():
        median = statistics.median(peaks)
        cells += [f"{median / MIB:.3f} ({min(peaks) / MIB:.3f}-{max(peaks) / MIB:.3f})", f"{median / predicted:.3f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="rewrites made by onnx-remat for the cpu device")
    parser.add_argument("--before", required=True, help="commit of the first measuring child")
    parser.add_argument("--after", required=True, help="commit of the second")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per side and rewrite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        trees = {side: source_tree(commit, Path(workdir) / side) for side, commit in
                 (("before", args.before), ("after", args.after))}
        print("| rewrite | budget | run predicted | before: measured (range) | before / predicted "
              "| after: measured (range) | after / predicted |")
        print("| --- | ---: | ---: | --- | ---: | --- | ---: |")
        for model_path in args.models:
            print(row(model_path, trees, args.processes), flush=True)


if __name__ == "__main__":
    main()
