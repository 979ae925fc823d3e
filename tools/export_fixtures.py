"""Export the small PyTorch fixtures (tools/fixture_modules.py) to models/fixtures/*.onnx.

Uses the legacy TorchScript exporter (dynamo=False): it folds inference BatchNorm into Conv, as most
real exported models have it, and names nodes after the module path (`/layer1/layer1.0/conv1/Conv`).

    python tools/export_fixtures.py
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import onnx
import torch
from fixture_modules import SPECS, make

OUT = Path(__file__).resolve().parents[1] / "models" / "fixtures"


def export(name: str) -> onnx.ModelProto:
    """Export one fixture for inference at opset 17 and check it."""
    module, example = make(name)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter is deprecated, not gone
        # InstanceNorm without running statistics always normalizes with batch statistics: nothing to warn about.
        warnings.filterwarnings("ignore", message=".*'instance_norm' is set to train=True")
        torch.onnx.export(
            module,
            (example,),
            buffer,
            dynamo=False,
            opset_version=17,
            do_constant_folding=True,
            input_names=["input"],
            output_names=["output"],
        )
    model = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    """Write every fixture and print its size."""
    OUT.mkdir(parents=True, exist_ok=True)
    for name in SPECS:
        path = OUT / f"{name}.onnx"
        onnx.save(export(name), path)
        print(f"{path.relative_to(OUT.parents[1])}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
