"""Expand, in place, the ONNX ops onnxruntime's CPU provider runs as their function body.

onnxruntime has no CPU kernel for some ops ONNX defines as functions (HardSwish, CastLike, Mish,
GroupNormalization...). At session creation it inlines their bodies and numbers the new nodes after every node in
the file; its priority-based order then runs every other ready node first, later nodes of a rewritten schedule
included, so the model no longer runs in the planned order and its peak breaks the budget (MobileNetV3-small's
training step at batch 32: 54.78 MiB measured against a 26.60 MiB budget). `ExpandFunctions` replaces each such
node by its body at the node's own position. `prepare` runs it after the training build (differentiated whole, a
HardSwish keeps only its input for the backward; expanded, also its HardSigmoid output), so the operator grouping,
costs and rewrite see the nodes that run.

Only the main graph: an If or Loop runs as one node of the schedule, so the order onnxruntime gives the nodes of
its bodies does not change the schedule's memory.
"""

from __future__ import annotations

import functools

import onnx
import onnx_ir as ir
from onnx_ir import _cloner
from onnxruntime.capi._pybind_state import get_all_opkernel_def

from onnx_remat.core.tags import EXPANDED_FROM

CPU_PROVIDER = "CPUExecutionProvider"


class ExpandFunctions(ir.passes.InPlacePass):
    """Replace every main-graph node whose ONNX op has no onnxruntime CPU kernel at the model's opset but a function
    body by the body's nodes, named `<node>/<body node>`, each tagged with the node it came from; repeated until no
    such node is left (a body may use another such op)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model_opset(model)
        modified = False
        while expansions := [(node, body) for node in model.graph if (body := function_body(node, opset))]:
            expand_nodes(model, expansions)
            modified = True
        return ir.passes.PassResult(model, modified=modified)


def model_opset(model: ir.Model) -> int:
    """The model's ONNX-domain opset."""
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def expand_nodes(model: ir.Model, expansions: list[tuple[ir.Node, onnx.FunctionProto]]) -> None:
    """Replace each main-graph node by its body's nodes, in place, as ExpandFunctions does."""
    opset, names = model_opset(model), _Names(model.graph)
    for node, body in expansions:
        _expand(model.graph, node, body, _attributes(node, opset), names)


@functools.cache
def _cpu_kernel_ranges() -> dict[str, tuple[tuple[int, int], ...]]:
    """Per ONNX-domain op, the opset version ranges onnxruntime's CPU provider has a kernel for."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for kernel in get_all_opkernel_def():
        if kernel.provider == CPU_PROVIDER and kernel.domain in ("", "ai.onnx"):
            ranges.setdefault(kernel.op_name, []).append(tuple(kernel.version_range))
    return {op: tuple(spans) for op, spans in ranges.items()}


def has_cpu_kernel(op_type: str, since_version: int) -> bool:
    """Whether onnxruntime's CPU provider has a kernel for the ONNX op `op_type` as defined at `since_version`."""
    return any(start <= since_version <= end for start, end in _cpu_kernel_ranges().get(op_type, ()))


def function_body(node: ir.Node, opset: int) -> onnx.FunctionProto | None:
    """The function body onnxruntime would inline for `node` at `opset`: its `defined_body`, if onnxruntime's CPU
    provider has no kernel for the op."""
    if node.domain not in ("", "ai.onnx") or not onnx.defs.has(node.op_type, opset, ""):
        return None
    if has_cpu_kernel(node.op_type, onnx.defs.get_schema(node.op_type, opset, "").since_version):
        return None
    return defined_body(node, opset)


def defined_body(node: ir.Node, opset: int) -> onnx.FunctionProto | None:
    """The function body ONNX defines for `node` at `opset`, whether or not a runtime has a kernel for it: None when
    the node is not of the ONNX domain, has no function body, its context-dependent body needs an input type not
    known, or the body's ops mean something else at `opset` than at the opset it was written for."""
    if node.domain not in ("", "ai.onnx") or not onnx.defs.has(node.op_type, opset, ""):
        return None
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    # onnx's stubs (1.23) lack the function-body accessors of OpSchema; a body is stored at the opsets it was written
    # for, and the one in effect at `opset` is the latest of those up to it
    if schema.has_function:  # type: ignore[attr-defined]
        version = _in_effect(schema.function_opset_versions, opset)  # type: ignore[attr-defined]
        body = schema.get_function_with_opset_version(version)  # type: ignore[attr-defined]
    elif schema.has_context_dependent_function and all(_typed(v) for v in node.inputs):  # type: ignore[attr-defined]
        version = _in_effect(schema.context_dependent_function_opset_versions, opset)  # type: ignore[attr-defined]
        # with their shapes: a body may depend on an input's rank (RotaryEmbedding-23 writes none without)
        types = [ir.serde.serialize_value(v).type.SerializeToString() for v in node.inputs if v and v.type]
        node_bytes = ir.serde.serialize_node(node).SerializeToString()
        body = schema.get_context_dependent_function_with_opset_version(  # type: ignore[attr-defined]
            version, node_bytes, types)
    else:
        return None
    function = _without_unwritten_outputs(onnx.FunctionProto.FromString(body))
    return function if body and _same_meaning(function, opset) else None


def _without_unwritten_outputs(function: onnx.FunctionProto) -> onnx.FunctionProto:
    """The body without the outputs it declares but no node of it writes: a context-dependent body (Attention-23)
    writes only the optional outputs its node asks for."""
    written = {name for node in function.node for name in node.output} | set(function.input)
    kept = [name for name in function.output if name in written]
    del function.output[:]
    function.output.extend(kept)
    return function


def _in_effect(versions: list[int], opset: int) -> int:
    """The latest of the opset `versions` a function body was written for that is not after `opset` (0 for none)."""
    return max((version for version in versions if version <= opset), default=0)


def _typed(value: ir.Value | None) -> bool:
    """Whether `value` is given (not a left-out optional input) and has a known type."""
    return value is not None and value.type is not None


def _same_meaning(function: onnx.FunctionProto, opset: int) -> bool:
    """Whether every ONNX op of `function` has the same definition at `opset` as at the opset the body imports."""
    written = next((o.version for o in function.opset_import if o.domain in ("", "ai.onnx")), opset)
    return all(
        node.domain not in ("", "ai.onnx")
        or onnx.defs.get_schema(node.op_type, written, "").since_version
        == onnx.defs.get_schema(node.op_type, opset, "").since_version
        for node in function.node
    )


class _Names:
    """The node and value names used in a graph, to give expanded nodes and values fresh ones."""

    def __init__(self, graph: ir.Graph) -> None:
        self.used = {node.name for node in ir.traversal.RecursiveGraphIterator(graph)}
        self.used |= {v.name for v in graph.inputs} | set(graph.initializers)
        self.used |= {v.name for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs}

    def fresh(self, name: str) -> str:
        """`name`, or `name_<k>` for the smallest k >= 2 not used yet; the result becomes used."""
        candidate, k = name, 1
        while candidate in self.used:
            k += 1
            candidate = f"{name}_{k}"
        self.used.add(candidate)
        return candidate


def _expand(graph: ir.Graph, node: ir.Node, body: onnx.FunctionProto, attributes: dict[str, ir.Attr],
            names: _Names) -> None:
    """Replace `node` in `graph` by the nodes of `body` with `attributes` for its references, at the node's
    position, its outputs keeping their names."""
    function = ir.serde.deserialize_function(body)
    value_map: dict[ir.Value, ir.Value | None] = dict(zip(function.inputs, node.inputs, strict=False))
    value_map.update({value: None for value in function.inputs[len(node.inputs):]})
    prefix = node.name or node.op_type

    def rename(new: ir.Node) -> None:
        new.name = names.fresh(f"{prefix}/{new.name or new.op_type}")
        for value in new.outputs:
            value.name = names.fresh(f"{prefix}/{value.name or 'out'}")

    cloner = _cloner.Cloner(attr_map=attributes, value_map=value_map,
                            metadata_props={**node.metadata_props, EXPANDED_FROM: f"{prefix} ({node.op_type})"},
                            post_process=rename, resolve_ref_attrs=True)
    nodes = [cloner.clone_node(inner) for inner in function]
    outputs = [_returned(value_map[value], node) for value in function.outputs]
    ir.convenience.replace_nodes_and_values(graph, node, [node], nodes, node.outputs, outputs)


def _returned(value: ir.Value | None, node: ir.Node) -> ir.Value:
    """The value a body output of `node` became (ValueError for a left-out optional input, which no body returns)."""
    if value is None:
        raise ValueError(f"{node.op_type}'s function body returns a left-out input of node {node.name!r}")
    return value


def _attributes(node: ir.Node, opset: int) -> dict[str, ir.Attr]:
    """The node's attributes with the schema's defaults for those it leaves out, which the body's references read."""
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    defaults = {
        name: ir.serde.deserialize_attribute(attribute.default_value)
        for name, attribute in schema.attributes.items() if attribute.default_value.name
    }
    return {**defaults, **node.attributes}
