"""`onnx-remat run`'s budget verdict through real runs: measured in more fresh processes only near or over a budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import conv_chain
from onnx import TensorProto, helper

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


def bias_free_conv3d() -> onnx.ModelProto:
    """A Conv3d without bias as PyTorch 2.13's dynamo exporter writes it (onnxscript 0.7.2's aten_conv3d): a zero
    bias expanded to [out_channels, 2], which the ONNX checker passes and onnxruntime's Conv refuses when it runs."""
    weight = helper.make_tensor("weight", TensorProto.FLOAT, [4, 2, 1, 1, 1], np.ones(8, np.float32))
    nodes = [
        helper.make_node("Shape", ["weight"], ["channels"], start=0, end=1),
        helper.make_node("Constant", [], ["two"], value_ints=[2]),
        helper.make_node("Concat", ["channels", "two"], ["bias_shape"], axis=0),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Expand", ["zero", "bias_shape"], ["bias"]),
        helper.make_node("Conv", ["input", "weight", "bias"], ["output"], name="node_conv3d"),
    ]
    graph = helper.make_graph(nodes, "conv3d", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                              [1, 2, 3, 3, 3])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 3, 3, 3])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_node_onnxruntime_cannot_run_is_named_in_one_line_exit_3(tmp_path, capsys):
    """Rewritten with the roofline (nothing run), the model fails in `run`: the node is named, never a traceback."""
    path = tmp_path / "conv3d.remat.onnx"
    onnx_remat.remat(bias_free_conv3d(), "100%", cost_model="analytic").save(path)
    code = main(["run", str(path), "--devices", "cpu", "--repeats", "1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3, err
    assert "onnxruntime cannot run node 'node_conv3d' (Conv): " in err
    assert "bias must be a 1D tensor of size output_channels (4)" in err


def test_measuring_costs_of_a_node_onnxruntime_cannot_run_exits_3(tmp_path, capsys):
    """Asked for measured costs, the rewrite stops at the node onnxruntime refuses (by default the roofline serves)."""
    source = tmp_path / "conv3d.onnx"
    onnx.save(bias_free_conv3d(), source)
    code = main([str(source), str(tmp_path / "out.onnx"), "--budget", "100%", "--cost-model", "in-graph", "-q"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3, err
    assert "onnxruntime cannot run node 'node_conv3d' (Conv)" in err
