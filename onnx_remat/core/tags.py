"""The tags onnx-remat writes into a rewritten model's metadata_props, and the one parser that reads them back.

Every node says what it is: `onnx_remat.role` (forward, backward, recompute, copy, or release: a Size node
reading an output nobody else reads, so that onnxruntime frees it at once instead of at the end of the run),
`onnx_remat.origin` (the original node; for a copy, the node producing the tensor), `onnx_remat.device` (for a
copy, the target; `onnx_remat.source` and `onnx_remat.target` name both ends) and `onnx_remat.step` (the schedule
event it runs at, PRELUDE_STEP for nodes run once up front), plus `layer_ann` = the device name: onnxruntime pins a
node to a provider by that key with the session option `session.layer_assignment_settings`. The model records each
device's budget in bytes as `onnx_remat.core.budget.<device>`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

from onnx import ModelProto, NodeProto, StringStringEntryProto

from onnx_remat.core.errors import ModelError

PREFIX = "onnx_remat."
LAYER_KEY = "layer_ann"
"""The node metadata key onnxruntime's session.layer_assignment_settings matches."""
BUDGET_PREFIX = PREFIX + "budget."
EXPANDED_FROM = PREFIX + "expanded_from"
"""The node metadata key naming the node (and op) whose function body a node is part of (passes/expand_functions.py)."""
PRELUDE_STEP = -1
"""The step of nodes run once up front, before the schedule's first event."""


@dataclass(frozen=True)
class NodeTags:
    """A node's onnx_remat tags; None for a tag it lacks (a node no onnx-remat rewrite wrote)."""

    role: str | None = None
    origin: str | None = None
    device: str | None = None
    step: int | None = None
    source: str | None = None
    target: str | None = None

    @property
    def is_copy(self) -> bool:
        return self.role == "copy"

    def items(self) -> Iterator[tuple[str, str]]:
        """The tags the node has, as (key without the prefix, written value), in the order they are written."""
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                yield field.name, str(value)


def node_tags(node: NodeProto) -> NodeTags:
    """The onnx_remat tags of `node` (one pass over its metadata)."""
    found = {p.key.removeprefix(PREFIX): p.value for p in node.metadata_props if p.key.startswith(PREFIX)}
    step = found.get("step")
    if step is not None and not step.lstrip("-").isdigit():
        raise ModelError(f"node {node.name!r} has the {PREFIX}step tag {step!r}, not a whole number: run a model "
                         "written by onnx-remat")
    return NodeTags(found.get("role"), found.get("origin"), found.get("device"),
                    None if step is None else int(step), found.get("source"), found.get("target"))


def tag_entries(tags: NodeTags) -> dict[str, str]:
    """The metadata a node with `tags` carries, in order: the prefixed tags, then `layer_ann` = its device."""
    return {**{PREFIX + key: value for key, value in tags.items()}, LAYER_KEY: tags.device or ""}


def write_budgets(model: ModelProto, budgets: Mapping[str, int]) -> None:
    """Record each device's budget in bytes in the model's metadata (replacing any recorded before), so a run can
    compare its peaks with them."""
    kept = [p for p in model.metadata_props if not p.key.startswith(BUDGET_PREFIX)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.extend(
        StringStringEntryProto(key=BUDGET_PREFIX + name, value=str(value)) for name, value in budgets.items()
    )


def read_budgets(model: ModelProto) -> dict[str, int]:
    """The budgets `write_budgets` recorded, by device name."""
    return {
        p.key.removeprefix(BUDGET_PREFIX): int(p.value) for p in model.metadata_props if p.key.startswith(BUDGET_PREFIX)
    }
