"""Rewrite an ONNX graph to follow a schedule: nodes in schedule order, recomputations as named duplicates,
every node on its device and an explicit copy node wherever a tensor crosses devices.

The k-th recomputation of a node `conv3` is a copy named `conv3__remat<k>` whose outputs carry the same
suffix. A `Copy` event of an operator becomes, for each tensor the operator hands to other operators or the
graph, an Identity node `<tensor>__copy_<source>_to_<target>` (`__copy<k>_` for the k-th later copy of the
tensor between the same devices) whose output is the tensor's instance on the target. Every consumer reads the
latest instance of its input on its own device; parameters, graph inputs and the prelude's outputs are held
on every device. The prelude (nodes computed from parameters alone, run once up front) runs on the device of the
schedule's first computation: a schedule on one device of several then has no hand-off at all. A graph output
is carried by the last instance of its tensor (the first one is then renamed `<name>__remat0`), so onnxruntime
need not hold a stale instance to the end; copies nobody reads are dropped.

Every node says in `metadata_props` what it is (role, origin, device, step: the schema of `onnx_remat.tags`), and
the model records each device's budget. With more than
one device the model also carries the machine-readable placement of IR v11: `ModelProto.configuration` lists
the devices, each node's `device_configurations` names the device index of every tensor it writes (a copy:
also of the tensor it reads); a single-device model stays at IR 10.

Works on the protobuf directly: the rewrite only reorders, copies and renames nodes, and a protobuf copy
keeps everything else (metadata, functions, value_info) with no round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from onnx import DeviceConfigurationProto, ModelProto, NodeProto, defs, helper

from onnx_remat.opmap import OpMap
from onnx_remat.passes.partial_split import slice_partly_read_splits
from onnx_remat.passes.reads import reads, rename_outer_reads
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.schedule import Compute, Copy, Free, Schedule
from onnx_remat.tags import PRELUDE_STEP, NodeTags, node_tags, write_budgets, write_tags

# Node metadata_props need IR >= 10, device configurations IR >= 11. onnxruntime 1.31 reads at most IR 13
# (1.32 reads 14), OpenVINO 2026 14.
MIN_IR_VERSION = 10
DEVICE_CONFIGURATION_IR_VERSION = 11
MAX_IR_VERSION = 13
CONFIGURATION = "onnx_remat"  # the name of the model's DeviceConfigurationProto


def rewrite(
    model: ModelProto, opmap: OpMap, schedule: Schedule, device_names: tuple[str, ...] = ("cpu",),
    budgets: Mapping[str, int] | None = None,
) -> ModelProto:
    """A copy of `model` whose nodes are the prelude then the schedule's computations and copies, in its order;
    with `budgets` (bytes by device name), recorded in its metadata."""
    by_name = {node.name: node for node in model.graph.node}
    _check_coverage(by_name, opmap)
    resident = {value.name for value in model.graph.input} | {init.name for init in model.graph.initializer}
    emitter = _Emitter(device_names, resident)
    first = next((event.device for event in schedule.events if isinstance(event, Compute)), 0)
    for name in opmap.prelude:
        emitter.emit(by_name[name], 0, "forward", first, PRELUDE_STEP)
    emitter.resident.update(out for name in opmap.prelude for out in by_name[name].output)
    emitter.pristine = {by_name[name].output[0]: by_name[name].input[0] for name in opmap.prelude
                        if by_name[name].op_type == "Sum" and len(by_name[name].input) == 1}
    handed = _handed_over(model, by_name, opmap)
    instances: dict[int, int] = {}
    for step, event in enumerate(schedule.events):
        if isinstance(event, Free):
            continue  # a runtime frees a tensor after its last consumer: the order says it all
        if isinstance(event, Copy):
            for tensor, producer in handed[event.op]:
                emitter.copy(tensor, producer, event.source, event.target, step)
            continue
        k = instances.get(event.op, 0)
        instances[event.op] = k + 1
        role = opmap.role(event.op) if k == 0 else "recompute"
        for name in opmap.node_names[event.op]:
            emitter.emit(by_name[name], k, role, event.device, step)
    rewritten = _assemble(model, emitter)
    if budgets is not None:
        write_budgets(rewritten, budgets)
    return rewritten


def ir_version_for(model: ModelProto, devices: int = 1) -> int:
    """The IR version to write: at least 10 (node metadata), 11 with several devices (device configurations),
    and what the opsets need, at most 13."""
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    floor = DEVICE_CONFIGURATION_IR_VERSION if devices > 1 else MIN_IR_VERSION
    return min(max(floor, needed), MAX_IR_VERSION)


def _check_coverage(by_name: dict[str, NodeProto], opmap: OpMap) -> None:
    """Every node of the graph must be in the prelude or stand in an operator, or it would be dropped."""
    covered = set(opmap.prelude).union(*opmap.node_names)
    if unknown := covered - by_name.keys():
        raise ValueError(f"the opmap names nodes the model lacks: {sorted(unknown)[:5]}")
    if missing := by_name.keys() - covered:
        raise ValueError(f"nodes in no operator and not in the prelude: {sorted(missing)[:5]}")


def _handed_over(model: ModelProto, nodes: dict[str, NodeProto], opmap: OpMap) -> list[list[tuple[str, str]]]:
    """Per operator, the (tensor, producing node) pairs it hands to other operators or the graph: what a copy of
    its output moves (every such output of a multi-output node)."""
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in reads(node):
            readers.setdefault(name, set()).add(node.name)
    graph_outputs = {output.name for output in model.graph.output}
    handed = []
    for names in opmap.node_names:
        inside = set(names)
        handed.append([
            (out, name) for name in names for out in nodes[name].output
            if out and (out in graph_outputs or readers.get(out, set()) - inside)
        ])
    return handed


class _Emitter:
    """Appends node copies, suffixing outputs per instance and resolving inputs to the latest instance on the
    reading node's device."""

    def __init__(self, device_names: tuple[str, ...], resident: set[str]):
        self.device_names = device_names
        self.resident = resident  # tensors held on every device: graph inputs, parameters, prelude outputs
        self.nodes: list[NodeProto] = []
        self.tags: dict[str, NodeTags] = {}  # emitted node name -> the tags written on it
        self.latest: dict[tuple[str, int], str] = {}  # (original tensor, device) -> its latest instance there
        self.last: dict[str, str] = {}  # original tensor name -> its latest instance on any device
        self.origin: dict[str, str] = {}  # instance name -> original tensor name
        self.copies: dict[tuple[str, int, int], int] = {}  # (tensor, source, target) -> copies made so far
        self.pristine: dict[str, str] = {}  # a resident single-input Sum's output -> its input (stat copies)

    def emit(self, original: NodeProto, instance: int, role: str, device: int, step: int) -> None:
        """Append instance `instance` (0 = first computation) of `original` on `device`. A recomputed
        training-mode BatchNorm's running statistics are no instance of the originals: onnxruntime updates the
        statistics it reads in place, so a recomputation's would apply the update twice; the graph's outputs
        keep the first computation's, and the recomputation's go unread."""
        suffix = f"__remat{instance}" if instance else ""
        node = NodeProto()
        node.CopyFrom(original)
        node.name = original.name + suffix
        node.input[:] = [self._instance(name, device, node.name) for name in original.input]
        rename_outer_reads(node, lambda name: self._instance(name, device, node.name))
        if instance and _trains(original):
            self._fresh_statistics(node, suffix, device, step)
        node.output[:] = [name + suffix if name else "" for name in original.output]
        for index, (name, renamed) in enumerate(zip(original.output, node.output, strict=True)):
            if name and not (instance and index and _trains(original)):
                self._produced(name, renamed, device)
        self._tag(node, NodeTags(role, original.name, self.device_names[device], step))
        self.nodes.append(node)

    def _fresh_statistics(self, node: NodeProto, suffix: str, device: int, step: int) -> None:
        """Feed a recomputed training-mode BatchNorm its own copies (single-input Sum nodes) of the running
        statistics' source, so it neither reads the first computation's in-place update nor writes into it."""
        for index in (3, 4):
            source = self.pristine.get(node.input[index], node.input[index])
            fresh = f"{node.input[index]}{suffix}"
            copy = helper.make_node("Sum", [source], [fresh], name=fresh)
            self._tag(copy, NodeTags("recompute", node.name, self.device_names[device], step))
            self.nodes.append(copy)
            node.input[index] = fresh

    def copy(self, tensor: str, producer: str, source: int, target: int, step: int) -> None:
        """Append an Identity node moving the latest instance of `tensor` on `source` to `target`."""
        k = self.copies.get((tensor, source, target), 0)
        self.copies[(tensor, source, target)] = k + 1
        names = self.device_names
        name = f"{tensor}__copy{k or ''}_{names[source]}_to_{names[target]}"
        if (tensor, source) not in self.latest:
            raise ValueError(f"step {step}: copying {tensor!r} from {names[source]}, where it was never computed")
        node = helper.make_node("Identity", [self.latest[(tensor, source)]], [name], name=name)
        self._produced(tensor, name, target)
        self._tag(node, NodeTags("copy", producer, names[target], step, names[source], names[target]))
        self.nodes.append(node)

    def _instance(self, name: str, device: int, reader: str) -> str:
        """The instance of tensor `name` that a node on `device` reads."""
        if not name or (name, device) in self.latest:
            return self.latest.get((name, device), name)
        if name in self.resident:
            return name
        raise ValueError(f"node {reader} on {self.device_names[device]} reads {name!r}, which is not there")

    def _produced(self, tensor: str, instance: str, device: int) -> None:
        self.latest[(tensor, device)] = instance
        self.last[tensor] = instance
        self.origin[instance] = tensor

    def _tag(self, node: NodeProto, tags: NodeTags) -> None:
        """Write `tags` on the node and keep them for the assembly."""
        write_tags(node, tags)
        self.tags[node.name] = tags


def _assemble(model: ModelProto, emitter: _Emitter) -> ModelProto:
    """`model` with the emitted nodes, graph outputs on their last instances, shapes for every instance and,
    with several devices, the device configuration."""
    renames = _graph_output_renames(model, emitter.last)
    for node in emitter.nodes:
        node.input[:] = [renames.get(name, name) for name in node.input]
        rename_outer_reads(node, lambda name: renames.get(name, name))
        node.output[:] = [renames.get(name, name) for name in node.output]
    graph_outputs = {o.name for o in model.graph.output}
    origin = {renames.get(name, name): base for name, base in emitter.origin.items()}
    needed = {name for node in model.graph.node for name in reads(node)} | graph_outputs
    tags = emitter.tags
    nodes = _without_dead_instances(emitter.nodes, tags, graph_outputs, origin, needed)
    _drop_unread_optional_outputs(nodes, tags, graph_outputs, _opsets(model), origin, needed)
    read = {name for node in nodes for name in reads(node)} | graph_outputs
    nodes, constants, replaced = slice_partly_read_splits(nodes, read, _shapes(model, origin))
    tags.update({name: tags[split] for name, split in replaced.items()})
    out = ModelProto()
    out.CopyFrom(model)
    devices = emitter.device_names
    out.ir_version = ir_version_for(model, len(devices))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(constants)
    if len(devices) > 1:
        _set_device_configurations(out, devices, tags)
    _carry_value_info(out, model, origin)
    return out


def _shapes(model: ModelProto, origin: dict[str, str]) -> Callable[[str], list[int] | None]:
    """A tensor's concrete shape in the rewritten graph, by the shape of the source tensor it is an instance of."""
    infos = tensor_infos(model)

    def shape_of(name: str) -> list[int] | None:
        info = infos.get(origin.get(name, name))
        return None if info is None else list(info.shape)

    return shape_of


def _without_dead_instances(
    nodes: list[NodeProto], tags: dict[str, NodeTags], graph_outputs: set[str], origin: dict[str, str],
    needed: set[str],
) -> list[NodeProto]:
    """`nodes` less, until none is left, the nodes whose every output goes unread where the source model reads it,
    if a copy, a recomputation, or part of an instance another instance reads: a copy moving a tensor the target
    does not need, the weight-gradient nodes of a conv gradient recomputed for its input gradient, and then a
    recomputation only those read (an LSTM training step held 2 MiB of them at its peak). onnxruntime would hold
    their outputs until the run ends, which the problem (an instance's outputs freed when the schedule frees them)
    does not count. A first computation no other instance reads is the schedule's choice and stays whole."""
    serving = _serving_steps(nodes, tags, graph_outputs)
    while True:
        read = {name for node in nodes for name in reads(node)} | graph_outputs
        kept = [node for node in nodes if not _dead(node, tags[node.name], read, origin, needed)
                or (tags[node.name].role not in ("copy", "recompute") and tags[node.name].step not in serving)]
        if len(kept) == len(nodes):
            return nodes
        nodes = kept


def _serving_steps(nodes: list[NodeProto], tags: Mapping[str, NodeTags], graph_outputs: set[str]) -> set[int | None]:
    """The steps of the instances some other instance reads or whose output the graph returns."""
    step_of = {name: tags[node.name].step for node in nodes for name in node.output if name}
    serving = {step_of[name] for name in graph_outputs if name in step_of}
    for node in nodes:
        step = tags[node.name].step
        serving |= {step_of[name] for name in reads(node) if name in step_of and step_of[name] != step}
    return serving


def _dead(node: NodeProto, tags: NodeTags, read: set[str], origin: dict[str, str], needed: set[str]) -> bool:
    """Whether no output of `node` is read (a node that is no copy: and each stands for one the source reads)."""
    if tags.is_copy:
        return node.output[0] not in read
    outputs = [name for name in node.output if name]
    return bool(outputs) and all(name not in read and origin.get(name, name) in needed for name in outputs)


def _set_device_configurations(model: ModelProto, devices: tuple[str, ...], tags: dict[str, NodeTags]) -> None:
    """IR v11 placement: a configuration listing the devices, and on each node the device index of every tensor
    it writes (a copy: also of the one it reads)."""
    index = {name: k for k, name in enumerate(devices)}
    kept = [c for c in model.configuration if c.name != CONFIGURATION]
    del model.configuration[:]
    model.configuration.extend(kept)
    model.configuration.append(DeviceConfigurationProto(name=CONFIGURATION, num_devices=len(devices), device=devices))
    for node in model.graph.node:
        del node.device_configurations[:]
        placement = node.device_configurations.add(configuration_id=CONFIGURATION)
        node_tags = tags[node.name]
        if node_tags.device is None:
            raise ValueError(f"rewritten node {node.name!r} has no device tag")
        if node_tags.is_copy:
            if node_tags.source is None:
                raise ValueError(f"rewritten copy {node.name!r} has no source tag")
            placement.sharding_spec.add(tensor_name=node.input[0], device=[index[node_tags.source]])
        for name in node.output:
            if name:
                placement.sharding_spec.add(tensor_name=name, device=[index[node_tags.device]])


def count_role(model: ModelProto, role: str) -> int:
    """How many nodes of a rewritten model have this `onnx_remat.role` (recompute, copy...): what a user sees."""
    return sum(1 for node in model.graph.node if node_tags(node).role == role)


def _opsets(model: ModelProto) -> dict[str, int]:
    """Opset version per domain ("" for the default domain)."""
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def _drop_unread_optional_outputs(
    nodes: list[NodeProto], tags: dict[str, NodeTags], graph_outputs: set[str], opsets: dict[str, int],
    origin: dict[str, str], needed: set[str],
) -> None:
    """Blank the optional outputs no node reads on recomputations (a BatchNorm's running statistics, a
    Dropout mask), and on first computations where a later instance serves the readers (a MaxPool's indices
    read by its gradient from a recomputation): onnxruntime holds an unread output until the run ends, which
    would undo the remat. A training-mode BatchNormalization keeps its running statistics (two channel-sized
    vectors): onnxruntime 1.32 requires all three outputs then, and a run with them blank crashes (SIGSEGV)."""
    read = {name for node in nodes for name in reads(node)} | graph_outputs
    for node in nodes:
        unread = [name for name in node.output if name and name not in read]
        if not unread or not defs.has(node.op_type, node.domain) or _trains(node):
            continue
        schema = defs.get_schema(node.op_type, opsets.get(node.domain, 1), node.domain)
        for index, name in enumerate(node.output):
            served_elsewhere = tags[node.name].role == "recompute" or origin.get(name, name) in needed
            if name and name not in read and served_elsewhere and _is_optional(schema, index):
                node.output[index] = ""


def _trains(node: NodeProto) -> bool:
    """Whether `node` is a BatchNormalization in training mode."""
    return node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") and any(
        a.name == "training_mode" and a.i for a in node.attribute)


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
