"""What a runtime keeps per node after a node's first run, by op type: chains of N nodes of one kind measured.

Each case is a chain of `unit`s (one node, or a node and the one that makes its output the next one's input again,
such as Greater and the Where that reads it) on float tensors of 16 KiB, tagged for one device and measured by
`onnx-remat run`'s machinery (`measure_devices.measure_device_peaks`: a fresh process, its runtime's growth in the
first watched run beyond the outputs counted as kept). Each case runs at two lengths, in `--repeats` fresh processes
each (interleaved, so load hits them alike); the table gives the median kept bytes at each length, the bytes per node
at the longer one and the slope between them (which would drop a fixed part per session, but the shorter chains'
figures are page-granular noise of 0-120 KiB). `passes/runtime_kept.py` records the bytes per node at 2000 nodes.

    python tools/kept_memory.py --lengths 500,2000 --repeats 5 [--cases Relu,Conv] [--device ort|ov]

With `--fan 8,64,256` it measures instead what tensors served from glibc's heap take beyond their data while they
live (`sizes.HEAP_TENSOR_BYTES`): one node reads x into N tensors of that many bytes each (ReduceSum over a 16x16
plane, N the longer length), all live until a Concat; the table gives the measured peak, `run`'s prediction with
and without the heap term, and the measured bytes per tensor beyond its data.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from rich.table import Table

from onnx_remat.core.devices import Device
from onnx_remat.core.tags import LAYER_KEY, PREFIX
from onnx_remat.passes.measure_devices import measure_device_peaks
from onnx_remat.passes.run_devices import build_plan
from onnx_remat.passes.sizes import HEAP_TENSOR_BYTES

SHAPE = (1, 16, 16, 16)  # 4096 floats: 16 KiB
DEVICES = {"ort": Device("cpu", "onnxruntime", "CPUExecutionProvider", threads=1),
           "ov": Device("cpu", "openvino", "CPU", threads=1)}
Unit = Callable[[str, str], list[onnx.NodeProto]]
"""(input name, output name) -> the nodes of one unit of a chain."""


@dataclass(frozen=True)
class Case:
    """A chain's unit, the initializers its nodes read and the input shape."""

    name: str
    unit: Unit
    initializers: tuple[onnx.TensorProto, ...] = ()
    shape: tuple[int, ...] = SHAPE


def _one(op: str, *extra: str, **attributes: object) -> Unit:
    return lambda x, y: [helper.make_node(op, [x, *extra], [y], **attributes)]


def _pair(first: Unit, op: str, *extra: str) -> Unit:
    """`first` then `op` reading its output."""
    def unit(x: str, y: str) -> list[onnx.NodeProto]:
        return [*first(x, y + "_m"), helper.make_node(op, [y + "_m", *extra], [y])]
    return unit


def _tensor(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    channels = SHAPE[1]
    weight = _tensor("w", rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1)
    square = _tensor("m", rng.standard_normal((channels, channels)).astype(np.float32) * 0.1)
    vector = [_tensor(name, np.ones(channels, np.float32)) for name in ("scale", "bias", "mean", "var")]
    scalar = _tensor("c", np.array(0.5, np.float32))
    half = _tensor("h", np.array(0.5, np.float32))
    mask = _tensor("cond", rng.random(SHAPE[2:]) > 0.5)
    indices = _tensor("idx", np.arange(channels, dtype=np.int64))
    starts, ends, axes = (_tensor(n, np.array(v, np.int64)) for n, v in (("s0", [0]), ("s1", [channels]), ("a1", [1])))
    shape = _tensor("shape", np.array(SHAPE, np.int64))
    flat = _tensor("flat", np.array((1, channels, SHAPE[2] * SHAPE[3]), np.int64))
    full = _tensor("full", np.array(SHAPE, np.int64))
    reduce_axes = _tensor("ax0", np.array([0], np.int64))
    constant: Unit = lambda x, y: [  # noqa: E731
        helper.make_node("Constant", [], [y + "_k"], value=_tensor(y + "_v", np.array(0.5, np.float32))),
        helper.make_node("Add", [x, y + "_k"], [y])]
    return [
        *(Case(op, _one(op)) for op in ("Relu", "Sigmoid", "Neg", "Sqrt", "Reciprocal", "HardSigmoid", "Identity",
                                        "Exp", "Tanh")),
        Case("Softmax", _one("Softmax", axis=-1)),
        Case("LogSoftmax", _one("LogSoftmax", axis=-1)),
        Case("Transpose", _one("Transpose", perm=[0, 1, 3, 2])),
        Case("Cast", _one("Cast", to=TensorProto.FLOAT)),
        *(Case(op, _one(op, "c"), (scalar,)) for op in ("Add", "Mul", "Sub", "Div")),
        Case("Sum", _one("Sum", "c"), (scalar,)),
        Case("MatMul", _one("MatMul", "m"), (square,)),
        Case("Gemm", _one("Gemm", "m", "bias"), (square, vector[1]), (SHAPE[2] * SHAPE[3], channels)),
        Case("Conv", _one("Conv", "w", pads=[1, 1, 1, 1]), (weight,)),
        Case("ConvTranspose", _one("ConvTranspose", "w", pads=[1, 1, 1, 1]), (weight,)),
        Case("BatchNormalization", _one("BatchNormalization", *(v.name for v in vector)), tuple(vector)),
        Case("Reshape", _pair(_one("Reshape", "flat"), "Reshape", "shape"), (flat, shape)),
        Case("Expand", _one("Expand", "full"), (full,)),
        Case("Gather", _one("Gather", "idx", axis=1), (indices,)),
        Case("Slice", _one("Slice", "s0", "s1", "a1"), (starts, ends, axes)),
        Case("Concat", _one("Concat", axis=1)),
        Case("ReduceSum", _one("ReduceSum", "ax0", keepdims=1), (reduce_axes,)),
        Case("ReduceMean", _one("ReduceMean", "ax0", keepdims=1), (reduce_axes,)),
        Case("ReduceSumSquare", _one("ReduceSumSquare", "ax0", keepdims=1), (reduce_axes,)),
        Case("Where", lambda x, y: [helper.make_node("Where", ["cond", x, "c"], [y])], (mask, scalar)),
        Case("Greater+Where", lambda x, y: [helper.make_node("Greater", [x, "h"], [y + "_g"]),
                                            helper.make_node("Where", [y + "_g", x, "c"], [y])], (half, scalar)),
        Case("Constant+Add", constant),
        Case("Relu+Add (Relu not in place)", lambda x, y: [helper.make_node("Relu", [x], [y + "_r"]),
                                                          helper.make_node("Add", [y + "_r", x], [y])]),
        Case("Exp+Relu (Relu in place)", lambda x, y: [helper.make_node("Exp", [x], [y + "_e"]),
                                                      helper.make_node("Relu", [y + "_e"], [y])]),
    ]


def chain(case: Case, units: int) -> onnx.ModelProto:
    """`units` of `case` in a row, every node tagged for the device `cpu`."""
    nodes: list[onnx.NodeProto] = []
    previous = "x"
    for k in range(units):
        out = "y" if k == units - 1 else f"t{k}"
        made = case.unit(previous, out)
        for n, node in enumerate(made):
            node.name = f"{case.name}_{k}_{n}"
            for key, value in ((PREFIX + "device", "cpu"), (PREFIX + "role", "forward"), (PREFIX + "step", str(k)),
                               (LAYER_KEY, "cpu")):
                node.metadata_props.add(key=key, value=value)
        nodes.extend(made)
        previous = out
    graph = helper.make_graph(nodes, case.name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, case.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, case.shape)],
                              list(case.initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def kept_bytes(case: Case, units: int, device: Device) -> int:
    """The bytes the device's runtime kept after the first run of a chain of `units`, in one fresh process."""
    plan = build_plan(chain(case, units), (device,))
    feeds = {"x": np.random.default_rng(1).standard_normal(case.shape).astype(np.float32)}
    return measure_device_peaks(plan, feeds, runs=1).kept_bytes[0]


def fan(tensors: int, nbytes: int) -> onnx.ModelProto:
    """x [1, nbytes/4, 16, 16] read by `tensors` ReduceSum nodes into tensors of `nbytes`, all read by one Concat."""
    shape = (1, nbytes // 4, 16, 16)
    nodes = [helper.make_node("ReduceSum", ["x", "plane"], [f"s{k}"], name=f"sum{k}") for k in range(tensors)]
    nodes.append(helper.make_node("Concat", [f"s{k}" for k in range(tensors)], ["y"], axis=0, name="concat"))
    for node in nodes:
        for key, value in ((PREFIX + "device", "cpu"), (PREFIX + "role", "forward"), (LAYER_KEY, "cpu")):
            node.metadata_props.add(key=key, value=value)
    graph = helper.make_graph(nodes, "fan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (tensors, shape[1], 1, 1))],
                              [_tensor("plane", np.array([2, 3], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def fan_table(sizes: list[int], tensors: int, repeats: int) -> None:
    """Measured peak of `fan` against `run`'s prediction with and without HEAP_TENSOR_BYTES, per data size."""
    table = Table(title=f"{tensors} heap tensors live at once, median of {repeats} fresh processes")
    for column in ("bytes each", "measured KiB (range)", "predicted KiB", "without the heap term KiB",
                   "measured bytes/tensor beyond data"):
        table.add_column(column, justify="right")
    for nbytes in sizes:
        model = fan(tensors, nbytes)
        plan = build_plan(model, (DEVICES["ort"],))
        feeds = {"x": np.random.default_rng(1).standard_normal((1, nbytes // 4, 16, 16)).astype(np.float32)}
        peaks = [measure_device_peaks(plan, feeds).peak_bytes[0] for _ in range(repeats)]
        without = plan.peak_bytes[0] - tensors * HEAP_TENSOR_BYTES
        beyond = (statistics.median(peaks) - without) / tensors
        table.add_row(str(nbytes), _kib(peaks), f"{plan.peak_bytes[0] / 1024:.0f}", f"{without / 1024:.0f}",
                      f"{beyond:.0f}")
    Console(width=140).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="500,2000", help="two chain lengths, in units")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per case and length")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--device", choices=sorted(DEVICES), default="ort")
    parser.add_argument("--fan", default="", help="comma-separated data sizes in bytes (multiples of 4): measure "
                        "heap tensors live at once instead of chains")
    args = parser.parse_args()
    short, long = (int(n) for n in args.lengths.split(","))
    if args.fan:
        fan_table([int(size) for size in args.fan.split(",")], long, args.repeats)
        return
    wanted = set(filter(None, args.cases.split(",")))
    cases = [case for case in _cases() if not wanted or case.name in wanted]
    device = DEVICES[args.device]
    samples: dict[tuple[str, int], list[int]] = {}
    for _ in range(args.repeats):
        for case in cases:
            for units in (short, long):
                samples.setdefault((case.name, units), []).append(kept_bytes(case, units, device))
    table = Table(title=f"kept bytes after the first run, {device.runtime}, median of {args.repeats} fresh processes")
    for column in ("case", "nodes/unit", f"{short} units KiB (range)", f"{long} units KiB (range)",
                   f"bytes/node at {long}", "slope bytes/node"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for case in cases:
        per_unit = len(case.unit("a", "b"))
        low, high = samples[(case.name, short)], samples[(case.name, long)]
        slope = (statistics.median(high) - statistics.median(low)) / ((long - short) * per_unit)
        per_node = statistics.median(high) / (long * per_unit)
        table.add_row(case.name, str(per_unit), _kib(low), _kib(high), f"{per_node:.0f}", f"{slope:.0f}")
    Console(width=140).print(table)


def _kib(values: list[int]) -> str:
    return f"{statistics.median(values) / 1024:.0f} ({min(values) / 1024:.0f}-{max(values) / 1024:.0f})"


if __name__ == "__main__":
    main()
