"""Models with external weights: the dynamo exporter's model.onnx + model.onnx.data round-trips with its weights
kept external, and a broken data file is a one-line exit 3."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import conv_chain
from onnx.external_data_helper import uses_external_data

from onnx_remat.cli.main import main
from onnx_remat.passes.execute import random_feeds, run
from onnx_remat.passes.model_files import SMALLEST_EXTERNAL, data_file
from onnx_remat.pipeline import remat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from real_model_zoo import export  # noqa: E402


def _external_count(path: Path) -> int:
    model = onnx.load(path, load_external_data=False)
    return sum(uses_external_data(tensor) for tensor in model.graph.initializer)


def _inline_weight_bytes(path: Path) -> int:
    """The bytes of initializers of SMALLEST_EXTERNAL or more kept inside the model file."""
    model = onnx.load(path, load_external_data=False)
    return sum(len(t.raw_data) for t in model.graph.initializer if len(t.raw_data) >= SMALLEST_EXTERNAL)


def _saved_external(folder: Path, location: str = "weights.bin") -> Path:
    """A conv chain saved with its weights in `folder/location`."""
    path = folder / "chain.onnx"
    onnx.save(conv_chain(), path, save_as_external_data=True, location=location, size_threshold=0)
    return path


def _relocated(path: Path, location: str) -> None:
    """Point every external tensor of the model at `path` to `location`."""
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, path)


def test_a_dynamo_export_with_external_data_round_trips(tmp_path: Path) -> None:
    source, out = export("gpt", "dynamo", tmp_path / "gpt.onnx"), tmp_path / "out" / "gpt.onnx"
    out.parent.mkdir()
    assert _external_count(source) > 0
    assert main([str(source), str(out), "--budget", "60%", "--time-limit", "5", "-q"]) == 0
    assert data_file(out).is_file() and _external_count(out) > 0 and _inline_weight_bytes(out) == 0
    feeds = random_feeds(onnx.load(out))
    for got, want in zip(run(out, feeds), run(source, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_python_api_keeps_external_weights_external(tmp_path: Path) -> None:
    source, out = _saved_external(tmp_path), tmp_path / "out.onnx"
    remat(source, "100%").save(out)
    assert _external_count(out) == len(conv_chain().graph.initializer)
    feeds = random_feeds(conv_chain())
    np.testing.assert_allclose(run(out, feeds)[0], run(conv_chain(), feeds)[0], rtol=1e-6)


def test_an_inline_model_is_written_inline(tmp_path: Path) -> None:
    source, out = tmp_path / "chain.onnx", tmp_path / "out.onnx"
    onnx.save(conv_chain(), source)
    assert main([str(source), str(out), "--budget", "100%", "-q"]) == 0
    assert _external_count(out) == 0 and not data_file(out).exists()


def test_an_existing_data_file_is_not_overwritten_without_force(tmp_path: Path, capsys) -> None:
    source, out = _saved_external(tmp_path), tmp_path / "out.onnx"
    data_file(out).write_bytes(b"kept")
    assert main([str(source), str(out), "--budget", "100%"]) == 5
    assert data_file(out).read_bytes() == b"kept" and not out.exists()
    assert "out.onnx.data already exists" in capsys.readouterr().err


def _missing(folder: Path) -> Path:
    path = _saved_external(folder)
    (folder / "weights.bin").unlink()
    return path


def _outside(folder: Path) -> Path:
    inner = folder / "model"
    inner.mkdir()
    path = _saved_external(inner)
    (inner / "weights.bin").rename(folder / "weights.bin")
    _relocated(path, "../weights.bin")
    return path


def _short(folder: Path) -> Path:
    path = _saved_external(folder)
    data = folder / "weights.bin"
    data.write_bytes(data.read_bytes()[:100])
    return path


def _directory(folder: Path) -> Path:
    path = _missing(folder)
    (folder / "weights.bin").mkdir()
    return path


@pytest.mark.parametrize(("broken", "message"), [
    (_missing, "weights.bin, which is missing: keep the data file beside the model"),
    (_outside, "point to ../weights.bin, outside the model's folder"),
    (_short, "which has 100: copy the whole data file"),
    (_directory, "weights.bin, which is not a file"),
])
def test_a_broken_data_file_is_one_line_and_exit_3(broken, message: str, tmp_path: Path, capsys) -> None:
    path = broken(tmp_path)
    assert main([str(path), str(tmp_path / "out.onnx"), "--budget", "100%"]) == 3
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not (tmp_path / "out.onnx").exists()
