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

Every node says in `metadata_props` what it is (role, origin, device, step: the schema of `onnx_remat.core.tags`), and
the model records each device's budget. With more than
one device the model also carries the machine-readable placement of IR v11: `ModelProto.configuration` lists
the devices, each node's `device_configurations` names the device index of every tensor it writes (a copy:
also of the tensor it reads); a single-device model stays at IR 10.

Works on onnx-ir, on a clone of the model (tensors shared, the input left as it was): a first computation is the
node itself, a recomputation or copy a new node, and a reader is pointed at an instance by replacing its input (in a
subgraph: the inner node's use of the outer value); the result is serialised once, as an onnx.ModelProto.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir
from onnx import DeviceConfigurationProto, ModelProto, defs, helper

from onnx_remat.core.opmap import OpMap
from onnx_remat.core.schedule import Compute, Copy, Free, Schedule
from onnx_remat.core.tags import (
    EXPANDED_FROM,
    LAYER_KEY,
    PREFIX,
    PRELUDE_STEP,
    NodeTags,
    node_tags,
    tag_entries,
    write_budgets,
)
from onnx_remat.passes.manager import named, to_proto
from onnx_remat.passes.partial_split import slice_partly_read_splits
from onnx_remat.passes.reads import inner_graphs, is_read, outer_uses, value_reads

# Node metadata_props need IR >= 10, device configurations IR >= 11. onnxruntime 1.31 reads at most IR 13
# (1.32 reads 14), OpenVINO 2026 14.
MIN_IR_VERSION = 10
DEVICE_CONFIGURATION_IR_VERSION = 11
MAX_IR_VERSION = 13
CONFIGURATION = "onnx_remat"  # the name of the model's DeviceConfigurationProto


def rewrite(
    model: ir.Model, opmap: OpMap, schedule: Schedule, device_names: tuple[str, ...] = ("cpu",),
    budgets: Mapping[str, int] | None = None,
) -> ModelProto:
    """`model` rewritten by `Rewrite` and serialised once; with `budgets` (bytes by device name), recorded in its
    metadata."""
    rewritten = Rewrite(opmap, schedule, device_names)(model).model
    proto = to_proto(rewritten)
    if len(device_names) > 1:
        _set_device_configurations(proto, device_names)
    if budgets is not None:
        write_budgets(proto, budgets)
    return proto


class Rewrite(ir.passes.FunctionalPass):
    """A functional pass (the input model is left as it was): a clone of the model whose nodes are the prelude then
    the schedule's computations and copies, in its order, at the IR version it needs."""

    def __init__(self, opmap: OpMap, schedule: Schedule, device_names: tuple[str, ...]):
        super().__init__()
        self.opmap = opmap
        self.schedule = schedule
        self.device_names = device_names

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        out = model.clone()
        graph = out.graph
        nodes = {named(node): node for node in graph}
        _check_coverage(nodes, self.opmap)
        needed = {value for node in graph for value in node.outputs if is_read(value)}
        handed = [_handed_over([nodes[name] for name in names]) for names in self.opmap.node_names]
        writer = _InstanceWriter(self.device_names, {*graph.inputs, *graph.initializers.values()})
        self._emit_prelude(writer, [nodes[name] for name in self.opmap.prelude])
        self._emit_schedule(writer, nodes, handed)
        _assemble(out, writer, needed)
        out.ir_version = ir_version_for(out, len(self.device_names))
        return ir.passes.PassResult(out, modified=True)

    def _emit_prelude(self, writer: _InstanceWriter, prelude: list[ir.Node]) -> None:
        """The prelude's nodes, on the device of the schedule's first computation, held on every device after."""
        first = next((event.device for event in self.schedule.events if isinstance(event, Compute)), 0)
        for node in prelude:
            writer.emit(node, 0, "forward", first, PRELUDE_STEP)
        writer.resident.update(value for node in prelude for value in node.outputs)
        writer.pristine = {node.outputs[0]: value for node in prelude
                            if node.op_type == "Sum" and len(node.inputs) == 1 and (value := node.inputs[0])}

    def _emit_schedule(self, writer: _InstanceWriter, nodes: dict[str, ir.Node],
                       handed: list[list[tuple[ir.Value, str]]]) -> None:
        """The schedule's computations (the k-th of an operator its (k-1)-th recomputation) and copies, in order."""
        instances: dict[int, int] = {}
        for step, event in enumerate(self.schedule.events):
            if isinstance(event, Free):
                continue  # a runtime frees a tensor after its last consumer: the order says it all
            if isinstance(event, Copy):
                for tensor, producer in handed[event.op]:
                    writer.copy(tensor, producer, event.source, event.target, step)
                continue
            k = instances.get(event.op, 0)
            instances[event.op] = k + 1
            role = self.opmap.role(event.op) if k == 0 else "recompute"
            for name in self.opmap.node_names[event.op]:
                writer.emit(nodes[name], k, role, event.device, step)


def ir_version_for(model: ir.Model, devices: int = 1) -> int:
    """The IR version to write: at least 10 (node metadata), 11 with several devices (device configurations),
    and what the opsets need, at most 13."""
    opsets = [helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
    needed = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    floor = DEVICE_CONFIGURATION_IR_VERSION if devices > 1 else MIN_IR_VERSION
    return min(max(floor, needed), MAX_IR_VERSION)


def _check_coverage(nodes: dict[str, ir.Node], opmap: OpMap) -> None:
    """Every node of the graph must be in the prelude or stand in an operator, or it would be dropped."""
    covered = set(opmap.prelude).union(*opmap.node_names)
    if unknown := covered - nodes.keys():
        raise ValueError(f"the opmap names nodes the model lacks: {sorted(unknown)[:5]}")
    if missing := nodes.keys() - covered:
        raise ValueError(f"nodes in no operator and not in the prelude: {sorted(missing)[:5]}")


def _handed_over(nodes: list[ir.Node]) -> list[tuple[ir.Value, str]]:
    """The (tensor, producing node's name) pairs an operator of `nodes` hands to other operators or the graph: what a
    copy of its output moves (every such output of a multi-output node)."""
    inside = set(nodes) | {inner for node in nodes for graph in inner_graphs(node) for inner in graph}
    return [(value, named(node)) for node in nodes for value in node.outputs
            if value.name and (value.is_graph_output() or any(use.node not in inside for use in value.uses()))]


class _InstanceWriter:
    """Emits node instances, each reading the latest instance of its inputs on its device, and copies."""

    def __init__(self, device_names: tuple[str, ...], resident: set[ir.Value]):
        self.device_names = device_names
        self.resident = resident  # values held on every device: graph inputs, parameters, prelude outputs
        self.nodes: list[ir.Node] = []
        self.tags: dict[ir.Node, NodeTags] = {}
        self.latest: dict[tuple[ir.Value, int], ir.Value] = {}  # (source value, device) -> its latest instance there
        self.last: dict[ir.Value, ir.Value] = {}  # source value -> its latest instance on any device
        self.origin: dict[ir.Value, ir.Value] = {}  # instance -> the source value it is an instance of
        self.copies: dict[tuple[ir.Value, int, int], int] = {}  # (value, source, target) -> copies made so far
        self.pristine: dict[ir.Value, ir.Value] = {}  # a resident single-input Sum's output -> its input

    def emit(self, original: ir.Node, instance: int, role: str, device: int, step: int) -> None:
        """Emit instance `instance` (0 = first computation: the node itself) of `original` on `device`; a
        recomputation of a Constant already on the device is none (a duplicate took 1.5 KiB of session memory in
        onnxruntime, and made a third of a mixture of experts' 9091 recomputed nodes). A recomputed
        training-mode BatchNorm's running statistics are no instance of the originals: onnxruntime updates the
        statistics it reads in place, so a recomputation's would apply the update twice; the graph's outputs
        keep the first computation's, and the recomputation's go unread."""
        if instance and original.op_type == "Constant" and (original.outputs[0], device) in self.latest:
            return  # onnxruntime and OpenVINO hold a Constant's value as an initializer: its first instance serves
        suffix = f"__remat{instance}" if instance else ""
        node = _instance_node(original, suffix) if instance else original
        self._point_inputs(node, device)
        if instance and _trains(original):
            self._fresh_statistics(node, suffix, device, step)
        for index, (source, value) in enumerate(zip(original.outputs, node.outputs, strict=True)):
            if source.name and not (instance and index and _trains(original)):
                self._produced(source, value, device)
        self._append(node, NodeTags(role, named(original), self.device_names[device], step))

    def _point_inputs(self, node: ir.Node, device: int) -> None:
        """Point `node`'s inputs and its subgraphs' outer reads at their latest instances on `device`."""
        for index, value in enumerate(node.inputs):
            if value is not None and (instance := self._instance(value, device, node)) is not value:
                node.replace_input_with(index, instance)
        for inner, index, value in outer_uses(node):
            if (instance := self._instance(value, device, node)) is not value:
                inner.replace_input_with(index, instance)

    def _fresh_statistics(self, node: ir.Node, suffix: str, device: int, step: int) -> None:
        """Feed a recomputed training-mode BatchNorm its own copies (single-input Sum nodes) of the running
        statistics' source, so it neither reads the first computation's in-place update nor writes into it."""
        for index in (3, 4):
            current = node.inputs[index]
            if current is None:
                raise ValueError(f"training-mode BatchNormalization {node.name!r} lacks its running statistics")
            fresh = f"{current.name}{suffix}"
            copy = ir.Node("", "Sum", [self.pristine.get(current, current)], name=fresh)
            _like(copy.outputs[0], current, fresh)
            self._append(copy, NodeTags("recompute", node.name, self.device_names[device], step))
            node.replace_input_with(index, copy.outputs[0])

    def copy(self, tensor: ir.Value, producer: str, source: int, target: int, step: int) -> None:
        """Emit an Identity node moving the latest instance of `tensor` on `source` to `target`."""
        k = self.copies.get((tensor, source, target), 0)
        self.copies[(tensor, source, target)] = k + 1
        names = self.device_names
        name = f"{tensor.name}__copy{k or ''}_{names[source]}_to_{names[target]}"
        if (tensor, source) not in self.latest:
            raise ValueError(f"step {step}: copying {tensor.name!r} from {names[source]}, where it was never computed")
        node = ir.Node("", "Identity", [self.latest[(tensor, source)]], name=name)
        _like(node.outputs[0], tensor, name)
        self._produced(tensor, node.outputs[0], target)
        self._append(node, NodeTags("copy", producer, names[target], step, names[source], names[target]))

    def _instance(self, value: ir.Value, device: int, reader: ir.Node) -> ir.Value:
        """The instance of (the source value behind) `value` that a node on `device` reads."""
        source = self.origin.get(value, value)
        if (source, device) in self.latest:
            return self.latest[(source, device)]
        if source in self.resident:
            return source
        raise ValueError(f"node {reader.name} on {self.device_names[device]} reads {source.name!r}, which is not there")

    def _produced(self, source: ir.Value, instance: ir.Value, device: int) -> None:
        self.latest[(source, device)] = instance
        self.last[source] = instance
        self.origin[instance] = source

    def _append(self, node: ir.Node, tags: NodeTags) -> None:
        """Emit `node` with `tags` written on it (and kept for the assembly); metadata that is not a tag of a
        rewrite (the exporter's, `expanded_from`) stays."""
        for key in [key for key in node.metadata_props if key == LAYER_KEY or key.startswith(PREFIX)]:
            if key != EXPANDED_FROM:
                del node.metadata_props[key]
        node.metadata_props.update(tag_entries(tags))
        self.tags[node] = tags
        self.nodes.append(node)


def _instance_node(original: ir.Node, suffix: str) -> ir.Node:
    """A new node doing what `original` does (subgraphs cloned, reading the same outer values, metadata copied), named
    and with outputs named with `suffix`, reading what `original` reads until pointed at instances."""
    attributes = [_cloned(attribute) for attribute in original.attributes.values()]
    node = ir.Node(original.domain, original.op_type, original.inputs, attributes, overload=original.overload,
                   num_outputs=len(original.outputs), version=original.version, name=named(original) + suffix,
                   doc_string=original.doc_string, metadata_props=dict(original.metadata_props))
    for value, source in zip(node.outputs, original.outputs, strict=True):
        _like(value, source, source.name + suffix if source.name else "")
    return node


def _cloned(attribute: ir.Attr) -> ir.Attr:
    """`attribute`, with a clone of each subgraph it holds (a graph belongs to one node)."""
    if attribute.is_ref() or attribute.type not in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return attribute
    if attribute.type == ir.AttributeType.GRAPH:
        return ir.AttrGraph(attribute.name, attribute.as_graph().clone(allow_outer_scope_values=True))
    return ir.AttrGraphs(attribute.name, [g.clone(allow_outer_scope_values=True) for g in attribute.as_graphs()])


def _like(value: ir.Value, source: ir.Value, name: str) -> None:
    """Name `value` and give it `source`'s type and shape."""
    value.name = name
    value.type = source.type
    value.shape = source.shape


def _assemble(model: ir.Model, writer: _InstanceWriter, needed: set[ir.Value]) -> None:
    """`model`'s graph made of the emitted nodes, its outputs the last instances of theirs, less dead instances and
    unread optional outputs, the other unread outputs released, partly read Splits sliced."""
    graph = model.graph
    emitted = set(writer.nodes)
    for node in graph:
        if node not in emitted:  # an operator the schedule never computes
            _detach(node)
    graph.remove(list(graph))
    graph.extend(writer.nodes)
    _outputs_on_last_instances(graph, writer.last)
    tags = writer.tags
    _remove_dead_instances(graph, tags, writer.origin, needed)
    _drop_unread_optional_outputs(graph, tags, _opsets(model), writer.origin, needed)
    slice_partly_read_splits(graph)
    _release_unread_outputs(graph, tags)


def _outputs_on_last_instances(graph: ir.Graph, last: dict[ir.Value, ir.Value]) -> None:
    """Give each graph output's name, and its place among the outputs, to its producer's last instance; the first
    instance becomes `<name>__remat0`."""
    for value in dict.fromkeys(graph.outputs):
        instance = last.get(value, value)
        if instance is value:
            continue
        name = named(value)
        value.name = f"{name}__remat0"
        instance.name = name
        for index, output in enumerate(graph.outputs):
            if output is value:
                graph.outputs[index] = instance


def _detach(node: ir.Node) -> None:
    """Stop `node` (and its subgraphs) reading anything, so no value counts it among its uses."""
    for inner, index, _ in outer_uses(node):
        inner.replace_input_with(index, None)
    for index in range(len(node.inputs)):
        node.replace_input_with(index, None)


def _remove_dead_instances(graph: ir.Graph, tags: dict[ir.Node, NodeTags], origin: dict[ir.Value, ir.Value],
                           needed: set[ir.Value]) -> None:
    """Remove, until none is left, the nodes whose every output goes unread where the source model reads it, if a
    copy, a recomputation, or part of an instance another instance reads: a copy moving a tensor the target does not
    need, the weight-gradient nodes of a conv gradient recomputed for its input gradient, and then a recomputation
    only those read (an LSTM training step held 2 MiB of them at its peak). onnxruntime would hold their outputs
    until the run ends, which the problem (an instance's outputs freed when the schedule frees them) does not count.
    A first computation no other instance reads is the schedule's choice and stays whole. (onnx-ir's
    RemoveUnusedNodesPass would remove those too, and unread initializers.)"""
    serving = _serving_steps(graph, tags)
    while dead := [node for node in graph if _dead(node, tags[node], origin, needed)
                   and (tags[node].role in ("copy", "recompute") or tags[node].step in serving)]:
        for node in dead:
            _detach(node)
        graph.remove(dead)


def _serving_steps(graph: ir.Graph, tags: Mapping[ir.Node, NodeTags]) -> set[int | None]:
    """The steps of the instances some other instance reads or whose output the graph returns."""
    step_of = {value: tags[node].step for node in graph for value in node.outputs}
    serving = {step_of[value] for value in graph.outputs if value in step_of}
    for node in graph:
        step = tags[node].step
        serving |= {step_of[value] for value in value_reads(node) if value in step_of and step_of[value] != step}
    return serving


def _dead(node: ir.Node, tags: NodeTags, origin: dict[ir.Value, ir.Value], needed: set[ir.Value]) -> bool:
    """Whether no output of `node` is read (a node that is no copy: and each stands for one the source reads)."""
    if tags.is_copy:
        return not is_read(node.outputs[0])
    outputs = [value for value in node.outputs if value.name]
    return bool(outputs) and all(not is_read(value) and origin.get(value, value) in needed for value in outputs)


def _set_device_configurations(model: ModelProto, devices: tuple[str, ...]) -> None:
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
        tags = node_tags(node)
        if tags.device is None:
            raise ValueError(f"rewritten node {node.name!r} has no device tag")
        if tags.is_copy:
            if tags.source is None:
                raise ValueError(f"rewritten copy {node.name!r} has no source tag")
            placement.sharding_spec.add(tensor_name=node.input[0], device=[index[tags.source]])
        for name in node.output:
            if name:
                placement.sharding_spec.add(tensor_name=name, device=[index[tags.device]])


def count_role(model: ModelProto, role: str) -> int:
    """How many nodes of a rewritten model have this `onnx_remat.role` (recompute, copy...): what a user sees."""
    return sum(1 for node in model.graph.node if node_tags(node).role == role)


def _opsets(model: ir.Model) -> dict[str, int]:
    """Opset version per domain ("" for the default domain)."""
    return {("" if domain == "ai.onnx" else domain): version for domain, version in model.opset_imports.items()}


def _drop_unread_optional_outputs(
    graph: ir.Graph, tags: dict[ir.Node, NodeTags], opsets: dict[str, int], origin: dict[ir.Value, ir.Value],
    needed: set[ir.Value],
) -> None:
    """Blank the optional outputs no node reads on recomputations (a BatchNorm's running statistics, a
    Dropout mask), and on first computations where a later instance serves the readers (a MaxPool's indices
    read by its gradient from a recomputation): onnxruntime holds an unread output until the run ends, which
    would undo the remat. A training-mode BatchNormalization keeps its running statistics (two channel-sized
    vectors): onnxruntime 1.32 requires all three outputs then, and a run with them blank crashes (SIGSEGV)."""
    for node in graph:
        unread = [value for value in node.outputs if value.name and not is_read(value)]
        if not unread or not defs.has(node.op_type, node.domain) or _trains(node):
            continue
        schema = defs.get_schema(node.op_type, opsets.get(node.domain, 1), node.domain)
        for index, value in enumerate(node.outputs):
            served_elsewhere = tags[node].role == "recompute" or origin.get(value, value) in needed
            if value in unread and served_elsewhere and _is_optional(schema, index):
                _blank(value)


def _release_unread_outputs(graph: ir.Graph, tags: dict[ir.Node, NodeTags]) -> None:
    """Give every output no node reads that cannot be left out (a recomputed training-mode BatchNorm's running
    statistics, a first computation whose readers all read a recomputation) a reader right after its producer: a
    Size node, whose output is a scalar. onnxruntime holds an unread output until the run ends, a read one only
    until its last reader; a ResNet-50 training step at its minimum held 6 MiB of them at its peak, which the
    schedule had freed."""
    outputs = set(graph.outputs)
    for node in list(graph):
        for value in node.outputs:
            if value.name and not is_read(value) and value not in outputs:
                release = ir.Node("", "Size", [value], name=f"{value.name}__release")
                release.outputs[0].name = f"{value.name}__size"
                release.outputs[0].type = ir.TensorType(ir.DataType.INT64)
                release.outputs[0].shape = ir.Shape([])
                graph.insert_after(node, [release])
                tag = tags[node]
                release.metadata_props.update(tag_entries(NodeTags("release", tag.origin, tag.device, tag.step)))


def _blank(value: ir.Value) -> None:
    """Make `value` a left-out output: no name, so no value_info either."""
    value.name = ""
    value.type = None
    value.shape = None


def _trains(node: ir.Node) -> bool:
    """Whether `node` is a BatchNormalization in training mode."""
    return node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") and bool(
        node.attributes.get_int("training_mode", 0))


def _is_optional(schema: defs.OpSchema, index: int) -> bool:
    """Whether output `index` of an operator with `schema` may be left out."""
    formal = schema.outputs[min(index, len(schema.outputs) - 1)]
    return formal.option == defs.OpSchema.FormalParameterOption.Optional
