"""Unroll LSTM and GRU nodes over their fixed sequence length into standard ops, so the existing gradient rules
differentiate them and the rematerializer can free and recompute single time steps.

Covers what PyTorch's exporters write: forward, reverse and bidirectional; biases; initial states given or
absent; layout 0 or 1; GRU with either linear_before_reset. Peepholes, clipping, input_forget, non-default
activations and sequence_lens are refused with the node's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.errors import ModelError
from onnx_remat.passes.autodiff.graph_info import GraphInfo, attr_int, attr_str, attr_strs, has_attr

RECURRENT_OPS = ("LSTM", "GRU")
LSTM_GATES = 4  # i, o, f, c
GRU_GATES = 3  # z, r, h
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


class _Steps:
    """Appends nodes named `<rnn>/unrolled/<k>` whose single output is named like the node."""

    def __init__(self, owner: str, dtype: np.dtype) -> None:
        self.owner = owner
        self.dtype = dtype
        self.nodes: list[onnx.NodeProto] = []

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        return self.ops(op_type, inputs, 1, **attrs)[0]

    def ops(self, op_type: str, inputs: Sequence[str], outputs: int, **attrs: Any) -> list[str]:
        name = f"{self.owner}/unrolled/{len(self.nodes)}"
        names = [name] if outputs == 1 else [f"{name}:{j}" for j in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=name, **attrs))
        return names

    def ints(self, values: list[int] | int) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(values, dtype=np.int64)))

    def scalar(self, value: float) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype=self.dtype)))

    def alias(self, x: str, name: str) -> None:
        """An Identity giving `x` the name the replaced node's output had."""
        self.nodes.append(helper.make_node("Identity", [x], [name], name=f"{self.owner}/unrolled/{len(self.nodes)}"))

    def zeros(self, shape: list[int]) -> str:
        return self.op("ConstantOfShape", self.ints(shape),
                       value=numpy_helper.from_array(np.zeros(1, dtype=self.dtype)))

    def pick(self, x: str, index: int, axis: int = 0) -> str:
        """x[index] along `axis`, that axis dropped."""
        return self.op("Gather", x, self.ints(index), axis=axis)

    def split(self, x: str, parts: int, size: int, axis: int) -> list[str]:
        return self.ops("Split", [x, self.ints([size] * parts)], parts, axis=axis)

    def stack(self, xs: list[str], axis: int) -> str:
        """Concatenate along a new axis."""
        return self.op("Concat", *(self.op("Unsqueeze", x, self.ints([axis])) for x in xs), axis=axis)


def unroll_recurrences(model: onnx.ModelProto, info: GraphInfo) -> None:
    """Replace every LSTM and GRU node of the model's graph by its unrolled form, in place."""
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
            nodes += _unroll(node, info)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _unroll(node: onnx.NodeProto, info: GraphInfo) -> list[onnx.NodeProto]:
    _refuse_unsupported(node)
    inputs = list(node.input) + [""] * 8
    x, w, r, b, init_h = inputs[0], inputs[1], inputs[2], inputs[3], inputs[5]
    init_c = inputs[6] if node.op_type == "LSTM" else ""
    hidden = attr_int(node, "hidden_size")
    layout = attr_int(node, "layout", 0)
    direction = attr_str(node, "direction", "forward")
    steps = _Steps(node.name, info.np_dtype(x))
    if layout:
        x = steps.op("Transpose", x, perm=[1, 0, 2])
    shape = info.shape(node.input[0])
    seq, batch = (shape[1], shape[0]) if layout else (shape[0], shape[1])
    cell = _lstm_cell if node.op_type == "LSTM" else _gru_cell(attr_int(node, "linear_before_reset", 0))
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    ys, finals_h, finals_c = [], [], []
    for d, backwards in enumerate(reverse):
        h = steps.pick(init_h, d) if init_h else steps.zeros([batch, hidden])
        c = (steps.pick(init_c, d) if init_c else steps.zeros([batch, hidden])) if node.op_type == "LSTM" else ""
        weights = _direction_weights(steps, node.op_type, w, r, b, d, hidden)
        xw = steps.op("MatMul", x, weights.input_t)
        if weights.bias:
            xw = steps.op("Add", xw, weights.bias)
        outputs: list[str] = [""] * seq
        for t in (reversed(range(seq)) if backwards else range(seq)):
            h, c = cell(steps, steps.pick(xw, t), h, c, weights, hidden)
            outputs[t] = h
        ys.append(steps.stack(outputs, 0))
        finals_h.append(h)
        finals_c.append(c)
    results = [steps.stack(ys, 1), steps.stack(finals_h, 0)]
    if node.op_type == "LSTM":
        results.append(steps.stack(finals_c, 0))
    if layout:
        results = [steps.op("Transpose", results[0], perm=[2, 0, 1, 3]),
                   *(steps.op("Transpose", s, perm=[1, 0, 2]) for s in results[1:])]
    for produced, wanted in zip(results, node.output, strict=False):
        if wanted:
            steps.alias(produced, wanted)
    return steps.nodes


class _Weights:
    """One direction's transposed input and recurrence weights, summed input bias and recurrence bias."""

    def __init__(self, input_t: str, recurrence_t: str, bias: str, recurrence_bias: str) -> None:
        self.input_t = input_t
        self.recurrence_t = recurrence_t
        self.bias = bias
        self.recurrence_bias = recurrence_bias


def _direction_weights(steps: _Steps, op_type: str, w: str, r: str, b: str, d: int, hidden: int) -> _Weights:
    """W^T and R^T of direction d; the input bias Wb (+ Rb, except GRU's candidate part, kept apart as Rb_h)."""
    input_t = steps.op("Transpose", steps.pick(w, d))
    recurrence_t = steps.op("Transpose", steps.pick(r, d))
    if not b:
        return _Weights(input_t, recurrence_t, "", "")
    gates = LSTM_GATES if op_type == "LSTM" else GRU_GATES
    wb, rb = steps.split(steps.pick(b, d), 2, gates * hidden, 0)
    if op_type == "LSTM":
        return _Weights(input_t, recurrence_t, steps.op("Add", wb, rb), "")
    return _Weights(input_t, recurrence_t, wb, rb)


def _lstm_cell(steps: _Steps, xw: str, h: str, c: str, weights: _Weights, hidden: int) -> tuple[str, str]:
    """One LSTM step (gates i, o, f, c): C = f*C + i*tanh(.), H = o*tanh(C)."""
    gates = steps.op("Add", xw, steps.op("MatMul", h, weights.recurrence_t))
    i, o, f, g = steps.split(gates, LSTM_GATES, hidden, 1)
    i, o, f, g = steps.op("Sigmoid", i), steps.op("Sigmoid", o), steps.op("Sigmoid", f), steps.op("Tanh", g)
    c = steps.op("Add", steps.op("Mul", f, c), steps.op("Mul", i, g))
    return steps.op("Mul", o, steps.op("Tanh", c)), c


def _gru_cell(linear_before_reset: int) -> Callable[[_Steps, str, str, str, _Weights, int], tuple[str, str]]:
    """One GRU step (gates z, r, h): H = (1-z)*h + z*H, the candidate reset before or after its linear map."""

    def cell(steps: _Steps, xw: str, h: str, c: str, weights: _Weights, hidden: int) -> tuple[str, str]:
        xz, xr, xh = steps.split(xw, GRU_GATES, hidden, 1)
        rt = weights.recurrence_t
        rz_t, rr_t, rh_t = steps.split(rt, GRU_GATES, hidden, 1)
        rb = steps.split(weights.recurrence_bias, GRU_GATES, hidden, 0) if weights.recurrence_bias else []
        hz, hr = steps.op("MatMul", h, rz_t), steps.op("MatMul", h, rr_t)
        if rb:
            hz, hr = steps.op("Add", hz, rb[0]), steps.op("Add", hr, rb[1])
        z = steps.op("Sigmoid", steps.op("Add", xz, hz))
        r = steps.op("Sigmoid", steps.op("Add", xr, hr))
        if linear_before_reset:
            hh = steps.op("MatMul", h, rh_t)
            if rb:
                hh = steps.op("Add", hh, rb[2])
            candidate = steps.op("Add", xh, steps.op("Mul", r, hh))
        else:
            hh = steps.op("MatMul", steps.op("Mul", r, h), rh_t)
            candidate = steps.op("Add", xh, steps.op("Add", hh, rb[2]) if rb else hh)
        n = steps.op("Tanh", candidate)
        kept = steps.op("Mul", z, h)
        fresh = steps.op("Mul", steps.op("Sub", steps.scalar(1.0), z), n)
        return steps.op("Add", fresh, kept), ""

    return cell


def _refuse_unsupported(node: onnx.NodeProto) -> None:
    """ModelError for the forms the unrolling does not write."""
    inputs = list(node.input) + [""] * 8
    problems = []
    if inputs[4]:
        problems.append("sequence_lens")
    if node.op_type == "LSTM" and inputs[7]:
        problems.append("peepholes")
    if has_attr(node, "clip"):
        problems.append("clip")
    if attr_int(node, "input_forget", 0):
        problems.append("input_forget")
    if has_attr(node, "activations"):
        names = attr_strs(node, "activations")
        default = DEFAULT_ACTIVATIONS[node.op_type]
        if names != default * (len(names) // len(default)):
            problems.append(f"activations {names}")
    if problems:
        raise ModelError(f"{node.op_type} {node.name!r} uses {', '.join(problems)}, which training does not "
                         "support: export the recurrent layer without them")
