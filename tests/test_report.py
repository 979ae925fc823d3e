"""The readable plan: recomputations, copies and per-device time and peak agree with the simulator, on one
device and on two; the summary and JSON say so; the Netron attachment names every node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import skip_net
from test_multidevice import problem

import onnx_remat
from onnx_remat.netron import SIGNATURE, attachment_bytes, default_path
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve import solve
from onnx_remat.report_builder import build_report


def offloading() -> tuple:
    """Two devices; op0 is offloaded to device 1 and copied back rather than recomputed (10 bytes each way)."""
    p = problem([(0, 1), (1, 2), (2, 3), (0, 3)], [10, 10, 10, 1], [[100, 1, 1, 1], [1000, 10, 10, 10]], [25, 100])
    return p, solve(p)


def test_multi_device_report_lists_copies_and_devices() -> None:
    p, result = offloading()
    report = build_report("offload", "infer", p, 21, result)
    simulation = simulate(p, result.schedule)
    assert [(c.op, c.source, c.target, c.bytes) for c in report.copies] == [
        ("op0", "dev0", "dev1", 10),
        ("op0", "dev1", "dev0", 10),
    ]
    assert [c.seconds for c in report.copies] == pytest.approx([1.0, 1.0])
    assert [d.peak_bytes for d in report.device_usage] == list(simulation.peak_bytes)
    assert [d.budget_bytes for d in report.device_usage] == [25, 100]
    assert sum(d.seconds for d in report.device_usage) == pytest.approx(report.predicted_seconds)
    assert report.predicted_seconds == pytest.approx(simulation.total_cost)
    assert report.keep_all_seconds == pytest.approx(103)  # the faster device running every operator once
    assert not report.recomputations
    assert set(report.baselines) == {
        f"{b}@{d}" for b in ("keep-all", "chen-sqrt-n", "frontier-only") for d in p.devices
    }
    summary = report.summary()
    assert "op0: dev0 -> dev1" in summary and "op0: dev1 -> dev0" in summary
    assert "device dev0" in summary and "device dev1" in summary


def test_json_round_trips_the_plan() -> None:
    p, result = offloading()
    report = build_report("offload", "infer", p, 21, result)
    data = json.loads(report.to_json())
    assert len(data["copies"]) == 2
    assert [d["seconds"] for d in data["device_usage"]] == pytest.approx([d.seconds for d in report.device_usage])
    assert data["time_overhead"] == pytest.approx(report.time_overhead)


def test_recomputations_say_bytes_freed_stages_and_time_added() -> None:
    result = onnx_remat.remat(skip_net(), "min")
    report, problem_ = result.report, result.problem
    assert report.recomputations
    for r in report.recomputations:
        op = problem_.op_names.index(r.op)
        assert r.output_bytes == problem_.output_bytes[op]
        assert r.added_seconds == pytest.approx(r.extra_computations * problem_.cost[0][op])
        assert r.freed_stages > 0
    (usage,) = report.device_usage
    assert usage.recomputations == result.schedule.recompute_count()
    assert usage.peak_bytes == report.predicted_peak_bytes <= report.budget_bytes
    assert usage.computations == len(result.schedule.computes)
    assert f"{report.recomputations[0].op}: +{report.recomputations[0].extra_computations}" in report.summary()


def test_netron_attachment_names_every_node(tmp_path: Path) -> None:
    result = onnx_remat.remat(skip_net(), "min")
    data = json.loads(attachment_bytes(result.model, result.problem, result.schedule, result.report))
    assert data["signature"] == SIGNATURE
    names = {node.name for node in result.model.graph.node}
    roles = {i["target"]: i["value"] for i in data["metadata"] if i["kind"] == "node" and i["name"] == "role"}
    assert set(roles) == names
    assert {roles[n] for n in names if "__remat" in n} == {"recompute"}
    memory = [i["value"] for i in data["metrics"] if i["name"] == "device memory after step (bytes)"]
    assert len(memory) == len(names) and max(memory) <= result.report.budget_bytes
    model_items = {i["name"]: i["value"] for i in data["metadata"] if i["kind"] == "model"}
    assert model_items["predicted peak (bytes)"] == result.report.predicted_peak_bytes
    assert all(i["target"] == "" for i in data["metadata"] if i["kind"] == "model")


def test_attachment_default_path_is_beside_the_model() -> None:
    assert default_path("out/model.remat.onnx") == Path("out/model.remat.netron.json")


def test_cli_writes_the_attachment_beside_the_output(tmp_path: Path, skip_path: Path) -> None:
    from onnx_remat.cli.main import main

    out = tmp_path / "out.onnx"
    assert main([str(skip_path), str(out), "--budget", "min", "--netron-attachment", "-q"]) == 0
    assert json.loads((tmp_path / "out.netron.json").read_text())["signature"] == SIGNATURE
    assert main([str(skip_path), str(tmp_path / "b.onnx"), "--budget", "min", "--netron-attachment", "x.txt"]) == 2
