"""The default cost model: this machine's own (in-graph onnxruntime costs), measured once and cached, the roofline
when measuring fails; the report says which. No timed assertions: measuring is counted, not clocked."""

from __future__ import annotations

import json

import pytest
from conftest import CPU_TWO_THREADS, conv_chain

import onnx_remat
from onnx_remat.core.errors import UsageError
from onnx_remat.core.options import COST_MODEL_VARIABLE
from onnx_remat.passes import cost_profiled
from onnx_remat.passes.simulate import simulate
from onnx_remat.pipeline import default_cost_model


@pytest.fixture
def measurements(monkeypatch) -> list[int]:
    """The default unpinned (conftest pins the roofline), and a list that grows by one per measurement."""
    monkeypatch.delenv(COST_MODEL_VARIABLE)
    calls: list[int] = []
    measure = cost_profiled._measure

    def counted(*args, **kwargs):
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(cost_profiled, "_measure", counted)
    return calls


def test_default_costs_are_measured_once_then_read_from_the_cache_and_retimed(measurements, tmp_path):
    first = onnx_remat.remat(conv_chain(), "80%", devices=CPU_TWO_THREADS, cache_dir=tmp_path)
    report = first.report
    assert report.cost_model == "in-graph" and first.profiled is not None and not first.profiled.from_cache
    assert report.cost_source == "measured cpu on this machine" and len(measurements) == 1
    assert first.problem.cost == (first.profiled.cost["cpu"],)
    overhead = first.profiled.run_overhead_seconds["cpu"]
    assert report.run_overhead_seconds == overhead > 0
    predicted = simulate(first.problem, first.schedule).total_cost + overhead
    assert report.predicted_seconds == pytest.approx(predicted * report.load_ratio) and report.load_ratio > 0
    assert report.keep_all_seconds == pytest.approx(sum(first.problem.cost[0]) + overhead)
    assert "costs        in-graph: measured cpu on this machine" in report.summary()
    assert ("for the load a run that long meets now" in report.summary()) == (report.load_ratio != 1)
    assert json.loads(report.to_json())["cost_model"] == "in-graph"
    [entry] = tmp_path.glob("costs-*.json")
    written = entry.stat().st_mtime_ns

    again = onnx_remat.remat(conv_chain(), "80%", devices=CPU_TWO_THREADS, cache_dir=tmp_path)
    assert len(measurements) == 1 and entry.stat().st_mtime_ns == written
    assert again.profiled is not None and again.profiled.from_cache and again.profiled.retimed is not None
    scale = again.profiled.retimed["cpu"]
    assert again.problem.cost[0] == pytest.approx([scale * c for c in first.problem.cost[0]])
    assert again.report.cost_source == (f"read from the cache of cpu on this machine, scaled x{scale:.2f} to "
                                        "whole-model runs timed now")


def test_default_falls_back_to_the_roofline_when_measuring_fails(monkeypatch, tmp_path):
    monkeypatch.delenv(COST_MODEL_VARIABLE)

    def fail(*args, **kwargs):
        raise RuntimeError("no runtime here")

    monkeypatch.setattr(cost_profiled, "_measure", fail)
    result = onnx_remat.remat(conv_chain(), "80%", devices=CPU_TWO_THREADS, cache_dir=tmp_path)
    report = result.report
    assert result.profiled is None and report.cost_model == "analytic" and report.run_overhead_seconds == 0
    assert report.load_ratio == 1.0
    assert report.cost_source == "roofline estimates: measuring in-graph costs failed (no runtime here)"
    analytic = onnx_remat.remat(conv_chain(), "80%", devices=CPU_TWO_THREADS, cost_model="analytic")
    assert result.problem.cost == analytic.problem.cost
    assert "costs        analytic: roofline estimates: measuring in-graph costs failed" in report.summary()
    with pytest.raises(RuntimeError, match="no runtime here"):  # asked for by name: no fallback
        onnx_remat.remat(conv_chain(), "80%", devices=CPU_TWO_THREADS, cost_model="in-graph", cache_dir=tmp_path)


def test_default_cost_model_by_device_count_and_variable(monkeypatch):
    monkeypatch.delenv(COST_MODEL_VARIABLE)
    assert default_cost_model(1) == "in-graph" and default_cost_model(2) == "profiled"
    monkeypatch.setenv(COST_MODEL_VARIABLE, "analytic")
    assert default_cost_model(1) == "analytic"
    monkeypatch.setenv(COST_MODEL_VARIABLE, "guessed")
    with pytest.raises(UsageError, match=f"{COST_MODEL_VARIABLE} is 'guessed'"):
        default_cost_model(1)
