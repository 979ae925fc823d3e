"""onnx-remat's solver beside Moccasin (ICML'23, CP-SAT) on the same problems, judged by one neutral evaluator.

Runs, per problem and repeat, Moccasin and `onnx-remat solve` one after the other (the order alternating, so both
see the same machine load) through the runners in the shared peers directory (README.md there: the neutral
problem format, the evaluator, what each peer's status means), and prints a markdown table: both objectives as the
evaluator recomputes them from the returned operator sequences, both statuses, both wall times (the runners'
`wall_s`, median over repeats), and the ratios onnx-remat / Moccasin; the median ratios at the end. With repeats a
peer's objective is its worst and its status its weakest over the repeats.

Moccasin is a benchmark-only peer, never a dependency of the package. Set it up once (a venv in
~/.cache/onnx-remat-peers):

    git clone https://github.com/haoming-codes/moccasin /tmp/moccasin && bash PEERS/setup.sh /tmp/moccasin/.git

Run: python tools/bench_peers.py [--problems DIR] [--only chain20_b40,unet4_p60] [--time-limit 60] [--C 2]
     [--repeats 1] [--json OUT.jsonl] [--exe ONNX_REMAT]
     (without --problems: make_problems.py --seed 1 into a temporary directory)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PEERS = Path(os.environ.get("ONNX_REMAT_PEERS", Path(__file__).resolve().parents[2] / "shared" / "peers"))
"""The shared peers directory (runners, evaluator, problem generator); ONNX_REMAT_PEERS overrides it."""

PEERS_VENV = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "onnx-remat-peers")) / "venv"
"""Where setup.sh puts Moccasin's venv (PEERS_DIR overrides it, as in setup.sh)."""

STRENGTH = ["optimal", "feasible", "infeasible", "no_solution", "time_limit", "heuristic", "over_budget", "invalid"]
"""Statuses from strongest to weakest; anything else (error) is weaker still."""


def moccasin_python() -> Path:
    """The peers venv's python, or exit saying how to set Moccasin up."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists() or not (PEERS_VENV.parent / "moccasin").exists():
        sys.exit(
            f"Moccasin is not set up ({python} missing). Once: git clone https://github.com/haoming-codes/moccasin "
            f"/tmp/moccasin && bash {PEERS / 'setup.sh'} /tmp/moccasin/.git"
        )
    return python


def run_peer(command: list[str]) -> dict:
    """One runner's JSON line (the last line it printed), or an error row."""
    done = subprocess.run(command, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"status": "error", "objective": None, "wall_s": None, "error": done.stderr.strip()[-300:]}


def commands(problem: Path, args: argparse.Namespace) -> dict[str, list[str]]:
    """The runner command of each peer on `problem`."""
    limit = str(args.time_limit)
    exe = args.exe or Path(sys.executable).with_name("onnx-remat")
    return {
        "moccasin": [str(moccasin_python()), str(PEERS / "run_moccasin.py"), str(problem), "--time-limit", limit,
                     "--C", str(args.C)],
        "onnx-remat": [sys.executable, str(PEERS / "run_onnx_remat.py"), str(problem), "--time-limit", limit,
                       "--solver", args.solver, "--exe", str(exe)],
    }


def weakest(statuses: list[str]) -> str:
    """The weakest of some statuses (see STRENGTH)."""
    return max(statuses, key=lambda s: STRENGTH.index(s) if s in STRENGTH else len(STRENGTH))


def summary(runs: list[dict]) -> dict:
    """A peer's repeats on one problem: worst objective, weakest status, median wall time."""
    objectives = [r.get("objective") for r in runs]
    walls = [r["wall_s"] for r in runs if r.get("wall_s") is not None]
    return {
        "objective": None if None in objectives else max(objectives),
        "status": weakest([r.get("status", "error") for r in runs]),
        "wall_s": statistics.median(walls) if walls else None,
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def bench(problems: list[Path], args: argparse.Namespace, out: Path | None) -> list[dict]:
    """Run both peers on every problem, interleaved, printing one table row per problem as it finishes."""
    print(f"time limit {args.time_limit} s, Moccasin C={args.C}, onnx-remat --solver {args.solver}, "
          f"{args.repeats} repeat(s); wall = the runners' wall_s")
    print("| problem | Moccasin obj | status | s | onnx-remat obj | status | s | time ratio | obj ratio |")
    print("|---|---:|---|---:|---:|---|---:|---:|---:|")
    rows = []
    for number, problem in enumerate(problems):
        runs: dict[str, list[dict]] = {"moccasin": [], "onnx-remat": []}
        for repeat in range(args.repeats):
            order = list(commands(problem, args).items())
            for peer, command in order[:: 1 if (number + repeat) % 2 == 0 else -1]:
                runs[peer].append(run_peer(command))
                if out is not None:
                    with out.open("a") as f:
                        f.write(json.dumps({"peer": peer, "repeat": repeat, **runs[peer][-1]}) + "\n")
        theirs, ours = summary(runs["moccasin"]), summary(runs["onnx-remat"])
        row = {"problem": problem.stem, "moccasin": theirs, "onnx-remat": ours,
               "time_ratio": ratio(ours["wall_s"], theirs["wall_s"]),
               "objective_ratio": ratio(ours["objective"], theirs["objective"])}
        rows.append(row)
        print(table_row(row), flush=True)
    times = [r["time_ratio"] for r in rows if r["time_ratio"] is not None]
    objectives = [r["objective_ratio"] for r in rows if r["objective_ratio"] is not None]
    print(f"\nmedian time ratio (onnx-remat / Moccasin) {_num(statistics.median(times) if times else None, 3)} "
          f"over {len(times)}; median objective ratio {_num(statistics.median(objectives) if objectives else None, 5)}"
          f" over {len(objectives)}")
    return rows


def table_row(row: dict) -> str:
    theirs, ours = row["moccasin"], row["onnx-remat"]
    cells = [row["problem"], _num(theirs["objective"], 3), theirs["status"], _num(theirs["wall_s"], 1),
             _num(ours["objective"], 3), ours["status"], _num(ours["wall_s"], 1),
             _num(row["time_ratio"], 2), _num(row["objective_ratio"], 5)]
    return "| " + " | ".join(cells) + " |"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def problem_files(args: argparse.Namespace, scratch: Path) -> list[Path]:
    """The problems to run: --problems (default: generated with make_problems.py --seed 1), filtered by --only."""
    directory = Path(args.problems) if args.problems else scratch
    if not args.problems:
        subprocess.run([sys.executable, str(PEERS / "make_problems.py"), "--out", str(scratch), "--seed", "1"],
                       check=True, stdout=subprocess.DEVNULL)
    files = sorted(directory.glob("*.json"))
    if args.only:
        wanted = set(args.only.split(","))
        files = [f for f in files if f.stem in wanted]
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", help="a directory of neutral problem files (default: generated, seed 1)")
    parser.add_argument("--only", help="comma-separated problem names (file stems)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per run (default 60, the issue's)")
    parser.add_argument("--C", type=int, default=2, help="Moccasin's computations per node (default 2, main.py's)")
    parser.add_argument("--solver", default="auto", help="onnx-remat's --solver (default auto)")
    parser.add_argument("--exe", help="the onnx-remat executable to run (default: the one beside this Python); another "
                        "build's, to compare two builds each beside its own Moccasin run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per peer and problem (default 1)")
    parser.add_argument("--json", help="append every run's JSON line to this file")
    args = parser.parse_args()
    moccasin_python()
    with tempfile.TemporaryDirectory(prefix="peers-problems-") as scratch:
        bench(problem_files(args, Path(scratch)), args, Path(args.json) if args.json else None)


if __name__ == "__main__":
    main()
