"""Time a 1000-operator training graph end to end: DenseNet-121's training step at batch 2, 64x64, `--budget min`
(or another budget).

Exports torchvision's DenseNet-121 (random weights, BatchNorm kept, the legacy exporter as tools/real_model_zoo.py
does it) into a cache folder, then per repeat runs in fresh processes, each measuring its costs anew (an empty cost
cache), as a new user would:
- the command `onnx-remat MODEL OUT --mode train --budget B --time-limit T --report R`: wall time, peak RSS, and
  from its report the minimum found, the proven bound and the recomputed nodes;
- the same through the Python API's stages (prepare -> costed -> solve_at -> rewritten -> save), timing each phase;
  the minimum-budget search is solve_at's time less the solver's own.
Prints a table, then the medians of the command's rows.

    python tools/bench_scale.py [--time-limit 60] [--budget min] [--repeats 1] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 2**20
MODEL = "densenet121"
PHASES = ("prepare", "costs", "min search", "solve", "report+rewrite", "write")


def exported(cache_dir: Path) -> Path:
    """DenseNet-121's export in `cache_dir`, written on first use (torch is imported only then: the timed children
    do without it)."""
    from real_model_zoo import export

    path = cache_dir / f"{MODEL}-legacy-b2.onnx"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        export(MODEL, "legacy", path)
    return path


def run_measured(command: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds and peak RSS (bytes) of `command` in a child process, and its output; it must succeed."""
    with tempfile.TemporaryFile("w+") as output:
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        text = output.read()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{text}")
    return seconds, usage.ru_maxrss * 1024, text  # ru_maxrss is in KiB on Linux


def command_row(model: Path, budget: str, time_limit: float, folder: Path) -> dict[str, float]:
    """The command's wall time, peak RSS and its report's figures."""
    report = folder / "report.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "cache")}
    command = [sys.executable, "-m", "onnx_remat.cli.entry", str(model), str(folder / "out.onnx"), "--mode", "train",
               "--budget", budget, "--time-limit", str(time_limit), "--report", str(report), "--force", "-q"]
    seconds, rss, _ = run_measured(command, env)
    return {"total": seconds, "rss": rss, **figures(json.loads(report.read_text()))}


def figures(report: dict) -> dict[str, float]:
    """What the table shows of a report: minimum found and proven (bytes and % of keep-all), recomputed nodes."""
    keep = report["keep_all_bytes"]
    return {"found": report["minimum_budget_bytes"], "lower": report["minimum_lower_bytes"] or 0, "keep": keep,
            "recomputed": report["recomputed_nodes"], "overhead": report["time_overhead"],
            "operators": report["num_ops"]}


def phases(model: Path, budget: str, time_limit: float, folder: Path) -> dict[str, float]:
    """Each stage of `remat` timed (in this process), as the command runs them."""
    from onnx_remat.core.devices import get_devices
    from onnx_remat.pipeline import RematOptions, costed, prepare, rewritten, solve_at

    options = RematOptions(mode="train", time_limit=time_limit, cache_dir=folder / "cache")
    marks = [time.perf_counter()]
    prepared = prepare(model, "train", None, options.training)
    marks.append(time.perf_counter())
    problem = costed(prepared, options, get_devices(None), marks[0])
    marks.append(time.perf_counter())
    solved = solve_at(problem, budget, options, marks[0])
    marks.append(time.perf_counter())
    result = rewritten(solved)
    marks.append(time.perf_counter())
    result.save(folder / "out.onnx", force=True)
    marks.append(time.perf_counter())
    spans = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    solver = solved.result.seconds
    times = dict(zip(PHASES, [spans[0], spans[1], spans[2] - solver, solver, spans[3], spans[4]], strict=True))
    return {**times, "total": marks[-1] - marks[0], "costs from": problem.cost_source,
            **figures(json.loads(result.report.to_json()))}


def phases_row(model: Path, budget: str, time_limit: float, folder: Path) -> dict[str, float]:
    """`phases` in a fresh process, with its peak RSS."""
    command = [sys.executable, __file__, "--phases-of", str(model), "--budget", budget, "--time-limit", str(time_limit),
               "--cache-dir", str(folder)]
    _, rss, output = run_measured(command, dict(os.environ))
    return {**json.loads(output.strip().splitlines()[-1]), "rss": rss}


def line(label: str, row: dict) -> str:
    """A table row: phase seconds (where timed), total, peak RSS, minimum found and proven, recomputed nodes."""
    keep = row["keep"]
    cells = [f"{row[p]:.1f}" if p in row else "-" for p in PHASES]
    return (f"| {label} | {' | '.join(cells)} | {row['total']:.1f} | {row['rss'] / 2**30:.2f} | "
            f"{row['found'] / MIB:.1f} ({100 * row['found'] / keep:.1f}%) | {row['lower'] / MIB:.1f} "
            f"({100 * row['lower'] / keep:.1f}%) | {row['recomputed']} | {100 * row['overhead']:+.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--budget", default="min")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "onnx-remat-bench-scale")
    parser.add_argument("--phases-of", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phases_of:
        print(json.dumps(phases(args.phases_of, args.budget, args.time_limit, args.cache_dir)))
        return
    model = exported(args.cache_dir)
    print(f"DenseNet-121 training, batch 2, 64x64, --budget {args.budget} --time-limit {args.time_limit:g} "
          "(seconds; costs measured anew each run)")
    print(f"| run | {' | '.join(PHASES)} | total | peak RSS GB | min found MiB | proven MiB | recomputed nodes "
          "| time |")
    print("|" + " --- |" + " ---: |" * (len(PHASES) + 6))
    commands = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(dir=args.cache_dir) as folder:
            commands.append(command_row(model, args.budget, args.time_limit, Path(folder)))
            print(line(f"command {repeat + 1}", commands[-1]), flush=True)
        with tempfile.TemporaryDirectory(dir=args.cache_dir) as folder:
            staged = phases_row(model, args.budget, args.time_limit, Path(folder))
            print(line(f"stages {repeat + 1}", staged), flush=True)
    print(f"operators {commands[0]['operators']:.0f}, costs {staged['costs from']}; command median "
          f"{statistics.median(c['total'] for c in commands):.1f} s, "
          f"{statistics.median(c['rss'] for c in commands) / 2**30:.2f} GB")


if __name__ == "__main__":
    main()
