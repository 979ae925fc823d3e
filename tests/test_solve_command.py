"""`onnx-remat solve FILE.json`: solves a problem file, prints the comparison, writes the report; bad input exits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from test_multidevice import problem as multi_problem
from test_solver import training_chain

from onnx_remat.cli.main import main
from onnx_remat.core.schedule import Compute, Copy, Free, Schedule
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.problem_file import read_problem, write_problem


def run_cli(capsys, *args) -> tuple[int, str]:
    code = main(["solve", *map(str, args)])
    return code, capsys.readouterr().err


def chain_file(tmp_path: Path) -> Path:
    chain = training_chain(4)
    path = tmp_path / "chain.json"
    write_problem(replace(chain, budgets=(chain.keep_all_bytes() // 2,)), path)
    return path


def replayed(report: dict) -> Schedule:
    kinds = {"compute": Compute, "free": Free, "copy": Copy}
    return Schedule(tuple(kinds[e.pop("kind")](**e) for e in report["schedule"]))


def test_solves_prints_and_writes_a_checked_report(capsys, tmp_path: Path):
    path, out = chain_file(tmp_path), tmp_path / "report.json"
    code, err = run_cli(capsys, path, "--solver", "cbc", "--report", out)
    assert code == 0, err
    for text in ("cbc optimal", "objective", "bound", "gap 0.00%", "keep-all", "chen-sqrt-n", "best single device"):
        assert text in err
    report = json.loads(out.read_text())
    problem = read_problem(path)
    simulation = check_schedule(problem, replayed(report))
    assert report["status"] == "optimal" and report["objective"] == simulation.total_cost
    assert report["objective"] <= min(b["seconds"] for b in report["baselines"].values() if b["fits"])


def test_budget_override_per_device_and_min(capsys, tmp_path: Path):
    p = multi_problem([(0, 1), (1, 2)], [10, 1, 1], [[1, 1, 10], [10, 10, 100]], [100, 100])
    path, out = tmp_path / "two.json", tmp_path / "report.json"
    write_problem(p, path)
    code, err = run_cli(capsys, path, "--budget", "dev0=min,dev1=50B", "--report", out)
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["budget_bytes"][1] == 50 and report["peak_bytes"][0] == report["budget_bytes"][0]
    assert report["solver"] == "highs"


def test_bad_input_exit_codes(capsys, tmp_path: Path):
    path = chain_file(tmp_path)
    (tmp_path / "bad.json").write_text("[]")
    assert run_cli(capsys, tmp_path / "bad.json")[0] == 3
    assert run_cli(capsys, path, "--budget", "nodevice=1MiB")[0] == 2
    code, err = run_cli(capsys, path, "--budget", "10B")
    assert code == 4 and "is below the minimum feasible budget" in err  # as the main command says it
    (tmp_path / "exists.json").write_text("")
    assert run_cli(capsys, path, "--report", tmp_path / "exists.json")[0] == 5
