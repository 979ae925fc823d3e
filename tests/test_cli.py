"""The CLI end to end: a good run, and every kind of bad input with its exit code and no output."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import onnx
import pytest
from conftest import conv_chain

from onnx_remat.cli import main


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_good_run_writes_model_report_and_summary(capsys, skip_path, tmp_path):
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    code, err = run_cli(capsys, skip_path, out, "--budget", "75%", "--report", report)
    assert code == 0, err
    onnx.checker.check_model(onnx.load(out), full_check=True)
    data = json.loads(report.read_text())
    assert data["predicted_peak_bytes"] <= data["budget_bytes"]
    for word in ("budget", "peak", "time", "recompute", "solver"):
        assert word in err


def test_quiet_prints_nothing(capsys, chain_path, tmp_path):
    code, err = run_cli(capsys, chain_path, tmp_path / "out.onnx", "--budget", "100%", "-q")
    assert code == 0 and err == ""


def test_console_script_is_installed(chain_path, tmp_path):
    out = tmp_path / "out.onnx"
    done = subprocess.run(
        [sys.executable, "-m", "onnx_remat.cli", str(chain_path), str(out), "--budget", "100%"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file()


def _bad_files(tmp_path):
    text = tmp_path / "text.onnx"
    text.write_text("this is not a model\n")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(conv_chain().SerializeToString()[:300])
    broken = conv_chain()
    broken.graph.node[1].input[0] = "nowhere"
    invalid = tmp_path / "invalid.onnx"
    invalid.write_bytes(broken.SerializeToString())
    symbolic = tmp_path / "symbolic.onnx"
    onnx.save(conv_chain(batch="N"), symbolic)
    return {"missing": tmp_path / "missing.onnx", "text": text, "truncated": truncated,
            "invalid": invalid, "symbolic": symbolic}


@pytest.mark.parametrize(
    ("case", "pattern"),
    [
        ("missing", "does not exist"),
        ("text", "not a readable ONNX model"),
        ("truncated", "not a readable ONNX model|fails the ONNX checker|no nodes"),
        ("invalid", "fails the ONNX checker"),
        ("symbolic", "--input-shape input=1x8x16x16"),
    ],
)
def test_bad_models_exit_3_without_output(capsys, tmp_path, case, pattern):
    out = tmp_path / "out.onnx"
    code, err = run_cli(capsys, _bad_files(tmp_path)[case], out, "--budget", "50%")
    assert code == 3
    assert re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_symbolic_model_runs_with_input_shape(capsys, tmp_path):
    symbolic = tmp_path / "symbolic.onnx"
    onnx.save(conv_chain(batch="N"), symbolic)
    code, err = run_cli(capsys, symbolic, tmp_path / "out.onnx", "--budget", "100%", "--input-shape", "input=2x8x16x16")
    assert code == 0, err


@pytest.mark.parametrize(
    ("extra", "code", "pattern"),
    [
        (["--budget", "lots"], 2, "cannot read budget"),
        (["--budget", "50%", "--solver", "gurobi"], 2, "unknown solver 'gurobi'"),
        (["--budget", "50%", "--input-shape", "input=1xAx3"], 2, "cannot read --input-shape"),
        (["--budget", "1KiB"], 4, r"minimum feasible budget .* \(\d+ bytes"),
    ],
)
def test_bad_arguments(capsys, chain_path, tmp_path, extra, code, pattern):
    out = tmp_path / "out.onnx"
    got, err = run_cli(capsys, chain_path, out, *extra)
    assert got == code
    assert re.search(pattern, err), err
    assert not out.exists()


def test_output_equal_to_input_needs_force(capsys, chain_path):
    before = chain_path.read_bytes()
    code, err = run_cli(capsys, chain_path, chain_path, "--budget", "100%")
    assert code == 5 and "is the input file" in err
    assert chain_path.read_bytes() == before


def test_missing_output_directory(capsys, chain_path, tmp_path):
    code, err = run_cli(capsys, chain_path, tmp_path / "no" / "out.onnx", "--budget", "100%")
    assert code == 5 and "does not exist" in err


def test_existing_output_needs_force(capsys, chain_path, tmp_path):
    out = tmp_path / "out.onnx"
    out.write_text("keep me")
    code, err = run_cli(capsys, chain_path, out, "--budget", "100%")
    assert code == 5 and out.read_text() == "keep me"
    code, err = run_cli(capsys, chain_path, out, "--budget", "100%", "--force")
    assert code == 0, err
    onnx.checker.check_model(onnx.load(out))


def test_no_temporary_files_left(capsys, chain_path, tmp_path):
    run_cli(capsys, chain_path, tmp_path / "out.onnx", "--budget", "1KiB")
    run_cli(capsys, chain_path, tmp_path / "ok.onnx", "--budget", "100%")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.onnx", "ok.onnx"]


def test_train_mode_no_remat_writes_training_graph(capsys, chain_path, tmp_path):
    out = tmp_path / "train.onnx"
    code, err = run_cli(capsys, chain_path, out, "--mode", "train", "--no-remat", "--optimizer", "sgd")
    assert code == 0, err
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    names = {o.name for o in model.graph.output}
    assert {"loss", "grad.w0", "w0.updated"} <= names


def test_train_mode_without_parameters_exits_3(capsys, tmp_path):
    model = conv_chain(depth=1)
    relu = model.graph.node[1]
    model.graph.ClearField("initializer")
    model.graph.ClearField("node")
    model.graph.node.append(onnx.helper.make_node("Relu", ["input"], ["output"], name=relu.name))
    path = tmp_path / "noparams.onnx"
    onnx.save(model, path)
    code, err = run_cli(capsys, path, tmp_path / "out.onnx", "--mode", "train", "--budget", "100%")
    assert code == 3 and "trainable" in err, err
    assert not (tmp_path / "out.onnx").exists()


def test_no_remat_needs_train_mode(capsys, chain_path, tmp_path):
    code, err = run_cli(capsys, chain_path, tmp_path / "out.onnx", "--no-remat")
    assert code == 2 and "--mode train" in err
