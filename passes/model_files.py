"""A model as the files it is read from and written to: one .onnx file, or with its weights in a `<name>.data` file
beside it when the input kept them there (as PyTorch's dynamo exporter does) or the model is too large for one
protobuf. Every data file is checked before any is read, so a broken one is a one-line ModelError."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import ExternalDataInfo, set_external_data, uses_external_data

from onnx_remat.core.errors import ModelError, one_line

PROTOBUF_LIMIT = 2**31 - 1
"""The largest message protobuf serializes: a larger model must keep its weights outside."""
SMALLEST_EXTERNAL = 1024
"""Tensors below this many bytes stay inside the model file (as onnx.save does)."""
ALIGNMENT = 4096
"""Offsets of external tensors are aligned so the data file can be memory-mapped."""


def read_model(path: Path) -> onnx.ModelProto:
    """The model at `path` with its external weights loaded; ModelError for an unreadable model or a data file
    that is missing, outside the model's folder or shorter than the model says."""
    model = _parse(path)
    for tensor in _external_tensors(model):
        _check_data_file(path, tensor)
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"cannot read the weights {path} keeps in an external file ({one_line(exc)}): "
                         "keep the data file beside the model, under the name the model gives") from None
    return model


def has_external_data(source: str | Path | onnx.ModelProto) -> bool:
    """Whether the model file keeps any initializer in an external file (an in-memory model does not)."""
    if isinstance(source, onnx.ModelProto):
        return False
    return bool(_external_tensors(_parse(Path(source))))


def data_file(path: str | Path) -> Path:
    """Where the weights of a model written to `path` go when they are external: `<name>.data` beside it."""
    return Path(path).with_name(f"{Path(path).name}.data")


def model_files(model: onnx.ModelProto, path: str | Path, external: bool) -> dict[Path, bytes]:
    """The bytes of the model file at `path`, and of `<name>.data` beside it when `external` or when the model
    is too large for one file; `model` itself is not changed."""
    path = Path(path)
    if not external and model.ByteSize() <= PROTOBUF_LIMIT:
        return {path: model.SerializeToString()}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    data = bytearray()
    location = data_file(path)
    for tensor in copy.graph.initializer:
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < SMALLEST_EXTERNAL:
            continue
        data.extend(b"\0" * (-len(data) % ALIGNMENT))
        set_external_data(tensor, location.name, len(data), len(tensor.raw_data))
        data.extend(tensor.raw_data)
        tensor.ClearField("raw_data")
    return {path: copy.SerializeToString(), location: bytes(data)}


def _parse(path: Path) -> onnx.ModelProto:
    """The model's protobuf without external weights; ModelError if the file is missing or not a model."""
    if not path.is_file():
        raise ModelError(f"input model {path} does not exist: check the path")
    try:
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise ModelError(f"{path} is not a readable ONNX model ({one_line(exc)}): is the file complete?") from None


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The main graph's initializers stored in external files (where exporters put weights)."""
    return [tensor for tensor in model.graph.initializer if uses_external_data(tensor)]


def _check_data_file(path: Path, tensor: onnx.TensorProto) -> None:
    """ModelError unless the tensor's data lies in a readable regular file inside the model's folder."""
    try:
        info = ExternalDataInfo(tensor)
    except ValueError as exc:
        raise ModelError(f"{path} describes the weights of {tensor.name!r} wrongly: {one_line(exc)}") from None
    target = path.parent / info.location
    where = f"{path}'s weights for {tensor.name!r}"
    if Path(info.location).is_absolute() or not target.resolve().is_relative_to(path.parent.resolve()):
        raise ModelError(f"{where} point to {info.location}, outside the model's folder: keep the data file "
                         "beside the model and save it with a relative location")
    if not target.is_file():
        state = "not a file" if target.exists() else "missing"
        raise ModelError(f"{where} are in {target}, which is {state}: keep the data file beside the model, "
                         "under the name the model gives")
    if not os.access(target, os.R_OK):
        raise ModelError(f"{where} are in {target}, which cannot be read: check its permissions")
    size = target.stat().st_size
    end = (info.offset or 0) + (info.length or 0)
    if end > size:
        raise ModelError(f"{where} end at byte {end} of {target}, which has {size}: copy the whole data file")
