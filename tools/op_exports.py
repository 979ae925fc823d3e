"""What PyTorch's two exporters write for the ops issue 12's gradient rules met last: torch.fft, torch.stft,
torchvision's roi_align and roi_pool, torch.cond, loops and the scan and while_loop operators.

For each small module and exporter (`dynamo=False` at opset 17, `dynamo=True` without the optimizer) prints the op
types written, with the DFT/STFT/RoiAlign/MaxRoiPool/If/Loop/Scan nodes' attributes, or the exporter's failure in one
line. torchvision's compiled ops do not load beside torch 2.13.0+cpu (real_model_zoo.import_torchvision): its
roi_align then runs its torch.compile'd pure-PyTorch form, and roi_pool fails; the `direct` rows define
torchvision::roi_align and roi_pool through torch.library (a forward only) and call them as torch.ops, which the
legacy exporter writes through torchvision's registered symbolics.

    python tools/op_exports.py
"""

from __future__ import annotations

import re
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import onnx
import torch
from hf_models import _stdout_to_stderr
from real_model_zoo import import_torchvision
from torch import nn

NAMED = ("DFT", "STFT", "RoiAlign", "MaxRoiPool", "If", "Loop", "Scan")
"""The op types whose attributes the table shows."""
ESCAPE = r"\x1b\[[0-9;]*m"
"""A terminal colour code: the dynamo exporter colours its error messages."""


class Around(nn.Module):
    """A linear layer or a convolution, then `fn` (of the layer's output and the remaining inputs)."""

    def __init__(self, fn: Callable[..., torch.Tensor], image: bool = False) -> None:
        super().__init__()
        self.fn = fn
        self.layer = nn.Conv2d(3, 4, 3, padding=1) if image else nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return self.fn(self.layer(x), *rest)


@torch.jit.script
def _scripted_loop(h: torch.Tensor) -> torch.Tensor:
    for _ in range(3):
        h = torch.tanh(h)
    return h


def _define_roi_ops() -> None:
    """torchvision::roi_align (its pure-PyTorch form) and roi_pool (zeros: the export needs shapes only) as
    torch.library ops, and torchvision's ONNX symbolics for them."""
    import_torchvision()
    from torchvision.ops import _register_onnx_ops
    from torchvision.ops.roi_align import _roi_align

    lib = import_torchvision.lib
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
               "int sampling_ratio, bool aligned) -> Tensor")
    lib.impl("roi_align", _roi_align.__wrapped__, "CompositeExplicitAutograd")
    lib.define("roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
               "-> (Tensor, Tensor)")

    def roi_pool(x: torch.Tensor, rois: torch.Tensor, scale: float, height: int, width: int):
        out = x.new_zeros((rois.shape[0], x.shape[1], height, width))
        return out, out.long()

    lib.impl("roi_pool", roi_pool, "CompositeExplicitAutograd")
    _register_onnx_ops._register_custom_op()


def _scan(h: torch.Tensor) -> torch.Tensor:
    from torch._higher_order_ops.scan import scan

    return scan(lambda c, x: (torch.tanh(c + x), torch.tanh(c + x)), torch.zeros_like(h[0]), h)[1]


def _while(h: torch.Tensor) -> torch.Tensor:
    from torch._higher_order_ops.while_loop import while_loop

    return while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, torch.tanh(v)), (torch.tensor(0), h))[1]


def _cases() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    tv = import_torchvision()
    row, image = (torch.randn(2, 8),), (torch.randn(2, 3, 8, 8), torch.tensor([[0, 1.0, 1, 6, 6], [1, 2, 0, 7, 5]]))
    return {
        "fft": (Around(lambda h: torch.fft.fft(h).real), row),
        "rfft": (Around(lambda h: torch.view_as_real(torch.fft.rfft(h))), row),
        "fftn": (Around(lambda h: torch.fft.fftn(h.reshape(2, 2, 4), dim=(1, 2)).real), row),
        "ifft": (Around(lambda h: torch.fft.ifft(torch.fft.fft(h)).real), row),
        "irfft": (Around(lambda h: torch.fft.irfft(torch.fft.rfft(h), n=8)), row),
        "stft": (Around(lambda h: torch.stft(h, 4, 2, window=torch.hann_window(4), return_complex=True).abs()), row),
        "roi_align": (Around(lambda f, b: tv.ops.roi_align(f, b, (2, 2), 0.5, 2, aligned=True), image=True), image),
        "roi_align direct": (Around(lambda f, b: torch.ops.torchvision.roi_align(f, b, 0.5, 2, 2, 2, True),
                                    image=True), image),
        "roi_pool": (Around(lambda f, b: tv.ops.roi_pool(f, b, (2, 2), 0.5), image=True), image),
        "roi_pool direct": (Around(lambda f, b: torch.ops.torchvision.roi_pool(f, b, 0.5, 2, 2)[0], image=True),
                            image),
        "torch.cond": (Around(lambda h: torch.cond(h.sum() > 0, torch.relu, torch.tanh, (h,))), row),
        "python for": (Around(lambda h: torch.tanh(torch.tanh(torch.tanh(h)))), row),
        "scripted for": (Around(_scripted_loop), row),
        "scan": (Around(_scan), row),
        "while_loop": (Around(_while), row),
    }


def written(module: nn.Module, inputs: tuple[torch.Tensor, ...], dynamo: bool, path: Path) -> str:
    """The op types the exporter writes (named ones with their attributes), or its failure in one line."""
    try:
        with warnings.catch_warnings(), _stdout_to_stderr():  # the legacy exporter prints its graph when it fails
            warnings.simplefilter("ignore")
            if dynamo:
                torch.onnx.export(module, inputs, dynamo=True, optimize=False, verbose=False).save(str(path))
            else:
                torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=17)
    except Exception as error:  # noqa: BLE001  # the exporter's failure is the row
        message = re.sub(ESCAPE, "", str(error)).splitlines()[0][:140]
        return f"fails: {type(error).__name__}: {message}"
    model = onnx.load(str(path))
    counts = Counter(node.op_type for node in model.graph.node)
    named = {f"{n.op_type}({_attributes(n)})" for n in model.graph.node if n.op_type in NAMED}
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return f"opset {opset}: " + " ".join(f"{op}x{k}" for op, k in sorted(counts.items())) + "; " + "; ".join(
        sorted(named))


def _attributes(node: onnx.NodeProto) -> str:
    """The node's attributes other than subgraphs, as name=value."""
    return ", ".join(f"{a.name}={onnx.helper.get_attribute_value(a)}" for a in node.attribute
                     if a.type != onnx.AttributeProto.GRAPH)


def main() -> None:
    _define_roi_ops()
    print("| case | exporter | written |\n| --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for name, (module, inputs) in _cases().items():
            for dynamo in (False, True):
                row = written(module, inputs, dynamo, Path(folder) / "model.onnx")
                print(f"| {name} | {'dynamo' if dynamo else 'legacy'} | {row} |", flush=True)


if __name__ == "__main__":
    main()
