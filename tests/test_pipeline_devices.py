"""The pipeline on several devices: device files, per-device budgets, profiled costs, MPS and problem files."""

from __future__ import annotations

from pathlib import Path

import highspy
import numpy as np
import onnx
import pytest
from conftest import PROOF_SECONDS, conv_chain, mixed_only_budgets, skip_net, whole_gradient_groups

import onnx_remat
from onnx_remat.cli.main import main
from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import InfeasibleBudgetError, UsageError
from onnx_remat.core.schedule import Compute, Copy
from onnx_remat.passes.execute import random_feeds, run
from onnx_remat.passes.simulate import check_schedule
from onnx_remat.passes.solve import solve
from onnx_remat.passes.solve.checkmate_milp import build_model
from onnx_remat.pipeline import costed_problem, prepare
from onnx_remat.problem_file import read_problem

TWO_ENGINES = str(Path(__file__).resolve().parent.parent / "devices" / "ort-cpu+ov-cpu.toml")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("costs")


@pytest.fixture(scope="module")
def profiled(cache) -> onnx_remat.RematResult:
    """skip_net on the two CPU engines with measured costs, ort-cpu at 80% of keep-all, ov-cpu at 100%."""
    return onnx_remat.remat(skip_net(), "ort-cpu=80%,ov-cpu=100%", devices=TWO_ENGINES, cache_dir=cache,
                            cost_model="profiled")


def test_two_devices_with_profiled_costs(profiled):
    problem, report = profiled.problem, profiled.report
    assert problem.devices == ("ort-cpu", "ov-cpu")
    assert profiled.profiled is not None and not profiled.profiled.from_cache
    assert problem.cost == tuple(profiled.profiled.cost[name] for name in problem.devices)
    assert problem.budgets == (int(0.8 * problem.keep_all_bytes(0)), problem.keep_all_bytes(1))
    simulation = check_schedule(problem, profiled.schedule)
    assert all(peak <= budget for peak, budget in zip(simulation.peak_bytes, problem.budgets, strict=True))
    assert [usage.name for usage in report.device_usage] == ["ort-cpu", "ov-cpu"]
    fitting = [b.seconds for b in report.baselines.values() if b.within_budget]
    assert fitting and report.predicted_seconds <= min(fitting) * (1 + 1e-9)
    assert len(profiled.minimum_bytes) == 2


def test_two_device_model_computes_what_the_original_does(profiled):
    original = skip_net()
    tags = {p.value for node in profiled.model.graph.node for p in node.metadata_props if p.key == "onnx_remat.device"}
    assert tags <= {"ort-cpu", "ov-cpu"}
    feeds = random_feeds(original, seed=0)
    for got, want in zip(run(profiled.model, feeds), run(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_two_device_model_runs_on_both_engines_within_its_budgets(profiled):
    """Whatever placement the measured costs lead to (copies or none), the model runs on its devices."""
    feeds = random_feeds(skip_net(), seed=0)
    result = onnx_remat.run_on_devices(profiled.model, TWO_ENGINES, feeds, repeats=1)
    np.testing.assert_allclose(result.outputs["output"], run(skip_net(), feeds)[0], rtol=1e-5, atol=1e-5)
    assert result.budgets == dict(zip(profiled.problem.devices, profiled.problem.budgets, strict=True))
    assert result.within_budgets


def test_second_run_takes_the_costs_from_the_cache(profiled, cache):
    again = onnx_remat.remat(skip_net(), "ort-cpu=80%,ov-cpu=100%", devices=TWO_ENGINES, cache_dir=cache,
                            cost_model="profiled")
    assert again.profiled is not None and again.profiled.from_cache
    assert again.problem.cost == profiled.problem.cost


def test_one_budget_for_all_and_budgets_from_the_device_file(tmp_path):
    both = onnx_remat.remat(conv_chain(), "70%", devices=TWO_ENGINES, cost_model="analytic")
    assert both.problem.budgets == tuple(int(0.7 * both.problem.keep_all_bytes(d)) for d in range(2))
    path = tmp_path / "devices.toml"
    path.write_text(
        '[[device]]\nname = "a"\nruntime = "onnxruntime"\nbudget = "60%"\n\n'
        '[[device]]\nname = "b"\nruntime = "openvino"\nbudget = "1MiB"\n'
    )
    from_file = onnx_remat.remat(conv_chain(), None, devices=path, cost_model="analytic")
    assert from_file.problem.budgets == (int(0.6 * from_file.problem.keep_all_bytes(0)), 2**20)
    overridden = onnx_remat.remat(conv_chain(), "b=70%", devices=path, cost_model="analytic")
    assert overridden.problem.budgets[1] == int(0.7 * overridden.problem.keep_all_bytes(1))


def test_default_is_one_cpu_device_with_analytic_costs():
    result = onnx_remat.remat(conv_chain(), "cpu=100%")
    assert result.problem.devices == ("cpu",) and result.profiled is None


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ("gpu=1GiB", "names device 'gpu', but the devices are ort-cpu, ov-cpu"),
        ("ort-cpu=1GiB", "device 'ov-cpu' has no budget"),
        ("ort-cpu=lots,ov-cpu=1GiB", "cannot read budget 'lots'"),
    ],
)
def test_budget_errors_name_the_device(budget, message):
    with pytest.raises(UsageError, match=message):
        onnx_remat.remat(conv_chain(), budget, devices=TWO_ENGINES, cost_model="analytic")


def test_budget_below_a_devices_minimum_states_it():
    with pytest.raises(InfeasibleBudgetError) as info:
        onnx_remat.remat(conv_chain(), "ort-cpu=1KiB,ov-cpu=1KiB", devices=TWO_ENGINES, cost_model="analytic")
    minimum = info.value.minimum_bytes
    assert minimum is not None and f"{minimum} bytes" in str(info.value)
    assert "device ort-cpu" in str(info.value)
    result = onnx_remat.remat(
        conv_chain(), {"ort-cpu": minimum, "ov-cpu": "1KiB"}, devices=TWO_ENGINES, cost_model="analytic"
    )
    assert check_schedule(result.problem, result.schedule).peak_bytes[0] <= minimum


def test_a_device_given_next_to_nothing_is_left_out():
    """ort-cpu at 1 KiB, ov-cpu at its keep-all: everything runs on ov-cpu, and ort-cpu, which loads no parameter
    then, holds nothing (counting every parameter on every device refused the budget)."""
    result = onnx_remat.remat(conv_chain(), "ort-cpu=1KiB,ov-cpu=100%", devices=TWO_ENGINES, cost_model="analytic")
    assert {c.device for c in result.schedule.computes} == {1}
    assert check_schedule(result.problem, result.schedule).peak_bytes[0] == 0


def test_min_budget_per_device():
    result = onnx_remat.remat(conv_chain(), "ort-cpu=min,ov-cpu=100%", devices=TWO_ENGINES, cost_model="analytic")
    assert result.problem.budgets[0] == result.minimum_bytes[0]


@pytest.mark.slow
def test_mixed_budgets_below_each_single_device_minimum(cache):
    """A training chain on the two engines: each budget below what its device needs alone, yet a mixed schedule fits."""
    devices = get_devices(TWO_ENGINES)
    prepared = whole_gradient_groups(prepare(conv_chain(depth=3), "train"))
    problem = costed_problem(prepared, devices, "profiled", cache).problem
    mixed, _ = mixed_only_budgets(problem)
    result = solve(mixed, time_limit=PROOF_SECONDS)
    simulation = check_schedule(mixed, result.schedule)
    assert all(peak <= budget for peak, budget in zip(simulation.peak_bytes, mixed.budgets, strict=True))
    used = {e.device for e in result.schedule.events if isinstance(e, Compute)} | {
        e.target for e in result.schedule.events if isinstance(e, Copy)}
    assert used == {0, 1}  # computing on both, or keeping tensors on the other


def test_cli_devices_emit_mps_and_problem(tmp_path, capsys):
    source = tmp_path / "chain.onnx"
    onnx.save(conv_chain(), source)
    mps, problem_file = tmp_path / "chain.mps", tmp_path / "chain.json"
    code = main(
        [
            str(source),
            str(tmp_path / "out.onnx"),
            "--devices",
            TWO_ENGINES,
            "--cost-model",
            "analytic",
            "--budget",
            "ort-cpu=60%,ov-cpu=2MiB",
            "--emit-mps",
            str(mps),
            "--emit-problem",
            str(problem_file),
        ]
    )
    assert code == 0, capsys.readouterr().err
    problem = read_problem(problem_file)
    assert problem.devices == ("ort-cpu", "ov-cpu") and problem.budgets[1] == 2 * 2**20
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    assert h.readModel(str(mps)) == highspy.HighsStatus.kOk
    assert h.getNumCol() == len(build_model(problem).milp.cost)


@pytest.mark.parametrize(
    ("extra", "code", "pattern"),
    [
        (["--devices", TWO_ENGINES, "--budget", "tpu=1GiB"], 2, "names device 'tpu'"),
        (["--devices", "no-such-preset"], 2, "device file no-such-preset does not exist"),
        (
            ["--devices", TWO_ENGINES, "--budget", "ort-cpu=1KiB,ov-cpu=1KiB", "--cost-model", "analytic"],
            4,
            "device ort-cpu: budget 1.0 KiB is below its minimum",
        ),
        (["--budget", "50%", "--emit-mps", "x.lp"], 2, "must end in .mps"),
    ],
)
def test_cli_device_errors(tmp_path, capsys, extra, code, pattern):
    source = tmp_path / "chain.onnx"
    onnx.save(conv_chain(), source)
    assert main([str(source), str(tmp_path / "out.onnx"), *extra]) == code
    err = capsys.readouterr().err
    assert pattern in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.onnx").exists()
