"""Rewrite an ONNX graph to follow a schedule: nodes in schedule order, recomputations as named duplicates.

The k-th recomputation of a node `conv3` is a copy named `conv3__remat<k>` whose outputs carry the same
suffix; every consumer reads the latest instance of its input computed before it. A graph output is
carried by the last instance of its producer (the first one is then renamed `<name>__remat0`), so
onnxruntime need not hold a stale instance to the end. Every node says in `metadata_props` what it is.

Works on the protobuf directly: the rewrite only reorders, copies and renames nodes, and a protobuf copy
keeps everything else (metadata, device configurations, functions, value_info) with no round trip.
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto, StringStringEntryProto, defs, helper

from onnx_remat.opmap import OpMap
from onnx_remat.schedule import Copy, Free, Schedule

# Node metadata_props need IR >= 10. onnxruntime 1.31 reads at most IR 13 (1.32 reads 14), OpenVINO 2026 14.
MIN_IR_VERSION = 10
MAX_IR_VERSION = 13
PRELUDE_STEP = -1  # the `onnx_remat.step` of nodes run once up front, before the schedule's first event


def rewrite(
    model: ModelProto, opmap: OpMap, schedule: Schedule, device_names: tuple[str, ...] = ("cpu",)
) -> ModelProto:
    """A copy of `model` whose nodes are the prelude then the schedule's computations, in its order."""
    by_name = {node.name: node for node in model.graph.node}
    _check_coverage(by_name, opmap)
    emitter = _Emitter(device_names)
    for name in opmap.prelude:
        emitter.emit(by_name[name], 0, "forward", 0, PRELUDE_STEP)
    instances: dict[int, int] = {}
    for step, event in enumerate(schedule.events):
        if isinstance(event, Copy):
            raise ValueError(f"step {step}: copy events need the multi-device rewrite, which is not implemented")
        if isinstance(event, Free):
            continue  # onnxruntime frees a tensor after its last consumer: the order says it all
        k = instances.get(event.op, 0)
        instances[event.op] = k + 1
        role = opmap.role(event.op) if k == 0 else "recompute"
        for name in opmap.node_names[event.op]:
            emitter.emit(by_name[name], k, role, event.device, step)
    return _assemble(model, emitter)


def ir_version_for(model: ModelProto) -> int:
    """The IR version to write: at least 10 (node metadata) and what the opsets need, at most 13."""
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return min(max(MIN_IR_VERSION, needed), MAX_IR_VERSION)


def _check_coverage(by_name: dict[str, NodeProto], opmap: OpMap) -> None:
    """Every node of the graph must be in the prelude or stand in an operator, or it would be dropped."""
    covered = set(opmap.prelude).union(*opmap.node_names)
    if unknown := covered - by_name.keys():
        raise ValueError(f"the opmap names nodes the model lacks: {sorted(unknown)[:5]}")
    if missing := by_name.keys() - covered:
        raise ValueError(f"nodes in no operator and not in the prelude: {sorted(missing)[:5]}")


class _Emitter:
    """Appends node copies, suffixing outputs per instance and resolving inputs to the latest instance."""

    def __init__(self, device_names: tuple[str, ...]):
        self.device_names = device_names
        self.nodes: list[NodeProto] = []
        self.latest: dict[str, str] = {}  # original tensor name -> name of its latest instance
        self.origin: dict[str, str] = {}  # instance name -> original tensor name

    def emit(self, original: NodeProto, instance: int, role: str, device: int, step: int) -> None:
        """Append instance `instance` (0 = first computation) of `original`."""
        suffix = f"__remat{instance}" if instance else ""
        node = NodeProto()
        node.CopyFrom(original)
        node.name = original.name + suffix
        node.input[:] = [self.latest.get(name, name) for name in original.input]
        node.output[:] = [name + suffix if name else "" for name in original.output]
        for name, renamed in zip(original.output, node.output, strict=True):
            if name:
                self.latest[name] = renamed
                self.origin[renamed] = name
        meta = {"role": role, "origin": original.name, "device": self.device_names[device], "step": str(step)}
        del node.metadata_props[:]
        node.metadata_props.extend(StringStringEntryProto(key=f"onnx_remat.{k}", value=v) for k, v in meta.items())
        self.nodes.append(node)


def _assemble(model: ModelProto, emitter: _Emitter) -> ModelProto:
    """`model` with the emitted nodes, graph outputs on their last instances and shapes for every instance."""
    renames = _graph_output_renames(model, emitter.latest)
    for node in emitter.nodes:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    _drop_unread_optional_outputs(emitter.nodes, {o.name for o in model.graph.output}, _opsets(model))
    origin = {renames.get(name, name): base for name, base in emitter.origin.items()}
    out = ModelProto()
    out.CopyFrom(model)
    out.ir_version = ir_version_for(model)
    del out.graph.node[:]
    out.graph.node.extend(emitter.nodes)
    _carry_value_info(out, model, origin)
    return out


def _opsets(model: ModelProto) -> dict[str, int]:
    """Opset version per domain ("" for the default domain)."""
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def _drop_unread_optional_outputs(nodes: list[NodeProto], graph_outputs: set[str], opsets: dict[str, int]) -> None:
    """Blank the optional outputs no node reads on recomputations (a BatchNorm's running statistics, a
    Dropout mask): onnxruntime holds an unread output until the run ends, which would undo the remat."""
    read = {name for node in nodes for name in node.input} | graph_outputs
    for node in nodes:
        unread = [name for name in node.output if name and name not in read]
        if not unread or not _is_recompute(node) or not defs.has(node.op_type, node.domain):
            continue
        schema = defs.get_schema(node.op_type, opsets.get(node.domain, 1), node.domain)
        for index, name in enumerate(node.output):
            if name and name not in read and _is_optional(schema, index):
                node.output[index] = ""


def _is_recompute(node: NodeProto) -> bool:
    """Whether `node` is a recomputation (by its role metadata)."""
    return any(p.key == "onnx_remat.role" and p.value == "recompute" for p in node.metadata_props)


def _is_optional(schema: defs.OpSchema, index: int) -> bool:
    """Whether output `index` of an operator with `schema` may be left out."""
    formal = schema.outputs[min(index, len(schema.outputs) - 1)]
    return formal.option == defs.OpSchema.FormalParameterOption.Optional


def _graph_output_renames(model: ModelProto, latest: dict[str, str]) -> dict[str, str]:
    """Renames that give each graph output's name to its producer's last instance."""
    renames: dict[str, str] = {}
    for output in model.graph.output:
        last = latest.get(output.name, output.name)
        if last != output.name:
            renames[output.name] = f"{output.name}__remat0"
            renames[last] = output.name
    return renames


def _carry_value_info(model: ModelProto, original: ModelProto, origin: dict[str, str]) -> None:
    """Shapes for every intermediate instance, copied from its original tensor (Netron shows them)."""
    known = {v.name: v for v in [*original.graph.value_info, *original.graph.output]}
    produced = {name for node in model.graph.node for name in node.output} - {o.name for o in model.graph.output}
    del model.graph.value_info[:]
    for name, base in origin.items():
        if name in produced and base in known:
            info = model.graph.value_info.add()
            info.CopyFrom(known[base])
            info.name = name
