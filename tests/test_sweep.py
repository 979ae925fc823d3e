"""`onnx-remat sweep`: one point per budget consistent with `remat` at that budget, infeasible budgets with the
minimum, the knee as documented, valid PNG/SVG/JSON outputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image
import onnx
import pytest
from conftest import conv_chain, skip_net

import onnx_remat
import onnx_remat.passes.autodiff.builder
import onnx_remat.resolve
from onnx_remat.cli.main import main
from onnx_remat.core.errors import UsageError
from onnx_remat.core.options import RematOptions
from onnx_remat.pipeline import costed
from onnx_remat.plot import plot_sweep
from onnx_remat.sweep import SweepPoint, find_knee, parse_budgets, sweep


def test_points_match_remat_and_infeasible_budgets_state_the_minimum() -> None:
    model = skip_net()
    result = sweep(model, parse_budgets("100%,min,10%"))
    assert [p.label for p in result.points] == ["100%", "min", "10%"]
    full, low, refused = result.points
    minimum = onnx_remat.remat(model, "min").report
    assert low.budget_bytes == minimum.budget_bytes == low.minimum_bytes
    assert low.predicted_seconds == pytest.approx(minimum.predicted_seconds)
    assert low.recomputations == sum(r.extra_computations for r in minimum.recomputations)
    assert full.overhead == pytest.approx(0) and low.overhead > 0
    assert refused.status == "infeasible" and refused.minimum_bytes == minimum.budget_bytes
    assert refused.budget_bytes == int(0.1 * full.keep_all_bytes) and refused.predicted_seconds is None
    assert result.knee == 0  # the minimum costs more than 5%: the knee is the full budget


def test_sweep_on_two_devices_reports_each_devices_peak_within_its_budget() -> None:
    devices = str(Path(__file__).resolve().parent.parent / "devices" / "ort-cpu+ov-cpu.toml")
    result = sweep(skip_net(), parse_budgets("100%,70%"), RematOptions(devices=devices, cost_model="analytic"))
    for p in result.points:
        assert [name for name, _ in p.device_peak_bytes] == ["ort-cpu", "ov-cpu"]
        percent = float(p.label.rstrip("%")) / 100
        report = onnx_remat.remat(skip_net(), p.label, devices=devices, cost_model="analytic").report
        for (_, peak), usage in zip(p.device_peak_bytes, report.device_usage, strict=True):
            assert peak == usage.peak_bytes <= usage.budget_bytes == int(percent * usage.keep_all_bytes)
        assert p.copies == len(report.copies)
    assert result.points[-1].copies > 0  # at 70% ort-cpu offloads tensors to ov-cpu


def test_measure_on_two_devices_runs_each_devices_segments_on_its_runtime(monkeypatch) -> None:
    """With several devices `measure` times the multi-device execution (run_on_devices), not onnxruntime alone,
    and measures each device's peak."""
    devices = str(Path(__file__).resolve().parent.parent / "devices" / "ort-cpu+ov-cpu.toml")
    runs = []

    def recording(*args, **kwargs):
        runs.append(onnx_remat.run_on_devices(*args, **kwargs))
        return runs[-1]

    def single_runtime(*args, **kwargs):
        raise AssertionError("a multi-device model was measured in onnxruntime alone")

    monkeypatch.setattr("onnx_remat.sweep.run_on_devices", recording)
    monkeypatch.setattr("onnx_remat.sweep.measure_activation_peak", single_runtime)
    options = RematOptions(devices=devices, cost_model="analytic")
    result = sweep(skip_net(), parse_budgets("100%,70%"), options, measure=True, repeats=1)
    assert len(runs) == 2
    for p, run in zip(result.points, runs, strict=True):
        assert p.measured_seconds == run.seconds > 0 and p.measured_activation_bytes is None
        assert p.measured_device_peak_bytes == tuple(run.measured_peak_bytes.items())
        assert [name for name, _ in p.measured_device_peak_bytes] == ["ort-cpu", "ov-cpu"]
        assert all(peak > 0 for name, peak in p.measured_device_peak_bytes if run.segments[name])


def point(budget: int, seconds: float | None, status: str = "optimal") -> SweepPoint:
    return SweepPoint(str(budget), budget, status, 10, 200, seconds, 1.0 if seconds else None)


def test_knee_is_the_smallest_budget_within_the_overhead() -> None:
    points = (point(200, 1.0), point(100, 1.04), point(50, 1.5), point(20, None, "infeasible"))
    assert find_knee(points, 0.05) == 1
    assert find_knee(points, 0.01) == 0
    assert find_knee(points, 1.0) == 2
    assert find_knee(points[2:], 0.05) is None


def test_a_sweep_prepares_once_and_searches_the_minimum_once(monkeypatch) -> None:
    """A train-mode sweep of four budgets builds the train step once and, on one device, searches the minimum budget
    once (each budget through `remat` did both four times); its minimum is the one `remat` gives."""
    calls = {"train step": 0, "minimum": 0}

    def counting(name, function):
        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr("onnx_remat.passes.autodiff.builder.build_training_graph",
                        counting("train step", onnx_remat.passes.autodiff.builder.build_training_graph))
    monkeypatch.setattr("onnx_remat.resolve.minimum_budget", counting("minimum", onnx_remat.resolve.minimum_budget))
    options = RematOptions(mode="train", time_limit=60)  # proven in under a second; a search proving nothing repeats
    result = sweep(conv_chain(depth=2, size=8), parse_budgets("100%,90%,min,5%"), options)
    assert calls == {"train step": 1, "minimum": 1}
    points = {p.label: p for p in result.points}
    assert points["100%"].feasible and points["min"].feasible and not points["5%"].feasible
    least = onnx_remat.remat(conv_chain(depth=2, size=8), "min", options)
    assert calls == {"train step": 2, "minimum": 2}
    assert points["min"].budget_bytes == least.report.budget_bytes == points["5%"].minimum_bytes


@pytest.mark.parametrize("text", ["", " , ", "100%,lots"])
def test_bad_budget_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_budgets(text)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_is_a_valid_image(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"sweep{suffix}"
    plot_sweep(sweep(skip_net(), parse_budgets("100%,75%,min,10%")), path)
    if suffix == ".png":
        assert matplotlib.image.imread(path).shape[0] > 100
    else:
        assert ET.parse(path).getroot().tag.endswith("svg")
    assert sorted(tmp_path.iterdir()) == [path]


def test_cli_writes_table_json_and_plot(tmp_path: Path, skip_path: Path, capsys) -> None:
    out_json, out_png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    code = main(["sweep", str(skip_path), "--budgets", "100%,min,10%", "--json", str(out_json), "--plot", str(out_png)])
    assert code == 0
    data = json.loads(out_json.read_text())
    assert [p["label"] for p in data["points"]] == ["100%", "min", "10%"]
    assert data["knee"] == "100%" and data["knee_overhead"] == 0.05
    assert data["cost_model"] in ("in-graph", "analytic") and data["cost_source"]
    assert data["points"][2]["status"] == "infeasible"
    assert data["points"][2]["minimum_bytes"] == data["points"][1]["budget_bytes"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert "infeasible: minimum" in err and "knee: 100%" in err and f"costs: {data['cost_model']}, " in err


def test_costs_measured_once_get_the_whole_sweeps_time(monkeypatch) -> None:
    """The time limit holds for each budget, and the costs are measured once for all of them: a GPT's sweep at 20 s
    a budget fell back to the roofline (predicted 1.301 ms a step, measured 0.681) where the main command measures."""
    limits = []

    def spy(model, options, devices):
        limits.append(options.time_limit)
        return costed(model, options, devices)

    monkeypatch.setattr("onnx_remat.sweep.costed", spy)
    result = sweep(skip_net(), parse_budgets("100%,50%,min"), RematOptions(time_limit=7.0))
    assert limits == [21.0] and len(result.points) == 3


def test_cli_refuses_existing_outputs(tmp_path: Path, skip_path: Path) -> None:
    out = tmp_path / "sweep.json"
    out.write_text("{}")
    assert main(["sweep", str(skip_path), "--json", str(out)]) == 5
    assert out.read_text() == "{}"


@pytest.mark.slow
def test_cli_measures_activation_peak_and_time(tmp_path: Path) -> None:
    """On 512 KiB activations: the kernel's resident-set counters lag by up to a few hundred KiB per CPU, so a busy
    machine measured the 60 KiB of the small chain fixture as no rise at all."""
    chain_path, out = tmp_path / "chain.onnx", tmp_path / "sweep.json"
    onnx.save(conv_chain(size=128), chain_path)
    assert main(["sweep", str(chain_path), "--budgets", "100%,min", "--measure", "--json", str(out), "-q"]) == 0
    for p in json.loads(out.read_text())["points"]:
        assert p["measured_activation_bytes"] > 0 and p["measured_seconds"] > 0
