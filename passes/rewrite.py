"""Rewrite an ONNX graph to follow a schedule: nodes in schedule order, recomputations as named duplicates.

The k-th recomputation of a node `conv3` is a copy named `conv3__remat<k>` whose outputs carry the same
suffix; every consumer reads the latest instance of its input. A graph output is always carried by the
last instance computed, so onnxruntime need not hold a stale one. Node metadata says what each node is.
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto, StringStringEntryProto

from onnx_remat.opmap import OpMap
from onnx_remat.schedule import Compute, Copy, Free, Schedule

IR_VERSION = 10  # node metadata_props need IR >= 10; onnxruntime 1.31+ and OpenVINO 2026 read it


def rewrite(
    model: ModelProto, opmap: OpMap, schedule: Schedule, device_names: tuple[str, ...] = ("cpu",)
) -> ModelProto:
    """A copy of `model` whose nodes are the schedule's computations, in its order."""
    by_name = {node.name: node for node in model.graph.node}
    emitter = _Emitter(device_names)
    for name in opmap.prelude:
        emitter.emit(by_name[name], suffix="", role="forward", origin=name, device=0, step=-1)
    computed: dict[int, int] = {}
    for step, event in enumerate(schedule.events):
        if isinstance(event, Compute):
            k = computed.get(event.op, 0)
            computed[event.op] = k + 1
            role = opmap.role(event.op) if k == 0 else "recompute"
            for name in opmap.node_names[event.op]:
                emitter.emit(by_name[name], f"__remat{k}" if k else "", role, name, event.device, step)
        elif isinstance(event, Copy):
            raise ValueError("copy events need the multi-device rewrite")
        elif not isinstance(event, Free):
            raise TypeError(f"unknown schedule event {event!r}")
    out = ModelProto()
    out.CopyFrom(model)
    out.ir_version = max(IR_VERSION, min(model.ir_version, IR_VERSION))
    del out.graph.node[:]
    out.graph.node.extend(emitter.nodes)
    _carry_graph_outputs(out, emitter.latest)
    _carry_value_info(out, model)
    return out


class _Emitter:
    """Appends node copies, renaming outputs per instance and resolving inputs to the latest instance."""

    def __init__(self, device_names: tuple[str, ...]):
        self.device_names = device_names
        self.nodes: list[NodeProto] = []
        self.latest: dict[str, str] = {}

    def emit(self, original: NodeProto, suffix: str, role: str, origin: str, device: int, step: int) -> None:
        node = NodeProto()
        node.CopyFrom(original)
        node.name = original.name + suffix
        for index, name in enumerate(node.input):
            node.input[index] = self.latest.get(name, name)
        for index, name in enumerate(original.output):
            if name:
                node.output[index] = name + suffix
                self.latest[name] = name + suffix
        del node.metadata_props[:]
        for key, value in (("role", role), ("origin", origin), ("device", self.device_names[device]), ("step", step)):
            node.metadata_props.append(StringStringEntryProto(key=f"onnx_remat.{key}", value=str(value)))
        self.nodes.append(node)


def _carry_graph_outputs(model: ModelProto, latest: dict[str, str]) -> None:
    """Give each graph output's name to its last instance; an earlier first instance becomes `__remat0`."""
    renames = {}
    for output in model.graph.output:
        last = latest.get(output.name, output.name)
        if last != output.name:
            renames[output.name] = f"{output.name}__remat0"
            renames[last] = output.name
    for node in model.graph.node:
        for field in (node.input, node.output):
            for index, name in enumerate(field):
                field[index] = renames.get(name, name)


def _carry_value_info(model: ModelProto, original: ModelProto) -> None:
    """Shapes for every intermediate instance, copied from its original tensor (Netron shows them)."""
    known = {v.name: v for v in original.graph.value_info}
    outputs = {o.name for o in model.graph.output}
    del model.graph.value_info[:]
    for node in model.graph.node:
        for name in node.output:
            base = name.split("__remat")[0]
            if name and name not in outputs and base in known:
                info = model.graph.value_info.add()
                info.CopyFrom(known[base])
                info.name = name
