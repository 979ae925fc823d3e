"""The CLI end to end: a good run, and every kind of bad input with its exit code and no output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import conv_chain
from onnx import TensorProto, numpy_helper

from onnx_remat.cli.arguments import training_options
from onnx_remat.cli.main import command_module, main
from onnx_remat.core.options import TrainingOptions
from onnx_remat.passes.execute import random_feeds, run


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
        [sys.executable, "-m", "onnx_remat.cli.main", str(chain_path), str(out), "--budget", "100%"],
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
    files = {"missing": tmp_path / "missing.onnx", "text": text, "truncated": truncated,
             "invalid": invalid, "symbolic": symbolic}
    for case, batch in (("negative", -2), ("empty", 0)):
        files[case] = tmp_path / f"{case}.onnx"
        model = conv_chain()
        for value in (model.graph.input[0], model.graph.output[0]):
            value.type.tensor_type.shape.dim[0].dim_value = batch
        onnx.save(model, files[case])
    return files


@pytest.mark.parametrize(
    ("case", "pattern"),
    [
        ("missing", "does not exist"),
        ("text", "not a readable ONNX model"),
        ("truncated", "not a readable ONNX model|fails the ONNX checker|no nodes"),
        ("invalid", "fails the ONNX checker: .* node: name: relu0 OpType: Relu is not output"),
        ("symbolic", "--input-shape input=1x8x16x16"),
        ("negative", r"tensor 'input' with a negative dimension \[-2, 8, 16, 16\]"),
        ("empty", "input 'input' an empty shape 0x8x16x16"),
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
        (["--budget", "50%", "--input-shape", "input=1xAx3"], 2, "cannot read --input-shape"),
        (["--budget", "1KiB"], 4, r"minimum feasible budget .* \(\d+ bytes"),
        (["--budget", "-5%"], 2, "budget '-5%' is negative"),
        (["--budget=-5%"], 2, "budget '-5%' is negative"),
    ],
)
def test_bad_arguments(capsys, chain_path, tmp_path, extra, code, pattern):
    out = tmp_path / "out.onnx"
    got, err = run_cli(capsys, chain_path, out, *extra)
    assert got == code
    assert re.search(pattern, err), err
    assert not out.exists()


def test_a_mistyped_command_is_named_and_never_taken_for_the_input(capsys, chain_path, tmp_path):
    out = tmp_path / "out.onnx"
    code, err = run_cli(capsys, "swep", chain_path, out, "--budget", "50%")
    assert code == 2
    assert err.strip() == "onnx-remat: error: no command or file 'swep': did you mean `onnx-remat sweep ...`?"
    assert not out.exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_output_equal_to_input_is_refused_even_with_force(capsys, chain_path, force):
    before = chain_path.read_bytes()
    code, err = run_cli(capsys, chain_path, chain_path, "--budget", "100%", *force)
    assert code == 5 and "is also the input" in err
    assert chain_path.read_bytes() == before


@pytest.mark.parametrize("which", ["--report", "--netron-attachment", "--plot"])
def test_outputs_that_repeat_each_other_are_refused_before_any_work(capsys, chain_path, tmp_path, which):
    out = tmp_path / "out.onnx"
    same = tmp_path / ("same.png" if which == "--plot" else "same.json")
    code, err = run_cli(capsys, chain_path, out, "--budget", "100%", "--report", same, which, same, "--force")
    if which == "--report":  # argparse keeps the last --report: only one path, nothing repeated
        assert code == 0
        return
    assert code == 5 and f"output {same} is also output {same}" in err
    assert not out.exists() and not same.exists()


def test_an_output_that_is_not_a_regular_file_is_refused_even_with_force(capsys, chain_path, tmp_path):
    """onnx-remat once replaced the null device with its model when run as root with --force."""
    code, err = run_cli(capsys, chain_path, "/dev/null", "--budget", "100%", "--force")
    assert code == 5 and "is not a regular file" in err
    assert Path("/dev/null").is_char_device()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, err = run_cli(capsys, chain_path, tmp_path / "out.onnx", "--budget", "100%", "--report", fifo, "--force")
    assert code == 5 and "is not a regular file" in err and not (tmp_path / "out.onnx").exists()


def test_a_failure_while_writing_leaves_no_output(capsys, chain_path, tmp_path, monkeypatch):
    """All or none: the report failing to be written takes the model with it, and no temporary file stays."""
    import onnx_remat.core.files as files

    real_replace = os.replace

    def fail_on_report(source, target):
        if str(target).endswith(".json"):
            raise OSError(28, "No space left on device", str(target))
        real_replace(source, target)

    monkeypatch.setattr(files.os, "replace", fail_on_report)
    code, err = run_cli(capsys, chain_path, tmp_path / "out.onnx", "--budget", "100%", "--report",
                        tmp_path / "r.json")
    assert code == 5 and "No space left on device" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [chain_path.name]


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


def _with_ops(model: onnx.ModelProto, ops: dict[int, tuple[str, str]]) -> onnx.ModelProto:
    """conv_chain's Relus at those node indices turned into (op type, name), at opset 19: CenterCropPad keeps the
    (1, 8, 16, 16) shape, DeformConv is a 1x1 kernel with zero offsets; neither has a gradient rule."""
    model.opset_import[0].version = 19
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array([1, 8, 16, 16], np.int64), "crop.shape"),
        numpy_helper.from_array(np.eye(8, dtype=np.float32).reshape(8, 8, 1, 1), "deform.w"),
        numpy_helper.from_array(np.zeros((1, 2, 16, 16), np.float32), "deform.offset")])
    extra = {"CenterCropPad": ["crop.shape"], "DeformConv": ["deform.w", "deform.offset"], "Gelu": []}
    for index, (op, name) in ops.items():
        node = model.graph.node[index]
        node.op_type, node.name = op, name
        node.input.extend(extra[op])
    return model


def _bad_training_models(tmp_path, capsys) -> dict[str, tuple[onnx.ModelProto, list[str]]]:
    """Issue 3's bad inputs to train mode: each model and the options that make it bad."""
    no_parameters = conv_chain(depth=1)
    no_parameters.graph.ClearField("initializer")
    no_parameters.graph.ClearField("node")
    no_parameters.graph.node.append(onnx.helper.make_node("Relu", ["input"], ["output"], name="relu0"))
    no_rule = _with_ops(conv_chain(depth=2), {1: ("CenterCropPad", "crop0")})  # a float op with no rule
    integer = conv_chain(depth=1)
    integer.graph.node.append(onnx.helper.make_node("Cast", ["output"], ["rounded"], name="cast", to=TensorProto.INT64))
    integer.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("rounded", TensorProto.INT64, [1, 8, 16, 16]))
    many_rules = _with_ops(conv_chain(depth=4), {  # two CenterCropPads, a DeformConv, a custom-domain op: each type
        1: ("CenterCropPad", "crop0"), 3: ("DeformConv", "deform0"), 5: ("CenterCropPad", "crop1"),  # listed once
        7: ("Gelu", "gelu0")})
    many_rules.graph.node[7].domain = "com.example"
    many_rules.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    integer_inside = conv_chain(depth=2)  # w0 reaches the float output only through an int64 cast and back
    integer_inside.graph.node[2].input[0] = "r0.float"
    integer_inside.graph.node.insert(2, onnx.helper.make_node("Cast", ["r0.int"], ["r0.float"], name="back", to=1))
    integer_inside.graph.node.insert(2, onnx.helper.make_node("Cast", ["r0"], ["r0.int"], name="round", to=7))
    source = tmp_path / "chain.onnx"
    onnx.save(conv_chain(depth=2), source)
    assert run_cli(capsys, source, tmp_path / "trained.onnx", "--mode", "train", "--no-remat")[0] == 0
    return {
        "no parameters": (no_parameters, []),
        "target cannot match": (conv_chain(depth=2), ["--loss", "cross-entropy"]),
        "no gradient rule": (no_rule, []),
        "no gradient rule, several ops": (many_rules, []),
        "integer-only path": (integer, []),
        "integer-only path inside": (integer_inside, []),
        "already a training model": (onnx.load(tmp_path / "trained.onnx"), []),
    }


@pytest.mark.parametrize(
    ("case", "pattern"),
    [
        ("no parameters", "no trainable parameters"),
        ("target cannot match", r"cross-entropy needs an output of shape \[batch, classes\], not \[1, 8, 16, 16\]"),
        ("no gradient rule", r"no gradient rule for these op types: CenterCropPad \(e\.g\. node 'crop0'\)"),
        ("no gradient rule, several ops",
         r"no gradient rule for these op types: CenterCropPad \(e\.g\. node 'crop0'\); "
         r"DeformConv \(e\.g\. node 'deform0'\); "
         r"com\.example\.Gelu \(e\.g\. node 'gelu0'\)$"),
        ("integer-only path", "integer-only path has no gradient"),
        ("integer-only path inside", "integer-only path has no gradient: parameter w0 reaches the loss only through "
         "integer tensors \\(at node 'round'\\)"),
        ("already a training model", "already contains training parts"),
    ],
)
@pytest.mark.parametrize("how", [("--budget", "100%"), ("--no-remat",)], ids=["remat", "no-remat"])
def test_bad_training_models_exit_3_without_output(capsys, tmp_path, case, pattern, how):
    model, options = _bad_training_models(tmp_path, capsys)[case]
    path, out = tmp_path / "bad.onnx", tmp_path / "out.onnx"
    onnx.save(model, path)
    code, err = run_cli(capsys, path, out, "--mode", "train", *how, *options)
    assert code == 3, err
    assert re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_no_remat_needs_train_mode(capsys, chain_path, tmp_path):
    code, err = run_cli(capsys, chain_path, tmp_path / "out.onnx", "--no-remat")
    assert code == 2 and "--mode train" in err


@pytest.mark.parametrize("command", [[], ["sweep"], ["max-batch"], ["solve"]])
def test_an_unknown_solver_exits_2_naming_the_choices(capsys, chain_path, tmp_path, command):
    with pytest.raises(SystemExit) as info:
        main([*command, str(chain_path), str(tmp_path / "out.onnx"), "--budget", "50%", "--solver", "gurobi"])
    assert info.value.code == 2
    assert "unknown solver 'gurobi': choose one of auto, highs, cbc, cpsat" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["sweep"], ["max-batch"]])
def test_sweep_and_max_batch_take_the_train_step_options(command):
    """A train-mode sweep used MSE whatever the user wanted: the options were not there to give."""
    args = command_module(command[0]).build_parser().parse_args(
        ["m.onnx", "--budget", "1GiB", "--mode", "train", "--loss", "cross-entropy", "--freeze", "w*",
         "--optimizer", "sgd", "--lr", "0.5"])
    assert training_options(args) == TrainingOptions("cross-entropy", ("w*",), "sgd", 0.5)


@pytest.mark.parametrize("command", [[], ["sweep"], ["max-batch"], ["solve"]])
@pytest.mark.parametrize("limit", ["nan", "inf", "0", "-1", "1e308"])
def test_time_limits_that_are_not_a_positive_finite_time_exit_2(capsys, chain_path, tmp_path, command, limit):
    with pytest.raises(SystemExit) as info:
        main([*command, str(chain_path), str(tmp_path / "out.onnx"), "--budget", "50%", f"--time-limit={limit}"])
    assert info.value.code == 2
    assert "is not a number of seconds" in capsys.readouterr().err
    assert not (tmp_path / "out.onnx").exists()


def test_weights_kept_in_an_external_file_stay_external_in_the_output(capsys, tmp_path):
    """As PyTorch's dynamo exporter writes them: `model.onnx` + `model.onnx.data`; the output keeps that form."""
    model = conv_chain(depth=3, channels=16)
    source = tmp_path / "model.onnx"
    onnx.save(conv_chain(depth=3, channels=16), source, save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    out = tmp_path / "out.onnx"
    code, err = run_cli(capsys, source, out, "--budget", "100%")
    assert code == 0, err
    assert (tmp_path / "out.onnx.data").stat().st_size > 0
    written = onnx.load(out, load_external_data=False)
    assert any(init.data_location == TensorProto.EXTERNAL for init in written.graph.initializer)
    feeds = random_feeds(model)
    np.testing.assert_allclose(run(str(out), feeds)[0], run(model, feeds)[0], rtol=1e-6)
    (tmp_path / "model.onnx.data").unlink()
    code, err = run_cli(capsys, source, tmp_path / "again.onnx", "--budget", "100%")
    assert code == 3 and "keep the data file beside the model" in err and len(err.strip().splitlines()) == 1


def test_a_bad_cost_cache_entry_is_one_warning_line_and_the_run_succeeds(capsys, chain_path, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    devices = tmp_path / "cpu.toml"  # the cpu preset with its threads pinned, as conftest.CPU_TWO_THREADS
    devices.write_text('[[device]]\nname = "cpu"\nruntime = "onnxruntime"\nprovider = "CPUExecutionProvider"\n'
                       "threads = 2\n")
    args = [chain_path, tmp_path / "out.onnx", "--budget", "80%", "--devices", devices, "--cost-model", "profiled",
            "--force"]
    assert run_cli(capsys, *args)[0] == 0
    (entry,) = (tmp_path / "cache").rglob("costs-*.json")
    entry.write_text("{")
    code, err = run_cli(capsys, *args)
    assert code == 0, err
    warning = [line for line in err.splitlines() if "warning" in line]
    assert warning == [f"onnx-remat: warning: cost cache entry {entry} is unusable "
                       "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)): measuring again"]
    assert json.loads(entry.read_text())["devices"] == ["cpu"]


def test_sizes_no_machine_holds_are_refused_before_any_work(capsys, tmp_path):
    symbolic = tmp_path / "symbolic.onnx"
    onnx.save(conv_chain(batch="N"), symbolic)
    out = tmp_path / "out.onnx"
    code, err = run_cli(capsys, symbolic, out, "--budget", "50%", "--input-shape", "input=99999999999999999999x8x16x16")
    assert code == 2 and "positive sizes below 4611686018427387904" in err
    code, err = run_cli(capsys, symbolic, out, "--budget", "50%", "--input-shape", "input=10000000x8x16x16",
                        "--cost-model", "profiled")
    assert code == 3 and re.search(r"'conv\d' needs 305.2 GiB, more than the [\d.]+ GiB this machine has", err), err
    assert not out.exists()


def test_the_time_limit_counts_from_the_command_start(capsys, monkeypatch, chain_path, tmp_path):
    """A command whose start (before the runtimes' imports) was the whole time limit ago has no time left to measure
    costs: it falls back to the rooflines, and still writes a schedule."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    code = main([str(chain_path), str(out), "--budget", "100%", "--cost-model", "in-graph", "--time-limit", "60",
                 "--report", str(report)], started=time.perf_counter() - 60)
    assert code == 0 and out.exists()
    assert json.loads(report.read_text())["cost_source"].startswith("roofline estimates: measuring in-graph costs")
