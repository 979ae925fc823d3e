"""`onnx-remat run`'s budget verdict through real runs: measured in more fresh processes only near or over a budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import conv_chain

import onnx_remat
from onnx_remat.cli.main import main


@pytest.fixture(scope="module")
def chain_path(tmp_path_factory) -> Path:
    """A conv chain rewritten for one CPU at keep-all, saved."""
    path = tmp_path_factory.mktemp("run") / "chain.remat.onnx"
    onnx_remat.remat(conv_chain(), "100%", cost_model="analytic").save(path)
    return path


def test_a_peak_far_below_its_budget_is_measured_in_one_process(chain_path, capsys):
    assert main(["run", str(chain_path), "--devices", "cpu", "--budget", "cpu=1GiB", "--repeats", "1"]) == 0
    err = capsys.readouterr().err
    assert "(1 fresh process) (budget 1.00 GiB, within)" in err


def test_a_peak_over_its_budget_in_every_process_exits_8(chain_path, capsys):
    code = main(["run", str(chain_path), "--devices", "cpu", "--budget", "cpu=1KiB", "--repeats", "1",
                 "--memory-processes", "2"])
    err = capsys.readouterr().err
    assert code == 8, err
    assert "over 2 fresh processes) (budget 1.00 KiB, OVER BUDGET)" in err
    assert "cpu went over budget (measured in every process)" in err.strip().splitlines()[-1]


def test_memory_processes_below_one_is_refused(chain_path, capsys):
    assert main(["run", str(chain_path), "--devices", "cpu", "--memory-processes", "0"]) == 2
    assert "memory processes must be at least 1, not 0" in capsys.readouterr().err
