"""Fault injection: malformed models and problem files drawn by hypothesis, and signals at random moments.

Whatever goes in, the command ends with a documented exit code and at most one error line, never a traceback;
on failure it leaves nothing behind; the input is never changed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import pytest
from conftest import conv_chain, skip_net
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_signals import ONNXRUNTIME_SESSION_FILE

from onnx_remat.cli.main import main

DOCUMENTED = {0, 2, 3, 4, 5, 6}
"""Exit codes the main command and `solve` may end with (1 and 7 are bugs; 8 is `run`'s; 130/143/129 signals)."""

NAMES = ("input", "w0", "c0", "r0", "output", "nowhere", "")
OP_TYPES = ("Relu", "Conv", "Add", "MatMul", "Gather", "If", "Loop", "NoSuchOp", "")


def _mutations() -> st.SearchStrategy:
    """One change to a valid model: a field set to a value drawn to be wrong or unusual."""
    return st.one_of(
        st.tuples(st.just("op_type"), st.integers(0, 11), st.sampled_from(OP_TYPES)),
        st.tuples(st.just("input"), st.integers(0, 11), st.sampled_from(NAMES)),
        st.tuples(st.just("output"), st.integers(0, 11), st.sampled_from(NAMES)),
        st.tuples(st.just("dim"), st.integers(0, 3), st.integers(-3, 40)),
        st.tuples(st.just("opset"), st.just(0), st.integers(0, 40)),
        st.tuples(st.just("domain"), st.integers(0, 11), st.sampled_from(("", "com.example", "ai.onnx.ml"))),
        st.tuples(st.just("drop initializer"), st.integers(0, 5), st.just(None)),
        st.tuples(st.just("attribute"), st.integers(0, 11), st.sampled_from(("pads", "kernel_shape", "group"))),
        st.tuples(st.just("elem type"), st.just(0), st.integers(0, 16)),
    )


def _mutated(changes: list[tuple[str, int, object]]) -> bytes:
    model = conv_chain()
    graph = model.graph
    for kind, index, value in changes:
        node = graph.node[index % len(graph.node)]
        if kind == "op_type":
            node.op_type = value
        elif kind in ("input", "output"):
            getattr(node, kind)[0] = value
        elif kind == "dim":
            graph.input[0].type.tensor_type.shape.dim[index].dim_value = value
        elif kind == "opset":
            model.opset_import[0].version = value
        elif kind == "domain":
            node.domain = value
        elif kind == "drop initializer":
            del graph.initializer[index % len(graph.initializer)]
        elif kind == "attribute":
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute(value, [0, 0] if value != "group" else 3))
        elif kind == "elem type":
            graph.input[0].type.tensor_type.elem_type = value
    return model.SerializeToString()


def _byte_faults() -> st.SearchStrategy:
    """Bytes of a valid model cut short, with bytes flipped, or with garbage inserted."""
    valid = skip_net().SerializeToString()
    return st.one_of(
        st.integers(0, len(valid) - 1).map(lambda n: valid[:n]),
        st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)), min_size=1, max_size=8).map(
            lambda flips: _flipped(valid, flips)),
        st.tuples(st.integers(0, len(valid)), st.binary(min_size=1, max_size=64)).map(
            lambda cut: valid[: cut[0]] + cut[1] + valid[cut[0]:]),
    )


def _flipped(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    changed = bytearray(data)
    for position, value in flips:
        changed[position] = value
    return bytes(changed)


def _run_in(folder: Path, argv: list[str]) -> tuple[int, str]:
    """main(argv) with stderr captured; an exception escaping main fails the test (it would be a traceback)."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = main(argv)
    return code, errors.getvalue()


def _check_outcome(folder: Path, source: Path, data: bytes, code: int, errors: str, outputs: list[Path]) -> None:
    assert code in DOCUMENTED, errors
    assert "Traceback" not in errors
    assert source.read_bytes() == data, "the input was changed"
    if code != 0:
        lines = [line for line in errors.splitlines() if line.strip()]
        assert lines[-1].startswith("onnx-remat: error: "), errors
        assert not any(path.exists() for path in outputs), errors
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


@settings(max_examples=60, deadline=None)
@given(st.lists(_mutations(), min_size=1, max_size=3), st.sampled_from(["infer", "train"]))
@example([("dim", 1, 1)], "train")  # input channels unlike the weights': the gradient's shapes failed the checker
def test_a_mutated_model_ends_with_a_documented_code(changes, mode):
    data = _mutated(changes)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        source, out, report = folder / "in.onnx", folder / "out.onnx", folder / "report.json"
        source.write_bytes(data)
        code, errors = _run_in(folder, [str(source), str(out), "--budget", "60%", "--mode", mode,
                                        "--report", str(report), "--time-limit", "5"])
        _check_outcome(folder, source, data, code, errors, [out, report])


@settings(max_examples=40, deadline=None)
@given(_byte_faults())
def test_damaged_model_bytes_end_with_a_documented_code(data):
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        source, out = folder / "in.onnx", folder / "out.onnx"
        source.write_bytes(data)
        code, errors = _run_in(folder, [str(source), str(out), "--budget", "50%", "--time-limit", "5"])
        _check_outcome(folder, source, data, code, errors, [out])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
PROBLEM_KEYS = ("operators", "edges", "devices", "graph_outputs", "resident_bytes", "budgets", "copy")


@settings(max_examples=60, deadline=None)
@given(st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(PROBLEM_KEYS), JSON_VALUES, max_size=7)),
       st.sampled_from(["50%", "min", "1KiB"]))
def test_a_malformed_problem_file_ends_with_a_documented_code(content, budget):
    text = json.dumps(content)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        source, report = folder / "problem.json", folder / "report.json"
        source.write_text(text)
        code, errors = _run_in(folder, ["solve", str(source), "--budget", budget, "--report", str(report),
                                        "--time-limit", "5"])
        _check_outcome(folder, source, text.encode(), code, errors, [report])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_a_signal_at_a_random_moment_leaves_all_or_nothing(tmp_path, seed):
    """SIGINT, SIGTERM or SIGHUP at a random moment of a run (start-up, solve, write): it finishes with every output
    written, or stops with the signal's code and none of them, no temporary file, the input unchanged."""
    chance = random.Random(seed)
    source = tmp_path / "in.onnx"
    onnx.save(conv_chain(depth=8, size=32), source)
    data = source.read_bytes()
    outputs = [tmp_path / "out.onnx", tmp_path / "report.json", tmp_path / "out.netron.json"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    command = [sys.executable, "-m", "onnx_remat.cli.entry", str(source), str(outputs[0]), "--mode", "train",
               "--budget", "45%", "--time-limit", "6", "--report", str(outputs[1]), "--netron-attachment"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(scratch)})
    signum = chance.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    time.sleep(chance.uniform(0.5, 9.0))
    process.send_signal(signum)
    _, errors = process.communicate(timeout=300)
    assert "Traceback" not in errors
    assert source.read_bytes() == data
    if process.returncode == 0:
        onnx.checker.check_model(onnx.load(outputs[0]), full_check=True)
        assert all(path.is_file() for path in outputs)
    else:
        assert process.returncode == {signal.SIGINT: 130}.get(signum, 128 + signum), errors
        assert not any(path.exists() for path in outputs)
    written = {path.name for path in outputs} if process.returncode == 0 else set()
    assert {p.name for p in tmp_path.iterdir()} == {"in.onnx", "scratch", *written}
    assert [p.name for p in scratch.iterdir() if p.name != ONNXRUNTIME_SESSION_FILE] == []
