"""Unroll Scan nodes over their fixed length, and Loop nodes that run a constant number of times, into copies of
their body, one per step, so the existing gradient rules differentiate the body and the rematerializer can free and
recompute single steps: the dynamo exporter writes torch's scan operator as a Scan, the legacy one a scripted `for`
loop as a Loop of constant trip count. A Scan whose body holds a subgraph of its own is refused with the node's
name. A Loop of constant trip count that may stop early (a condition computed in its body) is unrolled for training
only, every trip under a running "still going" mask (each carried value kept as it was once a trip's condition came
out false): every trip is computed, which inference need not pay. One that gives per-trip outputs is left (their
number depends on the data), as is one without a constant trip count (the while_loop operator's, and a scripted
`for` with a `break`, which the legacy exporter writes with trip count INT64_MAX and its bound in the condition):
both refused when their outputs are sized."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.graph_info import GraphInfo, attr_int, attr_ints, present
from onnx_remat.passes.autodiff.unroll_rnn import Steps
from onnx_remat.passes.manager import named
from onnx_remat.passes.reads import constant_value, inner_graphs, is_read


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


MAX_UNROLLED_TRIPS = 1024
"""A Loop running more times is left as is (and its outputs' sizes unknown): the copies would outgrow the model."""


class UnrollConstantLoops(ir.passes.InPlacePass):
    """Replace every main-graph Loop that runs a constant number of times (1 to MAX_UNROLLED_TRIPS, its condition
    constant true in and out of the body) and holds no subgraph of its own by its unrolled steps; before shape
    resolution, which cannot size a Loop's outputs. With `stopping` (for training) also those that may stop early
    (`unroll_stopping_loops`)."""

    def __init__(self, stopping: bool = False) -> None:
        super().__init__()
        self.stopping = stopping

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph, modified = model.graph, False
        for node in list(graph):
            trips = _constant_trips(node)
            if trips:
                graph.insert_before(node, _unroll_loop(node, trips, masked=False))
                graph.remove(node, safe=True)
                modified = True
        if self.stopping:
            modified = unroll_stopping_loops(model) or modified
        return ir.passes.PassResult(model, modified)


def unroll_stopping_loops(model: ir.Model) -> bool:
    """Replace every main-graph Loop of constant trip count that may stop early and gives no per-trip output that is
    read by its trips under a "still going" mask, in place (for the training step); whether there was one."""
    graph, modified = model.graph, False
    for node in list(graph):
        trips = _bounded_trips(node)
        per_trip = node.outputs[len(node.inputs) - 2 :]
        if trips and not any(is_read(value) for value in per_trip):
            graph.insert_before(node, _unroll_loop(node, trips, masked=not _runs_every_trip(node)))
            graph.remove(node, safe=True)
            modified = True
    return modified


def _constant_trips(node: ir.Node) -> int:
    """How many times a Loop node surely runs, or 0 where that is not known before running it, is over
    MAX_UNROLLED_TRIPS, or the node is no Loop with a body free of subgraphs."""
    trips = _bounded_trips(node)
    return trips if trips and _runs_every_trip(node) else 0


def _bounded_trips(node: ir.Node) -> int:
    """A Loop node's constant trip count (1 to MAX_UNROLLED_TRIPS), or 0 where it has none or is no Loop with a body
    free of subgraphs."""
    body = node.attributes.get("body")
    if node.op_type != "Loop" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2 or body is None \
            or body.type != ir.AttributeType.GRAPH or any(inner_graphs(inner) for inner in body.as_graph()):
        return 0
    trips = constant_value(node.inputs[0])
    if trips is None or trips.size != 1 or not 0 < int(trips) <= MAX_UNROLLED_TRIPS:
        return 0
    return int(trips)


def _runs_every_trip(node: ir.Node) -> bool:
    """Whether a Loop's condition is constant true in and out of its body."""
    condition, graph = node.inputs[1], node.attributes["body"].as_graph()
    if condition is not None and not _always_true(condition, None):
        return False
    return _always_true(graph.outputs[0], graph.inputs[1])


def _always_true(value: ir.Value, passed: ir.Value | None) -> bool:
    """Whether `value` is a constant true, or `passed` (the body's incoming condition), through Identity nodes."""
    while value is not passed:
        producer = value.producer()
        if producer is None or producer.op_type != "Identity" or producer.inputs[0] is None:
            break
        value = producer.inputs[0]
    if value is passed:
        return True
    known = constant_value(value)
    return known is not None and bool(np.all(known))


def _unroll_loop(node: ir.Node, trips: int, masked: bool) -> list[ir.Node]:
    """The body's nodes once per trip, each reading the iteration number as a constant, the condition and the
    previous trip's carried values; the last carried values and the stacked scan outputs take over the node's
    outputs' names and readers. `masked`: the condition is the Loop's own and then the And of every trip's, and a
    trip's carried values are the previous ones where it was false on entry (the Loop would have stopped)."""
    body = node.attributes["body"].as_graph()
    carried = [present(value) for value in node.inputs[2:]]
    steps = Steps(named(node), np.dtype(np.float32))
    stacked: list[list[ir.Value]] = [[] for _ in body.outputs[1 + len(carried):]]
    going = node.inputs[1] if masked else None
    if going is None:
        going = steps.op("Constant", value=ir.tensor(np.asarray(True)))
    for t in range(trips):
        given = dict(zip(body.inputs[2:], carried, strict=True))
        given[body.inputs[0]] = steps.ints(t)
        given[body.inputs[1]] = going
        results = [given.get(v, v) for v in _step(steps, body, given, f"{named(node)}/{t}")]
        if masked:
            carried = [steps.op("Where", going, new, old)
                       for new, old in zip(results[1 : 1 + len(carried)], carried, strict=True)]
            going = steps.op("And", going, results[0])
        else:
            carried = results[1 : 1 + len(carried)]
        for collected, y in zip(stacked, results[1 + len(carried):], strict=True):
            collected.append(y)
    for produced, wanted in zip([*carried, *(steps.stack(ys, 0) for ys in stacked)], node.outputs, strict=True):
        if wanted.name:
            steps.alias(produced, wanted)
    return steps.nodes
