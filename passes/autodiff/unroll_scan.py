"""Unroll Scan nodes over their fixed length into copies of their body, one per step (the dynamo exporter writes
torch's scan operator as a Scan), so the existing gradient rules differentiate the body and the rematerializer can
free and recompute single steps. A body holding a subgraph of its own is refused with the node's name."""

from __future__ import annotations

import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.graph_info import GraphInfo, attr_int, attr_ints, present
from onnx_remat.passes.autodiff.unroll_rnn import Steps
from onnx_remat.passes.manager import named
from onnx_remat.passes.reads import inner_graphs


def unroll_scans(model: ir.Model, info: GraphInfo) -> None:
    """Replace every Scan node of the model's graph by its unrolled steps, in place."""
    graph = model.graph
    for node in list(graph):
        if node.op_type == "Scan" and node.domain in ("", "ai.onnx"):
            graph.insert_before(node, _unroll(node, info))
            graph.remove(node, safe=True)


def _unroll(node: ir.Node, info: GraphInfo) -> list[ir.Node]:
    """The body's nodes once per step, each step reading the previous one's states and its slice of every scan
    input; the last states and the stacked scan outputs take over the node's outputs' names and readers."""
    body = node.attributes["body"].as_graph()
    if any(inner_graphs(inner) for inner in body):
        raise ModelError(f"Scan {node.name!r}: a body with control flow of its own cannot be unrolled for training")
    scanned = attr_int(node, "num_scan_inputs")
    given_inputs = [present(value) for value in node.inputs]
    states, inputs = given_inputs[: len(given_inputs) - scanned], given_inputs[len(given_inputs) - scanned :]
    outputs = len(body.outputs) - len(states)
    in_axes = attr_ints(node, "scan_input_axes", [0] * scanned)
    in_reversed = attr_ints(node, "scan_input_directions", [0] * scanned)
    out_axes = attr_ints(node, "scan_output_axes", [0] * outputs)
    out_reversed = attr_ints(node, "scan_output_directions", [0] * outputs)
    length = info.shape(inputs[0])[in_axes[0]]
    steps = Steps(named(node), info.np_dtype(inputs[0]))
    carried = states
    stacked: list[list[ir.Value]] = [[] for _ in range(outputs)]
    for t in range(length):
        given: dict[ir.Value, ir.Value] = dict(zip(body.inputs[: len(states)], carried, strict=True))
        for x, slot, axis, backwards in zip(inputs, body.inputs[len(states):], in_axes, in_reversed, strict=True):
            given[slot] = steps.pick(x, length - 1 - t if backwards else t, axis)
        results = [given.get(v, v) for v in _step(steps, body, given, f"{named(node)}/{t}")]
        carried = results[: len(states)]
        for collected, y in zip(stacked, results[len(states):], strict=True):
            collected.append(y)
    finals = [*carried, *(steps.stack(ys[::-1] if backwards else ys, axis)
                          for ys, axis, backwards in zip(stacked, out_axes, out_reversed, strict=True))]
    for produced, wanted in zip(finals, node.outputs, strict=True):
        if wanted.name:
            steps.alias(produced, wanted)
    return steps.nodes


def _step(steps: Steps, body: ir.Graph, given: dict[ir.Value, ir.Value], prefix: str) -> list[ir.Value]:
    """Copy the body's nodes once into `steps`, reading `given` for the body's inputs (and, as it goes, the copies'
    outputs for the body's values); the body's outputs, to be looked up in `given`."""
    for k, inner in enumerate(body):
        inputs = [None if v is None else given.get(v, v) for v in inner.inputs]
        name = f"{prefix}/{inner.name or k}"
        copy = ir.Node(inner.domain, inner.op_type, inputs, list(inner.attributes.values()),
                       num_outputs=len(inner.outputs), name=name, version=inner.version)
        for j, (output, copied) in enumerate(zip(inner.outputs, copy.outputs, strict=True)):
            copied.name = f"{name}:{j}"
            given[output] = copied
        steps.nodes.append(copy)
    return list(body.outputs)
