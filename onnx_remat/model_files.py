"""A model as the files it is written to: one .onnx file, or with its weights in a `<name>.data` file beside it
when the input kept them there (as PyTorch's dynamo exporter does) or the model is too large for one protobuf."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx.external_data_helper import set_external_data

PROTOBUF_LIMIT = 2**31 - 1
"""The largest message protobuf serializes: a larger model must keep its weights outside."""
SMALLEST_EXTERNAL = 1024
"""Tensors below this many bytes stay inside the model file (as onnx.save does)."""
ALIGNMENT = 4096
"""Offsets of external tensors are aligned so the data file can be memory-mapped."""


def has_external_data(path: str | Path) -> bool:
    """Whether the model file at `path` keeps any initializer in an external file."""
    model = onnx.load(str(path), load_external_data=False)
    return any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)


def model_files(model: onnx.ModelProto, path: str | Path, external: bool) -> dict[Path, bytes]:
    """The bytes of the model file at `path`, and of `<name>.data` beside it when `external` or when the model
    is too large for one file; `model` itself is not changed."""
    path = Path(path)
    if not external and model.ByteSize() <= PROTOBUF_LIMIT:
        return {path: model.SerializeToString()}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    data = bytearray()
    location = f"{path.name}.data"
    for tensor in copy.graph.initializer:
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < SMALLEST_EXTERNAL:
            continue
        data.extend(b"\0" * (-len(data) % ALIGNMENT))
        offset = len(data)
        data.extend(tensor.raw_data)
        set_external_data(tensor, location, offset, len(tensor.raw_data))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
    return {path: copy.SerializeToString(), path.with_name(location): bytes(data)}
