"""`onnx-remat max-batch`: the batch found fits and the next one does not; the model written has that batch."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import onnx
import pytest
from conftest import conv_chain

import onnx_remat
from onnx_remat.batch import batch_inputs, max_batch
from onnx_remat.cli.main import main
from onnx_remat.core.errors import ModelError

BUDGET = 2**20


@pytest.fixture
def batched_path(tmp_path: Path) -> Path:
    path = tmp_path / "chain.onnx"
    onnx.save(conv_chain(batch="batch"), path)
    return path


def shape(batch: int) -> dict[str, tuple[int, ...]]:
    return {"input": (batch, 8, 16, 16)}


def test_largest_batch_fits_and_the_next_does_not() -> None:
    model = conv_chain(batch="batch")
    found = max_batch(model, BUDGET)
    assert found.batch and found.batch > 1
    assert found.result.report.predicted_peak_bytes <= BUDGET
    assert found.result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == found.batch
    with pytest.raises(onnx_remat.InfeasibleBudgetError):
        onnx_remat.remat(model, BUDGET, input_shapes=shape(found.batch + 1))
    tried = [t.batch for t in found.trials]
    doubling = [b for b in tried if b & (b - 1) == 0]
    assert tried[: len(doubling)] == [2**i for i in range(len(doubling))]
    assert all(t.fits == (t.batch <= found.batch) for t in found.trials)


def test_each_batch_is_prepared_and_searched_once_and_only_the_answer_rewritten(monkeypatch) -> None:
    """Every batch tried is prepared once and its minimum searched once (its shapes differ); the rewrite runs once,
    for the largest batch that fits."""
    calls = {"prepare": 0, "minimum": 0, "rewrite": 0}

    def counting(name, function):
        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    for name, target in [("prepare", "onnx_remat.pipeline.prepare"), ("minimum", "onnx_remat.resolve.minimum_budget"),
                         ("rewrite", "onnx_remat.pipeline.rewrite")]:
        module, attribute = target.rsplit(".", 1)
        monkeypatch.setattr(target, counting(name, getattr(importlib.import_module(module), attribute)))
    found = max_batch(conv_chain(batch="batch"), BUDGET, limit=8)
    assert calls == {"prepare": len(found.trials), "minimum": len(found.trials), "rewrite": 1}
    assert found.result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == found.batch


def test_limit_caps_the_search() -> None:
    found = max_batch(conv_chain(batch="batch"), BUDGET, limit=3)
    assert found.batch == 3 and max(t.batch for t in found.trials) == 3


def test_fixed_batch_is_a_model_error() -> None:
    model = conv_chain(batch=1)
    assert batch_inputs(model) == []
    with pytest.raises(ModelError, match="symbolic first"):
        max_batch(model, BUDGET)


def test_cli_prints_trials_and_writes_model_and_report(tmp_path: Path, batched_path: Path, capsys) -> None:
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert main(["max-batch", str(batched_path), "--budget", "1MiB", "-o", str(out), "--report", str(report)]) == 0
    err = capsys.readouterr().err
    batch = int(err.split("largest batch within 1.0 MiB: ")[1].split()[0])
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == batch
    assert json.loads(report.read_text())["predicted_peak_bytes"] <= BUDGET


@pytest.mark.parametrize(("budget", "code"), [("50%", 2), ("min", 2), ("1KiB", 4)])
def test_cli_refuses_relative_budgets_and_reports_when_nothing_fits(batched_path: Path, budget: str, code: int) -> None:
    assert main(["max-batch", str(batched_path), "--budget", budget]) == code


def test_cli_fixed_batch_exits_3(chain_path: Path) -> None:
    assert main(["max-batch", str(chain_path), "--budget", "1MiB"]) == 3
