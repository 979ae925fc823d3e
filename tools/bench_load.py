"""One onnx-remat command, quiet and beside CPU hogs, in turns: what load does to its result and its time limit.

Runs the command (the arguments after `--`, given to the `onnx-remat` beside this python, with `--report` added) in
rounds, each round once alone and once with `--hogs` busy-loop processes beside it, and prints a markdown table per
run: the load average at its start, wall seconds, peak RSS (the largest of the process and its children), the
solver's status and gap, the predicted time against keep-all, the budget and the minimum found; then the medians per
load. The heuristics the solver starts from, and the minimum search's, are bounded by work, not by seconds; the
command's time limit still holds under load, so where the load slows the stages it cannot shorten, the minimum
search's work shrinks and costs may not be measured.

With `--stages` each run is the command's work done stage by stage in a fresh process, as `onnx-remat` does it (the
same parser, pipeline stages and output files), and a second table gives the wall seconds of each stage: the
interpreter's start-up, the imports, prepare (load, shapes, the train step), costs (problem build and cost
measurement), the minimum search and the solve call's other work (solve_at less the solver), the solver (its own
seconds, the portfolio's start and its workers' stop included), report and rewrite, the output files (rendered and
written) and the process's exit; then the total against the time limit, per run and as medians; and a third table
the CPU seconds of each stage from the imports to the files (the process's and its children's, user and system:
what the load does not change). Every run gets an empty cost cache, as a new user's first run does.

Run: python tools/bench_load.py [--rounds 3] [--hogs 2] [--stages] -- MODEL.onnx --mode train --budget 35% \
    --time-limit 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

STARTED, STARTED_AT, STARTED_CPU = time.perf_counter(), time.time(), time.process_time()
"""Where a stage-by-stage run's limit counts from, as the command's from its entry: before the package's imports (and
its CPU seconds then: no child has run yet)."""
MIB = 2**20
STAGES = ("start-up", "imports", "prepare", "costs", "min search", "solver", "report+rewrite", "outputs", "exit")
CPU_STAGES = ("imports", "prepare", "costs", "solve", "report+rewrite", "outputs")
"""The stages a staged run's CPU seconds are counted over (the minimum search and the solver together: the solver's
workers are threads and child processes both)."""


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and its waited-for children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def hogs(count: int) -> Iterator[None]:
    """`count` busy-loop processes for the duration, each stopped by its own id afterwards."""
    started = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if started else 0.0)  # let them take the cores before the command starts
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


def run_child(command: list[str], env: dict[str, str]) -> tuple[int, float, str, str]:
    """Run `command` to its end: its exit code, peak RSS (GB), standard output and error."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        stdout.seek(0)
        stderr.seek(0)
        return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 2**20, stdout.read(), stderr.read()


def run_once(arguments: list[str], folder: Path, staged: bool) -> dict:
    """Run onnx-remat once (`staged`: stage by stage, `stages_of`) with a report and an empty cost cache in `folder`;
    the report's figures, the wall time and any stage times (an error instead on failure)."""
    report, output = folder / "report.json", folder / "out.onnx"
    model, *options = arguments
    argv = [model, str(output), *options, "--report", str(report), "--force", "-q"]
    command = str(Path(sys.executable).with_name("onnx-remat"))
    program = [sys.executable, __file__, "--stages-of"] if staged else [command]
    with tempfile.TemporaryDirectory(dir=folder) as cache:
        load = os.getloadavg()[0]
        started, launched = time.perf_counter(), time.time()
        returncode, rss, stdout, stderr = run_child([*program, *argv], {**os.environ, "XDG_CACHE_HOME": cache})
        wall, ended = time.perf_counter() - started, time.time()
    if returncode != 0:
        return {"load": load, "wall": wall, "rss": rss, "error": stderr.strip()[-200:]}
    data = json.loads(report.read_text())
    minimum = data.get("minimum_budget_bytes")
    stages = json.loads(stdout.strip().splitlines()[-1]) if staged else {}
    if stages:  # the interpreter's start before this script's first line, and its exit after the files are written
        stages["start-up"], stages["exit"] = stages.pop("started at") - launched, ended - stages.pop("ended at")
    return {
        "load": load, "wall": wall, "rss": rss, "status": data["solver"]["status"], "gap": data["solver"]["gap"],
        "increase": data["predicted_seconds"] / data["keep_all_seconds"] - 1,
        "budget": data["budget_bytes"] / MIB, "minimum": None if minimum is None else minimum / MIB, **stages,
    }


def stages_of(argv: list[str]) -> dict[str, float]:
    """The main command `argv` run here as `onnx-remat` runs it, its limit counted from this script's start: the wall
    seconds of each stage from the imports to the files written, when it started and ended (time.time()), and the time
    limit."""
    from onnx_remat.cli.arguments import remat_options
    from onnx_remat.cli.main import _outputs, build_parser
    from onnx_remat.core.devices import get_devices
    from onnx_remat.core.files import write_together
    from onnx_remat.pipeline import costed, prepare, rewritten, solve_at

    args = build_parser().parse_args(argv)
    options = replace(remat_options(args), headroom=args.headroom, find_minimum=bool(args.report),
                      plot=bool(args.plot))
    marks, cpu = [STARTED, time.perf_counter()], [STARTED_CPU, cpu_seconds()]

    def mark() -> None:
        marks.append(time.perf_counter())
        cpu.append(cpu_seconds())

    prepared = prepare(args.input, options.mode, options.input_shapes, options.training)
    mark()
    problem = costed(prepared, options, get_devices(options.devices), STARTED)
    mark()
    solved = solve_at(problem, args.budget, options, STARTED)
    mark()
    result = rewritten(solved)
    mark()
    write_together(_outputs(args, result))
    mark()
    spans = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    solver = solved.result.seconds
    times = [*spans[:3], spans[3] - solver, solver, *spans[4:]]
    used = {f"cpu {stage}": b - a for stage, a, b in zip(CPU_STAGES, cpu[:-1], cpu[1:], strict=True)}
    return {**dict(zip(STAGES[1:-1], times, strict=True)), **used, "limit": options.time_limit,
            "started at": STARTED_AT, "ended at": STARTED_AT + marks[-1] - STARTED}


def row(label: str, result: dict) -> str:
    """One markdown table row of a run."""
    if "error" in result:
        return (f"| {label} | {result['load']:.1f} | {result['wall']:.1f} | {result['rss']:.2f} | "
                f"error: {result['error']} | | | | |")
    minimum = "" if result["minimum"] is None else f"{result['minimum']:.2f}"
    return (f"| {label} | {result['load']:.1f} | {result['wall']:.1f} | {result['rss']:.2f} | {result['status']} "
            f"| {100 * result['gap']:.2f}% | {100 * result['increase']:+.1f}% | {result['budget']:.2f} | {minimum} |")


def stage_row(label: str, result: dict) -> str:
    """One markdown row of a staged run's seconds per stage, its total and how far past the limit it ended."""
    if "error" in result:
        return f"| {label} |" + " |" * (len(STAGES) + 2)
    cells = " | ".join(f"{result[stage]:.2f}" for stage in STAGES)
    return f"| {label} | {cells} | {result['wall']:.2f} | {result['wall'] - result['limit']:+.2f} |"


def cpu_row(label: str, result: dict) -> str:
    """One markdown row of a staged run's CPU seconds per stage and their sum but the solve's."""
    if "error" in result:
        return f"| {label} |" + " |" * (len(CPU_STAGES) + 1)
    seconds = {stage: result[f"cpu {stage}"] for stage in CPU_STAGES}
    fixed = sum(value for stage, value in seconds.items() if stage != "solve")
    return f"| {label} | {' | '.join(f'{value:.2f}' for value in seconds.values())} | {fixed:.2f} |"


def stage_medians(label: str, results: list[dict], cpu: bool = False) -> str:
    """The median stage row (`cpu`: CPU seconds row) of the staged runs that succeeded."""
    done = [r for r in results if "error" not in r]
    keys = (*(f"cpu {stage}" for stage in CPU_STAGES),) if cpu else (*STAGES, "wall", "limit")
    median = {key: statistics.median(r[key] for r in done) for key in keys} if done else {"error": "none ran"}
    return (cpu_row if cpu else stage_row)(f"median {label}", median)


def medians(label: str, results: list[dict]) -> str:
    """The median row of the runs that succeeded."""
    done = [r for r in results if "error" not in r]
    if not done:
        return f"| median {label} | | | | no run succeeded | | | | |"
    keys = ("load", "wall", "rss", "gap", "increase", "budget")
    pick = {key: statistics.median(r[key] for r in done) for key in keys}
    minima = [r["minimum"] for r in done if r["minimum"] is not None]
    pick["minimum"] = statistics.median(minima) if minima else None
    pick["status"] = f"{len(done)} of {len(results)} ran"
    return row(f"median {label}", pick)


def main() -> None:
    if sys.argv[1:2] == ["--stages-of"]:
        print(json.dumps(stages_of(sys.argv[2:])), flush=True)
        os._exit(0)  # as the command ends (cli/entry.py), without the interpreter's shutdown
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes beside the loaded runs")
    parser.add_argument("--stages", action="store_true", help="run the command stage by stage and time each stage")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="-- MODEL.onnx and onnx-remat's options")
    args = parser.parse_args()
    arguments = args.arguments[1:] if args.arguments[:1] == ["--"] else args.arguments
    if not arguments:
        parser.error("give the command's arguments after --")
    loads = {"quiet": 0, f"{args.hogs} hogs": args.hogs}
    results: dict[str, list[dict]] = {label: [] for label in loads}
    print("| run | load avg | wall s | peak RSS GB | status | gap | time vs keep-all | budget MiB | minimum MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for label, count in loads.items():
                with hogs(count):
                    result = run_once(arguments, Path(folder), args.stages)
                results[label].append(result)
                print(row(f"{round_ + 1} {label}", result), flush=True)
    for label, found in results.items():
        print(medians(label, found))
    if args.stages:
        print(f"\n| run | {' | '.join(STAGES)} | total | past the limit |")
        print("| --- |" + " ---: |" * (len(STAGES) + 2))
        for label, found in results.items():
            for round_, result in enumerate(found):
                print(stage_row(f"{round_ + 1} {label}", result))
            print(stage_medians(label, found))
        print(f"\n| run (CPU s) | {' | '.join(CPU_STAGES)} | all but the solve |")
        print("| --- |" + " ---: |" * (len(CPU_STAGES) + 1))
        for label, found in results.items():
            for round_, result in enumerate(found):
                print(cpu_row(f"{round_ + 1} {label}", result))
            print(stage_medians(label, found, cpu=True))


if __name__ == "__main__":
    main()
