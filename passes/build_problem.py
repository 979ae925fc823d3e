"""Turn a shape-inferred ONNX graph (on onnx-ir) into the solver's Problem and the OpMap back to its nodes.

An operator is a group of nodes: one node in inference, a forward node or the nodes of its
gradient in training (the paper's T = 2N). Nodes whose inputs are all constant (Constant nodes,
plumbing fed only by initializers) run once up front (the prelude) and their outputs count as resident, like
parameters and graph inputs (a Constant always, whatever group it came in: runtimes hold its value as an
initializer, `sizes.held_as_initializer`): with one device in its resident bytes, with several in `Problem.loaded`
groups (a device holds them once an operator reading them runs there, as `run` loads them). An operator with a
node drawing random values (random_ops.py) is computed once. Edges and hand-offs come
from the IR: the producer of every value an operator's node reads (its subgraphs' outer reads included). What a
device's runtime keeps per node writing into its input's buffer after its first run (`shared_kept`:
passes/runtime_kept.py) makes each operator's kept bytes there; the prelude's load with operator 0, whose device
the rewrite puts the prelude on. What it keeps per session (`session_kept`) is resident on its device: one session per
device here, where a rewrite's device runs one segment per stretch of the schedule on it (`run_devices` counts each).
On one device, a run's execution frame (`execution_frame`: bytes per value of the session's graph, held for the
whole run) makes each operator's computations keep its nodes' outputs' share, and the resident bytes the share of
every other value (parameters, inputs, the prelude's outputs) with its block's rounding. On several, each segment's
session holds a frame of its own values while it runs (`run_devices`): the problem's `segment_frame` gives each
operator's values (those its nodes read or write), which the simulation counts while a stretch of computations runs,
and bounds it for the solvers by what holds them all: each operator's computations on a device keep their values'
share, and the device holds the block's rounding once it computes anything (a `Loaded` group every operator reads).
On one device an operator's `node_steps` say where its nodes stop reading each input, which onnxruntime frees there
when the schedule frees it after the operator (the problem holds an operator's inputs until it ends).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnx_remat.core.opmap import OpMap
from onnx_remat.core.problem import Loaded, NodeSteps, Problem, SegmentFrame
from onnx_remat.passes.aliasing import shared_buffers, writes_in_place
from onnx_remat.passes.execution_frame import ROUNDING_BYTES
from onnx_remat.passes.group_split import NodeWorkspace, node_profile, split_groups
from onnx_remat.passes.manager import name_of, named
from onnx_remat.passes.random_ops import draws_random
from onnx_remat.passes.reads import value_reads
from onnx_remat.passes.runtime_kept import sharing_nodes
from onnx_remat.passes.sizes import TensorInfo, held_as_initializer, on_heap

CUT_SHARE = 0.25
"""A group is split where that lowers its memory by this share of the graph's largest tensor or more (see
`group_split`): every peak holds that tensor, so a smaller cut moves no peak by more than this share, and would only
add operators for the solver."""

NodeCost = Callable[[ir.Node, dict[str, TensorInfo]], float]


@dataclass(frozen=True)
class GraphProblem:
    """The problem for a graph and the nodes behind each of its operators."""

    problem: Problem
    opmap: OpMap


def build_problem(
    model: ir.Model,
    infos: dict[str, TensorInfo],
    device_costs: dict[str, NodeCost],
    workspace: NodeWorkspace,
    groups: Sequence[Sequence[str]] | None = None,
    roles: Sequence[str] = (),
    shared_kept: Mapping[str, int] | None = None,
    session_kept: Mapping[str, int] | None = None,
    frame_per_value: Mapping[str, int] | None = None,
) -> GraphProblem:
    """Operators (node groups in a topological order), edges, sizes and per-device costs of `model`.

    Without `groups`, every non-constant node is its own operator, in the model's node order. A group of
    constant nodes only runs up front. `roles[i]` says whether group i is forward or backward. `shared_kept` gives, per
    device name, the bytes its runtime keeps per node writing into its input's buffer, `session_kept` per session,
    `frame_per_value` its execution frame's bytes per value of the graph (default: none).
    """
    graph = model.graph
    nodes = {named(node): node for node in graph}
    constants = constant_values(graph)
    constant = {name for name, node in nodes.items() if _is_constant_node(node, constants)}
    if groups is None:
        groups = [(name,) for name in nodes]
    # A constant node runs up front unless it belongs to a group with real work, or its group's outputs are read by
    # one such group alone, where it is recomputed with the group and its output stays transient (e.g. a weight
    # rescaled for one gradient). A Constant is up front in any case, resident from the session's load on; it leaves
    # its group only once the groups are drawn, which it still shapes (a view's gradient led by a shape Constant is
    # no lone view to attach to its producer).
    joined = _join_constant_groups(list(zip(groups, roles or [""] * len(groups), strict=True)), nodes, constant)
    least = max(1.0, CUT_SHARE * max((info.allocated_bytes for info in infos.values()), default=0))
    all_constant = [names for names, _ in joined if all(n in constant for n in names)]
    may_run_up_front = {name for names in all_constant for name in names}
    up_front = [names for names in all_constant if not _lives_as_operator(names, nodes, may_run_up_front, infos)]
    initializers = [name for name, node in nodes.items() if held_as_initializer(node)]
    as_initializers = set(initializers)
    prelude = [*initializers, *(name for names in up_front for name in names if name not in as_initializers)]
    # Constants that joined the operator reading them: the operator keeps the name of its own nodes.
    moved = {name for names in groups if all(n in constant for n in names) for name in names} - set(prelude)
    graph_outputs = {named(value) for value in graph.outputs}
    kept = _attach_views([(tuple(names), role) for names, role in joined if names not in up_front], nodes,
                         graph_outputs)
    if len(device_costs) == 1:  # several devices run segments, which hold their inputs until they return
        kept = split_groups(kept, nodes, infos, workspace, graph_outputs, least)
    kept = _without(kept, as_initializers)
    ops = [[nodes[name] for name in names] for names, _ in kept]
    group_of = {node: g for g, group in enumerate(ops) for node in group}
    edges, handed = _edges(ops, group_of)
    exported = [[value.name for node in group for value in node.outputs
                 if value.name and (value.is_graph_output() or value in handed)] for group in ops]
    held = {*graph.initializers, *(named(value) for value in graph.inputs),
            *(value.name for name in prelude for value in nodes[name].outputs if value.name)}
    resident = {name: infos[name].allocated_bytes for name in held if name in infos}
    output_bytes = [_buffer_bytes(group, outs, infos, graph_outputs, held) for group, outs in zip(ops, exported,
                                                                                                   strict=True)]
    devices = tuple(device_costs)
    per_node = [(shared_kept or {}).get(device, 0) for device in devices]
    sharing = sharing_nodes(graph, graph_outputs)
    prelude_sharing = sum(nodes[name] in sharing for name in prelude)
    per_value = [(frame_per_value or {}).get(device, 0) for device in devices]
    if len(devices) == 1:  # one session: the frame of every value, held throughout
        frame_base = [each and each * len(held) + ROUNDING_BYTES for each in per_value]
        op_values = [len(_written(group)) for group in ops]
    else:  # held on a device once it computes something
        frame_base = [0] * len(devices)
        op_values = _segment_values(ops, [nodes[name] for name in prelude])
    loaded: tuple[Loaded, ...] = ()
    if len(devices) == 1:
        always = sum(resident.values()) + per_node[0] * prelude_sharing
    else:
        always = 0
        loaded = _loaded_groups(ops, [nodes[name] for name in prelude], resident,
                                tuple(each * prelude_sharing for each in per_node))
        if ops and any(per_value):  # the frame's rounding, once a device runs a segment
            loaded += (Loaded(tuple(each and ROUNDING_BYTES for each in per_value), tuple(range(len(ops)))),)
    problem = Problem(
        op_names=tuple(_group_name([node for node in group if named(node) not in moved] or group) for group in ops),
        edges=tuple(edges),
        output_bytes=tuple(output_bytes),
        cost=tuple(tuple(sum(cost(n, infos) for n in group) for group in ops) for cost in device_costs.values()),
        resident_bytes=tuple(always + (session_kept or {}).get(device, 0) + frame_base[d]
                             for d, device in enumerate(devices)),
        budgets=(0,) * len(devices),
        graph_outputs=_held_to_end(graph, exported, group_of),
        devices=devices,
        workspace_bytes=tuple(
            _group_workspace(group, set(outs), size, infos, workspace, graph_outputs)
            for group, outs, size in zip(ops, exported, output_bytes, strict=True)
        ),
        copy_seconds_per_byte=tuple((0.0,) * len(devices) for _ in devices),
        computed_once=tuple(g for g, group in enumerate(ops) if any(draws_random(node) for node in group)),
        kept_bytes=tuple(tuple(each * sum(node in sharing for node in group) + value_bytes * values
                               for group, values in zip(ops, op_values, strict=True))
                         for each, value_bytes in zip(per_node, per_value, strict=True)),
        loaded=loaded,
        node_steps=_node_steps(ops, exported, infos, workspace, graph_outputs) if len(devices) == 1 else (),
        segment_frame=(SegmentFrame(tuple(zip(devices, per_value, strict=True)), tuple(op_values), ROUNDING_BYTES)
                       if len(devices) > 1 and any(per_value) else None),
    )
    node_names = tuple(tuple(named(n) for n in group) for group in ops)
    kept_roles = tuple(role for _, role in kept) if roles else ()
    return GraphProblem(problem, OpMap(node_names, tuple(prelude), kept_roles))


def _without(groups: list[tuple[tuple[str, ...], str]], left_out: set[str]) -> list[tuple[tuple[str, ...], str]]:
    """The groups less the nodes `left_out`, and those left empty."""
    return [(kept, role) for names, role in groups if (kept := tuple(name for name in names if name not in left_out))]


def _loaded_groups(ops: list[list[ir.Node]], prelude: list[ir.Node], resident: dict[str, int],
                   prelude_kept: tuple[int, ...]) -> tuple[Loaded, ...]:
    """The resident tensors (bytes by name) as `Loaded` groups, one per set of reading operators, as `run` loads them
    on several devices: a device holds a parameter, graph input or prelude output once a segment of it reads it.
    The prelude runs on the device of the schedule's first computation (operator 0's), so what it reads and writes,
    and what its runtime keeps for its nodes (`prelude_kept` per device), load with operator 0. A tensor nobody reads
    loads nowhere."""
    readers: dict[str, set[int]] = {}
    for g, group in enumerate(ops):
        for value in (value for node in group for value in value_reads(node)):
            if value.name in resident:
                readers.setdefault(value.name, set()).add(g)
    for value in (value for node in prelude for value in (*value_reads(node), *node.outputs)):
        if value.name in resident and ops:
            readers.setdefault(value.name, set()).add(0)
    devices = len(prelude_kept)
    grouped: dict[tuple[int, ...], list[int]] = {}
    if ops and any(prelude_kept):
        grouped[(0,)] = list(prelude_kept)
    for name, ops_reading in readers.items():
        totals = grouped.setdefault(tuple(sorted(ops_reading)), [0] * devices)
        for d in range(devices):
            totals[d] += resident[name]
    return tuple(Loaded(tuple(totals), readers) for readers, totals in sorted(grouped.items()))


def _edges(ops: list[list[ir.Node]], group_of: dict[ir.Node, int]) -> tuple[list[tuple[int, int]], set[ir.Value]]:
    """The operator edges (producer, reader), sorted, and the values some operator reads from another."""
    edges: set[tuple[int, int]] = set()
    handed: set[ir.Value] = set()
    for g, group in enumerate(ops):
        for node in group:
            for value in value_reads(node):
                source = _group(group_of, value)
                if source is not None and source != g:
                    edges.add((source, g))
                    handed.add(value)
    return sorted(edges), handed


def _group(group_of: dict[ir.Node, int], value: ir.Value) -> int | None:
    """The operator producing `value`, or None (a graph input, a parameter, a constant)."""
    producer = value.producer()
    return None if producer is None else group_of.get(producer)


def _held_to_end(graph: ir.Graph, exported: list[list[str]], group_of: dict[ir.Node, int]) -> tuple[int, ...]:
    """Operators producing graph outputs, and those whose output nothing reads: onnxruntime holds an
    unread output until the run ends, so the problem must too."""
    unread = {g for g, outs in enumerate(exported) if not outs}
    producing = {g for value in graph.outputs if (g := _group(group_of, value)) is not None}
    return tuple(sorted(producing | unread))


def _group_name(nodes: list[ir.Node]) -> str:
    return named(nodes[0]) if len(nodes) == 1 else f"{named(nodes[0])}..{named(nodes[-1])}"


def _attach_views(kept: list[tuple[tuple[str, ...], str]], nodes: dict[str, ir.Node],
                  graph_outputs: set[str]) -> list[tuple[tuple[str, ...], str]]:
    """Each operator that is one view node (a Reshape, Squeeze... whose output shares its input's buffer in
    onnxruntime, or an activation written in place over the input it alone reads) joins the operator producing that
    input, when everything else it reads is ready there: the two
    tensors are one buffer, which lives until the last reader of either, so they are kept and freed as one."""
    merged: list[tuple[list[str], str]] = []
    group_of: dict[ir.Node, int] = {}
    for names, role in kept:
        node = nodes[names[0]]
        source = node.inputs[0] if node.inputs else None
        view = len(names) == 1 and source is not None and (
            bool(shared_buffers([node], graph_outputs)) or writes_in_place(node))
        target = _group(group_of, source) if view and source is not None else None
        if target is not None and any(_later(_group(group_of, value), target) for value in value_reads(node)):
            target = None
        if target is None:
            merged.append((list(names), role))
            target = len(merged) - 1
        else:
            merged[target][0].append(names[0])
        group_of.update((nodes[name], target) for name in names)
    return [(tuple(names), role) for names, role in merged]


def _lives_as_operator(names: tuple[str, ...], nodes: dict[str, ir.Node], may_run_up_front: set[str],
                       infos: dict[str, TensorInfo]) -> bool:
    """Whether a group of constant nodes read by several operators is an operator of its own rather than up front:
    where an output is allocated on its own (not on the heap: sizes.on_heap), which onnxruntime frees after its last
    reader (the MSE loss's seed, an Expand to the output's shape read by both gradients of the square, was resident
    for the whole run: 0.79 MiB of GPT's training step; a Linear's transposed weight, read by the forward MatMul and
    by the Transpose back inside its input's gradient, 2.1 MiB of EdgeNeXt's). Graph outputs, running statistics
    (updated in place) and what constant nodes of groups that may run up front read stay up front."""
    values = [value for name in names for value in nodes[name].outputs if value.name]
    outside = may_run_up_front - set(names)
    if any(value.is_graph_output() or any(use.node.op_type == "BatchNormalization" or named(use.node) in outside
                                          for use in value.uses()) for value in values):
        return False
    return any(not on_heap(infos[value.name].nbytes) for value in values if value.name in infos)


def _join_constant_groups(groups: Sequence[tuple[Sequence[str], str]], nodes: dict[str, ir.Node],
                          constant: set[str]) -> list[tuple[tuple[str, ...], str]]:
    """Each group of constant nodes whose outputs one other group alone reads (a loss gradient's seed expanded to the
    output's shape) joins the front of that group: computed, and recomputed, with it. In the prelude its outputs would
    count as resident for the whole run, while onnxruntime frees them after their last reader. Copies of running
    statistics stay up front: a BatchNormalization updates them in place, and the rewrite gives each recomputation its
    own copy of the prelude's."""
    merged = [list(names) for names, _ in groups]
    home = list(range(len(merged)))  # the group each group's nodes are in now
    readers: dict[ir.Value, set[int]] = {}
    for g, names in enumerate(merged):
        for value in (value for name in names for value in value_reads(nodes[name])):
            readers.setdefault(value, set()).add(g)
    for g in reversed(range(len(merged))):
        values = [value for name in merged[g] for value in nodes[name].outputs]
        if not all(name in constant for name in merged[g]) or any(
                value.is_graph_output() or any(use.node.op_type == "BatchNormalization" for use in value.uses())
                for value in values):
            continue
        targets = {home[r] for value in values for r in readers.get(value, ())} - {g}
        target = targets.pop() if len(targets) == 1 else g
        if not all(name in constant for name in merged[target]):
            merged[target][:0] = merged[g]
            merged[g] = []
            home = [target if h == g else h for h in home]
    return [(tuple(names), role) for names, (_, role) in zip(merged, groups, strict=True) if names]


def _later(group: int | None, target: int) -> bool:
    """Whether `group` is an operator after `target` (None: no operator, ready from the start)."""
    return group is not None and group > target


def _buffer_bytes(nodes: list[ir.Node], exported: list[str], infos: dict[str, TensorInfo],
                  graph_outputs: set[str], resident: set[str]) -> int:
    """Bytes of the buffers behind a group's exported tensors: a view and the tensor it shares count once, and a
    view of a resident tensor (a graph input, a weight) counts nothing."""
    owner = shared_buffers(nodes, graph_outputs)
    buffers = {owner.get(name, name) for name in exported} - resident
    return sum(infos[name].allocated_bytes for name in buffers if name in infos)


def _written(nodes: list[ir.Node]) -> set[str]:
    """The names of the values `nodes` write."""
    return {value.name for node in nodes for value in node.outputs if value.name}


def _segment_values(ops: list[list[ir.Node]], prelude: list[ir.Node]) -> list[int]:
    """Per operator, the values its nodes read or write: what a computation of it adds to the session of the segment
    it runs in, on several devices (a value several of the segment's operators read counts for each: the safe side);
    the prelude's with operator 0, whose device the rewrite puts the prelude on, in its first segment there."""
    def values(nodes: list[ir.Node]) -> set[str]:
        return _written(nodes) | {name_of(value) for node in nodes for value in value_reads(node)} - {""}

    counts = [len(values(group)) for group in ops]
    if counts:
        counts[0] += len(values(prelude) - values(ops[0]))
    return counts


def _node_steps(ops: list[list[ir.Node]], exported: list[list[str]], infos: dict[str, TensorInfo],
                workspace: NodeWorkspace, graph_outputs: set[str]) -> tuple[NodeSteps, ...]:
    """Per operator, its nodes' own bytes (`node_profile`) and, for each input operator whose buffers it stops reading
    before its last node, the last node reading them: onnxruntime frees them there when nothing later reads them. An
    input whose buffer an exported view or in-place output of the operator shares lives on with that output. None if
    no operator stops reading an input early."""
    producer = {value.name: g for g, group in enumerate(ops) for node in group for value in node.outputs if value.name}
    steps = []
    for g, (group, outs) in enumerate(zip(ops, exported, strict=True)):
        owner = shared_buffers(group, graph_outputs)
        last: dict[int, int] = {}
        for k, node in enumerate(group):
            for name in (name_of(value) for value in value_reads(node)):
                source = producer.get(owner.get(name, name))
                if source is not None and source != g:
                    last[source] = k
        kept = {producer.get(owner[name]) for name in outs if name in owner}
        reads = tuple(sorted((source, k) for source, k in last.items() if source not in kept and k < len(group) - 1))
        profile = tuple(node_profile(group, set(outs), infos, workspace, graph_outputs)) if reads else ()
        steps.append(NodeSteps(profile, reads))
    return tuple(steps) if any(step.last_reads for step in steps) else ()


def _group_workspace(
    nodes: list[ir.Node],
    exported: set[str],
    exported_bytes: int,
    infos: dict[str, TensorInfo],
    workspace: NodeWorkspace,
    graph_outputs: set[str],
) -> int:
    """Transient memory of a group beyond its output, which the problem holds for the whole step: the peak of its
    `node_profile`, less the whole output."""
    return max(0, max(node_profile(nodes, exported, infos, workspace, graph_outputs)) - exported_bytes)


def constant_values(graph: ir.Graph) -> set[ir.Value]:
    """Initializers and the outputs of nodes computed from initializers alone (never from graph inputs)."""
    known = set(graph.initializers.values())
    for node in graph:
        if _is_constant_node(node, known):
            known.update(node.outputs)
    return known


def _is_constant_node(node: ir.Node, constants: set[ir.Value]) -> bool:
    """A node whose every input is constant: it runs once up front and its output stays resident."""
    return all(value is None or value in constants for value in node.inputs)
