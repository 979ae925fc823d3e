"""Start-up time of the command line: `onnx-remat --help` and every subcommand's --help against `import onnx`.

Issue 15 asks for --help within 2x of `python -c "import onnx"`. Each line is the median wall time of --runs fresh
processes (each run as `python -m onnx_remat.cli.entry`, which is what the `onnx-remat` script runs). With --solve,
also `onnx-remat solve FILE.json -q` on those problem files (one device: start-up is most of a small problem's solve;
issue 14 measures it on the peers' chain20 problems, written by the shared peers' make_problems.py).

    python tools/bench_startup.py [--runs 5] [--solve chain20_p60.json ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from onnx_remat.cli.main import COMMANDS


def median_seconds(args: list[str], runs: int) -> float:
    """Median wall time of `python ARGS` over `runs` processes."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="processes per line, median (default 5)")
    parser.add_argument("--solve", nargs="*", default=[], metavar="FILE.json", help="problem files to time solving")
    args = parser.parse_args()
    runs = args.runs
    cases = {
        "python -c 'import onnx'": ["-c", "import onnx"],
        "onnx-remat --help": ["-m", "onnx_remat.cli.entry", "--help"],
        **{f"onnx-remat {name} --help": ["-m", "onnx_remat.cli.entry", name, "--help"] for name in COMMANDS},
        **{f"onnx-remat solve {Path(f).name}": ["-m", "onnx_remat.cli.entry", "solve", f, "-q"] for f in args.solve},
    }
    print(f"{'command':<40} {'median s':>9} {'x import onnx':>14}")
    baseline = None
    for label, args in cases.items():
        seconds = median_seconds(args, runs)
        baseline = baseline or seconds
        print(f"{label:<40} {seconds:>9.3f} {seconds / baseline:>14.2f}")


if __name__ == "__main__":
    main()
