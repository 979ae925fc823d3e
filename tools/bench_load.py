"""One onnx-remat command, quiet and beside CPU hogs, in turns: what load does to its result.

Runs the command (the arguments after `--`, given to the `onnx-remat` beside this python, with `--report` added) in
rounds, each round once alone and once with `--hogs` busy-loop processes beside it, and prints a markdown table per
run: the load average at its start, wall seconds, the solver's status and gap, the predicted time against keep-all,
the budget and the minimum found; then the medians per load. The results should not depend on the load: the
heuristics the solver starts from, and the minimum search's, are bounded by work, not by seconds.

Run: python tools/bench_load.py [--rounds 3] [--hogs 2] -- MODEL.onnx --mode train --budget 35% --time-limit 30
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MIB = 2**20


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


def run_once(arguments: list[str], folder: Path) -> dict:
    """Run onnx-remat once with a report into `folder`; the report's figures and the wall time (None on failure)."""
    report, output = folder / "report.json", folder / "out.onnx"
    model, *options = arguments
    command = [str(Path(sys.executable).with_name("onnx-remat")), model, str(output), *options,
               "--report", str(report), "--force", "-q"]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"load": load, "wall": wall, "error": done.stderr.strip()[-200:]}
    data = json.loads(report.read_text())
    minimum = data.get("minimum_budget_bytes")
    return {
        "load": load, "wall": wall, "status": data["solver"]["status"], "gap": data["solver"]["gap"],
        "increase": data["predicted_seconds"] / data["keep_all_seconds"] - 1,
        "budget": data["budget_bytes"] / MIB, "minimum": None if minimum is None else minimum / MIB,
    }


def row(label: str, result: dict) -> str:
    """One markdown table row of a run."""
    if "error" in result:
        return f"| {label} | {result['load']:.1f} | {result['wall']:.1f} | error: {result['error']} | | | | |"
    minimum = "" if result["minimum"] is None else f"{result['minimum']:.2f}"
    return (f"| {label} | {result['load']:.1f} | {result['wall']:.1f} | {result['status']} "
            f"| {100 * result['gap']:.2f}% | {100 * result['increase']:+.1f}% | {result['budget']:.2f} | {minimum} |")


def medians(label: str, results: list[dict]) -> str:
    """The median row of the runs that succeeded."""
    done = [r for r in results if "error" not in r]
    if not done:
        return f"| median {label} | | | no run succeeded | | | | |"
    pick = {key: statistics.median(r[key] for r in done) for key in ("load", "wall", "gap", "increase", "budget")}
    minima = [r["minimum"] for r in done if r["minimum"] is not None]
    pick["minimum"] = statistics.median(minima) if minima else None
    pick["status"] = f"{len(done)} of {len(results)} ran"
    return row(f"median {label}", pick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes beside the loaded runs")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="-- MODEL.onnx and onnx-remat's options")
    args = parser.parse_args()
    arguments = args.arguments[1:] if args.arguments[:1] == ["--"] else args.arguments
    if not arguments:
        parser.error("give the command's arguments after --")
    loads = {"quiet": 0, f"{args.hogs} hogs": args.hogs}
    results: dict[str, list[dict]] = {label: [] for label in loads}
    print("| run | load avg | wall s | status | gap | time vs keep-all | budget MiB | minimum MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for label, count in loads.items():
                with hogs(count):
                    result = run_once(arguments, Path(folder))
                results[label].append(result)
                print(row(f"{round_ + 1} {label}", result), flush=True)
    for label, found in results.items():
        print(medians(label, found))


if __name__ == "__main__":
    main()
