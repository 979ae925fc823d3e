"""Split the problem's node groups where one operator would hold memory onnxruntime has already freed.

The problem holds an operator's inputs until the operator ends, and all its outputs until the last reader of any of
them; onnxruntime frees each tensor after its last reader (a Relu gradient's Sign reads the forward activation, which
dies there while the Mul that follows runs: 7.5 MiB of SqueezeNet's training step). A group is cut into consecutive
parts, each an operator of its own, where that lowers the memory the problem charges for the group, judged on the
group alone with every tensor from elsewhere dying at its last reader in the group (`partition_charge`): the cut
positions are the fewest, found greedily, whose charge is within `least` bytes of the finest partition's (a cut at
every position). A cut never separates a tensor from a view or an in-place write of it, which share its buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir

from onnx_remat.passes.aliasing import shared_buffers
from onnx_remat.passes.manager import name_of
from onnx_remat.passes.reads import value_reads
from onnx_remat.passes.sizes import TensorInfo

NodeWorkspace = Callable[[ir.Node, dict[str, TensorInfo]], int]
Groups = list[tuple[tuple[str, ...], str]]


ADDED_SHARE = 0.1
"""At most this share of the groups' count is added as operators by cuts, the cuts lowering a group's charge most
first: every operator grows the solver's problem (a U-Net training step cut everywhere it gained a quarter of its
largest tensor went from 160 to 195 operators, and its 35% budget from +5.5% time in 30 s to +83%)."""


def split_groups(kept: Groups, nodes: dict[str, ir.Node], infos: dict[str, TensorInfo], workspace: NodeWorkspace,
                 graph_outputs: set[str], least: float) -> Groups:
    """Each (names, role) group in parts whose charge is within `least` bytes of the finest partition's, where that
    is `least` bytes or more below the whole group's; otherwise whole (a smaller gain only adds operators). The groups
    whose cuts gain most are cut first, adding at most ADDED_SHARE of the groups' count as operators."""
    group_of = {nodes[name]: g for g, (names, _) in enumerate(kept) for name in names}
    found = []
    for index, (names, _) in enumerate(kept):
        group = [nodes[name] for name in names]
        cuts = _fewest_cuts(group, group_of, infos, workspace, graph_outputs, least)
        if cuts:
            gain = partition_charge(group, [], group_of, infos, workspace, graph_outputs) - partition_charge(
                group, cuts, group_of, infos, workspace, graph_outputs)
            found.append((gain, index, cuts))
    room, chosen = int(ADDED_SHARE * len(kept)), {}
    for _, index, cuts in sorted(found, key=lambda item: (-item[0], item[1])):
        if len(cuts) <= room:
            chosen[index], room = cuts, room - len(cuts)
    split: Groups = []
    for index, (names, role) in enumerate(kept):
        cuts = chosen.get(index, [])
        split.extend((names[start:end], role) for start, end in zip([0, *cuts], [*cuts, len(names)], strict=True))
    return split


def _fewest_cuts(group: list[ir.Node], group_of: dict[ir.Node, int], infos: dict[str, TensorInfo],
                 workspace: NodeWorkspace, graph_outputs: set[str], least: float) -> list[int]:
    """The cut positions of `group`: from every allowed one, each dropped in turn where the charge stays within
    `least` of the finest's; none where the finest saves less than `least`."""
    allowed = allowed_cuts(group, graph_outputs)
    if not allowed:  # most groups: a single node, or views of one buffer
        return []

    def charge(cuts: Sequence[int]) -> int:
        return partition_charge(group, cuts, group_of, infos, workspace, graph_outputs)

    finest = charge(allowed)
    if finest > charge([]) - least:
        return []
    cuts = list(allowed)
    for k in allowed:
        trial = [c for c in cuts if c != k]
        if charge(trial) <= finest + least:
            cuts = trial
    return cuts


def allowed_cuts(group: list[ir.Node], graph_outputs: set[str]) -> list[int]:
    """Positions 1..len-1 of `group` where no tensor written after shares a buffer with one written before."""
    owner = shared_buffers(group, graph_outputs)
    written = [{name_of(value) for value in node.outputs} - {""} for node in group]
    before: set[str] = set()
    cuts = []
    for k in range(1, len(group)):
        before |= written[k - 1]
        if not any(owner.get(name) in before for later in written[k:] for name in later):
            cuts.append(k)
    return cuts


def partition_charge(group: list[ir.Node], cuts: Sequence[int], group_of: dict[ir.Node, int],
                     infos: dict[str, TensorInfo], workspace: NodeWorkspace, graph_outputs: set[str]) -> int:
    """The most memory the problem holds while `group` runs as the parts `cuts` make, beyond what it does not read:
    per part, the tensors of other operators read by it or a later part (per producing operator, till the last
    reader of any), those earlier parts hand it or a later part or the graph (per part, as the problem frees an
    operator's outputs together), and the part's own `node_profile`."""
    bounds = list(zip([0, *cuts], [*cuts, len(group)], strict=True))
    part_of = {node: p for p, (start, end) in enumerate(bounds) for node in group[start:end]}
    owner = shared_buffers(group, graph_outputs)
    values = {name_of(value): value for node in group for value in (*value_reads(node), *node.outputs)}
    exports = _part_exports(group, part_of, owner, graph_outputs)
    units: dict[tuple[int, int], set[str]] = {(-1, p): names for p, names in enumerate(exports)}
    last = {(-1, p): len(bounds) if any(_read_outside(values[name], part_of) for name in names if name in values)
            else p for p, names in enumerate(exports)}
    for node in group:
        for name in {owner.get(name_of(value), name_of(value)) for value in value_reads(node)}:
            producer = values[name].producer() if name in values else None
            if producer is None or producer not in group_of or part_of.get(producer) == part_of[node]:
                continue  # resident (a parameter, an input, a prelude output), or written by this part
            key = (group_of[producer], -1) if producer not in part_of else (-1, part_of[producer])
            units.setdefault(key, set()).add(name)
            last[key] = max(last.get(key, 0), part_of[node])
    peak = 0
    for p, (start, end) in enumerate(bounds):
        around = sum(infos[name].allocated_bytes for key, names in units.items() if _held(key, last[key], p)
                     for name in names if name in infos)
        peak = max(peak, around + max(node_profile(group[start:end], exports[p], infos, workspace, graph_outputs)))
    return peak


def _held(key: tuple[int, int], last: int, part: int) -> bool:
    """Whether a unit (another operator's tensors: (operator, -1); a part's exports: (-1, part)) is held while `part`
    runs: from its producer (before the group, or an earlier part) to its last reader."""
    operator, source = key
    return part <= last and (operator >= 0 or source < part)


def _part_exports(group: list[ir.Node], part_of: dict[ir.Node, int], owner: dict[str, str],
                  graph_outputs: set[str]) -> list[set[str]]:
    """Per part, the buffers of its tensors read by another part or outside the group, or graph outputs."""
    exports: list[set[str]] = [set() for _ in range(max(part_of.values(), default=-1) + 1)]
    for node in group:
        for value in node.outputs:
            name = name_of(value)
            if name and (name in graph_outputs or _read_outside(value, part_of) or any(
                    part_of.get(use.node, -1) != part_of[node] for use in value.uses())):
                exports[part_of[node]].add(owner.get(name, name))
    return exports


def _read_outside(value: ir.Value, part_of: dict[ir.Node, int]) -> bool:
    """Whether a node outside the group (or in a subgraph) reads `value`, or the graph returns it."""
    return value.is_graph_output() or any(use.node not in part_of for use in value.uses())


def node_profile(nodes: list[ir.Node], exported: set[str], infos: dict[str, TensorInfo], workspace: NodeWorkspace,
                 graph_outputs: set[str]) -> list[int]:
    """Per node of a group, the bytes its own tensors take while the node runs: internal tensors while live plus the
    `exported` outputs written so far plus the node's scratch. A tensor in another's buffer (a reshape) takes none and
    keeps that buffer alive."""
    owner = shared_buffers(nodes, graph_outputs)
    last_use: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for value in value_reads(node):
            last_use[owner.get(name_of(value), name_of(value))] = k
    output_buffers = {owner.get(name, name) for name in exported}
    live: dict[str, int] = {}
    written = 0
    profile = []
    for k, node in enumerate(nodes):
        for value in node.outputs:
            out = name_of(value)
            if not out or out in owner:
                continue
            size = infos[out].allocated_bytes if out in infos else 0
            if out in output_buffers:
                written += size
            else:
                live[out] = size
        profile.append(sum(live.values()) + written + workspace(node, infos))
        for name in [n for n in live if last_use.get(n, -1) <= k]:
            del live[name]
    return profile
