"""Unroll LSTM, GRU and RNN nodes over their fixed sequence length into standard ops, so the existing gradient rules
differentiate them and the rematerializer can free and recompute single time steps.

Covers what PyTorch's exporters write: forward, reverse and bidirectional; biases; initial states given or
absent; layout 0 or 1; GRU with either linear_before_reset; RNN with tanh or relu. Peepholes, clipping,
input_forget, other activations and sequence_lens are refused with the node's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.emitter import node_attributes
from onnx_remat.passes.autodiff.graph_info import GraphInfo, attr_int, attr_str, attr_strs, has_attr, present
from onnx_remat.passes.manager import named

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
LSTM_GATES = 4  # i, o, f, c
GRU_GATES = 3  # z, r, h
GATES = {"LSTM": LSTM_GATES, "GRU": GRU_GATES, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
RNN_ACTIVATIONS = ("Tanh", "Relu")
"""The RNN activations PyTorch writes (nn.RNN's nonlinearity), the same in both directions."""


class Steps:
    """Appends nodes named `<rnn>/unrolled/<k>` whose single output is named like the node."""

    def __init__(self, owner: str, dtype: np.dtype) -> None:
        self.owner = owner
        self.dtype = dtype
        self.nodes: list[ir.Node] = []

    def op(self, op_type: str, *inputs: ir.Value | None, **attrs: Any) -> ir.Value:
        return self.ops(op_type, inputs, 1, **attrs)[0]

    def ops(self, op_type: str, inputs: Sequence[ir.Value | None], outputs: int, **attrs: Any) -> list[ir.Value]:
        name = f"{self.owner}/unrolled/{len(self.nodes)}"
        node = ir.Node("", op_type, inputs, node_attributes(attrs), num_outputs=outputs, name=name)
        for j, output in enumerate(node.outputs):
            output.name = name if outputs == 1 else f"{name}:{j}"
        self.nodes.append(node)
        return list(node.outputs)

    def ints(self, values: list[int] | int) -> ir.Value:
        return self.op("Constant", value=ir.tensor(np.asarray(values, dtype=np.int64)))

    def scalar(self, value: float) -> ir.Value:
        return self.op("Constant", value=ir.tensor(np.asarray(value, dtype=self.dtype)))

    def alias(self, x: ir.Value, replaced: ir.Value) -> None:
        """An Identity of `x` that takes the place, the name and the readers of the replaced node's output."""
        alias = self.op("Identity", x)
        name, replaced.name = named(replaced), None
        ir.convenience.replace_all_uses_with(replaced, alias, replace_graph_outputs=True)
        alias.name, alias.type, alias.shape = name, replaced.type, replaced.shape

    def zeros(self, shape: list[int]) -> ir.Value:
        return self.op("ConstantOfShape", self.ints(shape), value=ir.tensor(np.zeros(1, dtype=self.dtype)))

    def pick(self, x: ir.Value | None, index: int, axis: int = 0) -> ir.Value:
        """x[index] along `axis`, that axis dropped."""
        return self.op("Gather", x, self.ints(index), axis=axis)

    def split(self, x: ir.Value, parts: int, size: int, axis: int) -> list[ir.Value]:
        return self.ops("Split", [x, self.ints([size] * parts)], parts, axis=axis)

    def stack(self, xs: list[ir.Value], axis: int) -> ir.Value:
        """Concatenate along a new axis."""
        return self.op("Concat", *(self.op("Unsqueeze", x, self.ints([axis])) for x in xs), axis=axis)


def unroll_recurrences(model: ir.Model, info: GraphInfo) -> None:
    """Replace every LSTM, GRU and RNN node of the model's graph by its unrolled form, in place."""
    graph = model.graph
    for node in list(graph):
        if node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
            graph.insert_before(node, _unroll(node, info))
            graph.remove(node, safe=True)


def _unroll(node: ir.Node, info: GraphInfo) -> list[ir.Node]:
    """The nodes computing `node`'s outputs step by step; they take over its outputs' names and readers."""
    _refuse_unsupported(node)
    inputs = [*node.inputs, *[None] * 8]
    x, w, r, b, init_h = inputs[0], inputs[1], inputs[2], inputs[3], inputs[5]
    init_c = inputs[6] if node.op_type == "LSTM" else None
    hidden = attr_int(node, "hidden_size")
    layout = attr_int(node, "layout", 0)
    direction = attr_str(node, "direction", "forward")
    steps = Steps(named(node), info.np_dtype(x))
    sequence = present(x)
    if layout:
        sequence = steps.op("Transpose", sequence, perm=[1, 0, 2])
    shape = info.shape(node.inputs[0])
    seq, batch = (shape[1], shape[0]) if layout else (shape[0], shape[1])
    cell = _cell(node)
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    ys, finals_h, finals_c = [], [], []
    for d, backwards in enumerate(reverse):
        h = steps.pick(init_h, d) if init_h else steps.zeros([batch, hidden])
        c = (steps.pick(init_c, d) if init_c else steps.zeros([batch, hidden])) if node.op_type == "LSTM" else None
        weights = _direction_weights(steps, node.op_type, present(w), present(r), b, d, hidden)
        xw = steps.op("MatMul", sequence, weights.input_t)
        if weights.bias:
            xw = steps.op("Add", xw, weights.bias)
        outputs: list[ir.Value] = []
        for t in (reversed(range(seq)) if backwards else range(seq)):
            h, c = cell(steps, steps.pick(xw, t), h, c, weights, hidden)
            outputs.append(h)
        ys.append(steps.stack(outputs[::-1] if backwards else outputs, 0))
        finals_h.append(h)
        finals_c.append(c)
    results = [steps.stack(ys, 1), steps.stack(finals_h, 0)]
    if node.op_type == "LSTM":
        results.append(steps.stack([present(c) for c in finals_c], 0))
    if layout:
        results = [steps.op("Transpose", results[0], perm=[2, 0, 1, 3]),
                   *(steps.op("Transpose", s, perm=[1, 0, 2]) for s in results[1:])]
    for produced, wanted in zip(results, node.outputs, strict=False):
        if wanted.name:
            steps.alias(produced, wanted)
    return steps.nodes


class _Weights:
    """One direction's transposed input and recurrence weights, summed input bias and recurrence bias."""

    def __init__(self, input_t: ir.Value, recurrence_t: ir.Value, bias: ir.Value | None,
                 recurrence_bias: ir.Value | None) -> None:
        self.input_t = input_t
        self.recurrence_t = recurrence_t
        self.bias = bias
        self.recurrence_bias = recurrence_bias


def _direction_weights(steps: Steps, op_type: str, w: ir.Value, r: ir.Value, b: ir.Value | None, d: int,
                       hidden: int) -> _Weights:
    """W^T and R^T of direction d; the input bias Wb (+ Rb, except GRU's candidate part, kept apart as Rb_h)."""
    input_t = steps.op("Transpose", steps.pick(w, d))
    recurrence_t = steps.op("Transpose", steps.pick(r, d))
    if not b:
        return _Weights(input_t, recurrence_t, None, None)
    wb, rb = steps.split(steps.pick(b, d), 2, GATES[op_type] * hidden, 0)
    if op_type != "GRU":
        return _Weights(input_t, recurrence_t, steps.op("Add", wb, rb), None)
    return _Weights(input_t, recurrence_t, wb, rb)


Cell = Callable[[Steps, ir.Value, ir.Value, ir.Value | None, _Weights, int], tuple[ir.Value, ir.Value | None]]


def _cell(node: ir.Node) -> Cell:
    """The step function of the node's op and attributes."""
    if node.op_type == "LSTM":
        return _lstm_cell
    if node.op_type == "GRU":
        return _gru_cell(attr_int(node, "linear_before_reset", 0))
    return _rnn_cell((attr_strs(node, "activations") if has_attr(node, "activations") else ["Tanh"])[0])


def _rnn_cell(activation: str) -> Cell:
    """One RNN step: H = f(x W^T + h R^T + Wb + Rb)."""

    def cell(steps: Steps, xw: ir.Value, h: ir.Value, c: ir.Value | None, weights: _Weights, hidden: int
             ) -> tuple[ir.Value, ir.Value | None]:
        return steps.op(activation, steps.op("Add", xw, steps.op("MatMul", h, weights.recurrence_t))), None

    return cell


def _lstm_cell(steps: Steps, xw: ir.Value, h: ir.Value, c: ir.Value | None, weights: _Weights, hidden: int
               ) -> tuple[ir.Value, ir.Value | None]:
    """One LSTM step (gates i, o, f, c): C = f*C + i*tanh(.), H = o*tanh(C)."""
    gates = steps.op("Add", xw, steps.op("MatMul", h, weights.recurrence_t))
    i, o, f, g = steps.split(gates, LSTM_GATES, hidden, 1)
    i, o, f, g = steps.op("Sigmoid", i), steps.op("Sigmoid", o), steps.op("Sigmoid", f), steps.op("Tanh", g)
    c = steps.op("Add", steps.op("Mul", f, c), steps.op("Mul", i, g))
    return steps.op("Mul", o, steps.op("Tanh", c)), c


def _gru_cell(linear_before_reset: int) -> Cell:
    """One GRU step (gates z, r, h): H = (1-z)*h + z*H, the candidate reset before or after its linear map."""

    def cell(steps: Steps, xw: ir.Value, h: ir.Value, c: ir.Value | None, weights: _Weights, hidden: int
             ) -> tuple[ir.Value, ir.Value | None]:
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
        return steps.op("Add", fresh, kept), None

    return cell


def _refuse_unsupported(node: ir.Node) -> None:
    """ModelError for the forms the unrolling does not write."""
    inputs = [*node.inputs, *[None] * 8]
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
        allowed = [[a] for a in RNN_ACTIVATIONS] if node.op_type == "RNN" else [default]
        if not any(names == a * (len(names) // len(a)) for a in allowed):
            problems.append(f"activations {names}")
    if problems:
        raise ModelError(f"{node.op_type} {node.name!r} uses {', '.join(problems)}, which training does not "
                         "support: export the recurrent layer without them")
