"""A Netron attachment for a rewritten model: the plan shown on every node in Netron's sidebar.

Netron (source/metadata.js, `metadata.Attachment`) reads a `.json` file whose `signature` is
`"netron:attachment"`, with two lists, `metadata` and `metrics`, of items `{kind, target, name, value}`:
`kind` is `model`, `graph`, `node`, `value` or `tensor`, `target` the entity's name (`""` for the model and
the graph). Open the rewritten model in Netron, then open the attachment the same way (or drop it on the
window): each node then shows its role, origin, device and step under Metadata, and its operator's predicted
time and the device's memory after that step under Metrics. The same facts are in the model's node
`metadata_props`; the attachment adds the schedule's numbers, which the model cannot carry.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Schedule
from onnx_remat.core.tags import node_tags
from onnx_remat.passes.simulate import simulate
from onnx_remat.report import Report

SIGNATURE = "netron:attachment"


def attachment(model: onnx.ModelProto, problem: Problem, schedule: Schedule, report: Report) -> dict:
    """The attachment as a JSON-ready dict: model-level plan, per-node metadata and metrics."""
    traces = simulate(problem, schedule).memory_trace
    model_items = [
        ("budget (bytes)", report.budget_bytes),
        ("keep-all (bytes)", report.keep_all_bytes),
        ("predicted peak (bytes)", report.predicted_peak_bytes),
        ("predicted time (ms)", round(report.predicted_seconds * 1e3, 6)),
        ("overhead vs keep-all (%)", round(100 * report.time_overhead, 3)),
        ("recomputations", sum(r.extra_computations for r in report.recomputations)),
        ("copies", len(report.copies)),
        ("solver", f"{report.solver.name} {report.solver.status}, gap {100 * report.solver.gap:.2f}%"),
    ]
    metadata = [_item("model", "", name, value) for name, value in model_items]
    metrics = []
    for node in model.graph.node:
        tags = node_tags(node)
        metadata += [_item("node", node.name, key, value) for key, value in tags.items()]
        step = -1 if tags.step is None else tags.step
        event = schedule.events[step] if 0 <= step < len(schedule.events) else None
        if not isinstance(event, Compute):
            continue
        metrics += [
            _item("node", node.name, "operator", problem.op_names[event.op]),
            _item("node", node.name, "operator time (ms)", round(problem.cost[event.device][event.op] * 1e3, 6)),
            _item("node", node.name, "operator output (bytes)", problem.output_bytes[event.op]),
            _item("node", node.name, "device memory after step (bytes)", traces[event.device][step]),
        ]
    return {"signature": SIGNATURE, "metadata": metadata, "metrics": metrics}


def attachment_bytes(model: onnx.ModelProto, problem: Problem, schedule: Schedule, report: Report) -> bytes:
    """The Netron attachment for `model` as the JSON file's bytes."""
    return json.dumps(attachment(model, problem, schedule, report), indent=1).encode()


def default_path(output: str | Path) -> Path:
    """Where the attachment goes when no file is named: beside the model, `<stem>.netron.json`."""
    out = Path(output)
    return out.with_name(out.stem + ".netron.json")


def _item(kind: str, target: str, name: str, value: object) -> dict:
    """One attachment entry in Netron's shape."""
    return {"kind": kind, "target": target, "name": name, "value": value}
