"""Where the two predictions of a rewrite's peak differ: the report's (the solver's simulation of the problem) and
`run`'s (the rewritten graph's node-level liveness, `run_devices.build_plan`), on one CPU device or on several.

Rewrites a model (a zoo architecture exported by `real_model_zoo`, or an ONNX file) at a budget and, at the step
where the report peaks and at the one where `run` peaks (a step: one computation of the schedule, the nodes of one
operator in the rewritten graph), prints both figures, what each holds resident (the problem: parameters, inputs,
the prelude's outputs, on several devices those the device's computations read; `run`: the parameters read and the
inputs), and the tensors one holds there and the other does not, largest first (recomputations counted under their
original's name).

With `--devices` naming several devices, it does so on each device: at the schedule's event where the report peaks
there (a computation on it or a copy into it) and at the step of `run`'s plan where it peaks there (a segment, at
its heaviest node, or a hand-off into it), each beside what the other prediction holds on that device at that
moment (copies and recomputations counted under their original's name).

    python tools/prediction_gap.py densenet121 --exporter legacy --mode train --budget min --time-limit 60
    python tools/prediction_gap.py gpt --batch 256 --mode train --budget min --time-limit 20
    python tools/prediction_gap.py efficientnet_b0.onnx --devices devices/ort-cpu+ov-cpu.toml --budget 40%
"""

from __future__ import annotations

import argparse
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from real_model_zoo import EXPORTERS, architecture, export

from onnx_remat.core.devices import get_devices
from onnx_remat.core.options import RematOptions, TrainingOptions
from onnx_remat.core.schedule import Compute, Copy, Free
from onnx_remat.core.tags import node_tags
from onnx_remat.passes.manager import named
from onnx_remat.passes.measure import node_memory
from onnx_remat.passes.reads import value_reads
from onnx_remat.passes.run_devices import Handoff, Plan, Segment, build_plan, step_holdings
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.sizes import tensor_infos
from onnx_remat.pipeline import CostedProblem, RematResult, costed, rewritten, solve_at

MIB = 2**20
SHOWN = 8  # tensors listed per side and step
INSTANCE = re.compile(r"(__remat\d+|__copy\d*_.+_to_.+)$")  # what the rewrite appends to an instance's name


@dataclass(frozen=True)
class Step:
    """One schedule step as a prediction sees it: its peak bytes, the bytes held resident, the tensors held and the
    workspace (the problem's: an operator's internal tensors and scratch; run's: the node's scratch)."""

    peak: int
    resident: int
    tensors: dict[str, int]
    workspace: int


def report_steps(costed_problem: CostedProblem, result: RematResult) -> dict[int, Step]:
    """Per computation of the schedule (by event index), the problem's memory while it runs: resident bytes, the
    exported tensors of every operator held (its own included) and its workspace."""
    problem = result.problem
    exports = exported_tensors(costed_problem)
    resident = problem.resident_bytes[0]
    held: set[int] = set()
    steps = {}
    for index, event in enumerate(result.schedule.events):
        if isinstance(event, Compute):
            held.add(event.op)
            tensors = {name: size for op in held for name, size in exports[op].items()}
            workspace = problem.workspace_bytes[event.op]
            steps[index] = Step(resident + sum(problem.output_bytes[op] for op in held) + workspace, resident,
                                tensors, workspace)
        elif isinstance(event, Free):
            held.discard(event.op)
    return steps


def exported_tensors(costed_problem: CostedProblem) -> list[dict[str, int]]:
    """Per operator, the bytes of each tensor it hands to another operator or the graph (what the problem holds)."""
    model, opmap = costed_problem.prepared.model, costed_problem.opmap
    infos = tensor_infos(model)
    nodes = {named(node): node for node in model.graph}
    op_of = {name: op for op, names in enumerate(opmap.node_names) for name in names}
    read_by: dict[str, set[int]] = {}
    for name, node in nodes.items():
        for value in value_reads(node):
            read_by.setdefault(value.name, set()).add(op_of.get(name, -1))
    return [{value.name: infos[value.name].allocated_bytes for name in names for value in nodes[name].outputs
             if value.name in infos and (value.is_graph_output() or read_by.get(value.name, set()) - {op})}
            for op, names in enumerate(opmap.node_names)]


def run_steps(model: onnx.ModelProto) -> dict[int, Step]:
    """Per schedule step, the rewritten graph's memory at the step's heaviest node: `run`'s prediction."""
    peak = build_plan(model, get_devices(None)).peak_bytes[0]
    nodes = list(node_memory(model))
    resident = peak - max(sum(node.live.values()) + node.workspace for node in nodes)
    steps: dict[int, Step] = {}
    for proto, node in zip(model.graph.node, nodes, strict=True):
        step = node_tags(proto).step
        total = resident + sum(node.live.values()) + node.workspace
        if step is not None and (step not in steps or total > steps[step].peak):
            tensors: dict[str, int] = {}
            for name, size in node.live.items():
                original = re.sub(r"__remat\d+$", "", name)
                tensors[original] = tensors.get(original, 0) + size
            steps[step] = Step(total, resident, tensors, node.workspace)
    return steps


def report_on_device(costed_problem: CostedProblem, result: RematResult, device: int, until: int) -> Step:
    """The problem's memory on `device` at event `until` of the schedule (a computation there: while it runs):
    resident bytes and the loaded groups its computations read, the exported tensors of every operator held there and
    the computation's workspace."""
    problem, events = result.problem, result.schedule.events
    exports = exported_tensors(costed_problem)
    held: set[int] = set()
    for event in events[:until + 1]:
        if isinstance(event, Compute) and event.device == device or isinstance(event, Copy) and event.target == device:
            held.add(event.op)
        elif isinstance(event, Free) and event.device == device:
            held.discard(event.op)
    last = events[until]
    workspace = problem.workspace_bytes[last.op] if isinstance(last, Compute) and last.device == device else 0
    resident = problem.resident_with(device, result.schedule.computed_on(device))
    tensors = {name: size for op in held for name, size in exports[op].items()}
    return Step(resident + sum(problem.output_bytes[op] for op in held) + workspace, resident, tensors, workspace)


def report_peak_event(result: RematResult, device: int) -> int:
    """The schedule's event at which the problem's memory on `device` peaks (a computation there or a copy into
    it)."""
    problem = result.problem
    held: set[int] = set()
    best, at = -1, 0
    for index, event in enumerate(result.schedule.events):
        if isinstance(event, Free):
            if event.device == device:
                held.discard(event.op)
            continue
        if (event.device if isinstance(event, Compute) else event.target) != device:
            continue
        held.add(event.op)
        memory = sum(problem.output_bytes[op] for op in held)
        memory += problem.workspace_bytes[event.op] if isinstance(event, Compute) else 0
        if memory > best:
            best, at = memory, index
    return at


def run_on_device(plan: Plan, device: int, index: int) -> Step:
    """`run`'s memory on `device` at plan step `index` (a segment: at its heaviest node): the parameters it reads and
    what its runtime keeps, the values the executor holds and, in a segment, the live tensors and workspace."""
    sizes = {name: info.allocated_bytes for name, info in tensor_infos(plan.model).items()}
    resident = plan.parameter_bytes[device] + plan.kept_bytes[device]
    held: dict[str, int] = {}
    for moment in step_holdings(plan.steps, plan.drops, sizes):
        if moment.device == device and moment.index <= index:
            held = dict(moment.held)
    step, workspace = plan.steps[index], 0
    if isinstance(step, Segment):
        heaviest = max(node_memory(step.model), key=lambda node: sum(node.live.values()) + node.workspace)
        held.update(heaviest.live)
        workspace = heaviest.workspace
    tensors: dict[str, int] = {}
    for name, size in held.items():
        original = INSTANCE.sub("", name)
        tensors[original] = tensors.get(original, 0) + size
    return Step(resident + sum(held.values()) + workspace, resident, tensors, workspace)


def plan_step_of_event(plan: Plan, event: int) -> int:
    """The plan step running the rewritten nodes of the schedule's event `event` (or the last one before it)."""
    steps = [max((node_tags(node).step or 0 for node in step.model.graph.node), default=0)
             if isinstance(step, Segment) else _handoff_step(plan, step) for step in plan.steps]
    firsts = [min((node_tags(node).step or 0 for node in step.model.graph.node), default=0)
              if isinstance(step, Segment) else last for step, last in zip(plan.steps, steps, strict=True)]
    return max((k for k, first in enumerate(firsts) if first <= event), default=0)


def _handoff_step(plan: Plan, handoff: Handoff) -> int:
    """The schedule's event of a hand-off's copy node."""
    node = next(node for node in plan.model.graph.node if node.name == handoff.node)
    return node_tags(node).step or 0


def event_of_plan_step(plan: Plan, index: int) -> int:
    """The schedule's event of plan step `index`'s heaviest node (a hand-off: of its copy node)."""
    step = plan.steps[index]
    if isinstance(step, Handoff):
        return _handoff_step(plan, step)
    memory = list(node_memory(step.model))
    heaviest = max(range(len(memory)), key=lambda k: sum(memory[k].live.values()) + memory[k].workspace)
    return node_tags(step.model.graph.node[heaviest]).step or 0


def compare_devices(costed_problem: CostedProblem, result: RematResult, devices: str) -> None:
    """On each device, both predictions at the report's peak and at `run`'s."""
    plan = build_plan(result.model, get_devices(devices))
    sizes = {name: info.allocated_bytes for name, info in tensor_infos(plan.model).items()}
    peaks = simulate(result.problem, result.schedule).peak_bytes
    for device, name in enumerate(result.problem.devices):
        print(f"{name}: report peak {peaks[device] / MIB:.3f} MiB, run peak {plan.peak_bytes[device] / MIB:.3f} MiB")
        event = report_peak_event(result, device)
        index = max(((sum(m.held.values()) + m.running, m.index)
                     for m in step_holdings(plan.steps, plan.drops, sizes) if m.device == device), default=(0, 0))[1]
        for label, at, step in (("the report's peak", event, plan_step_of_event(plan, event)),
                                ("run's peak", event_of_plan_step(plan, index), index)):
            compare(f"  event {at} ({label} on {name}), plan step {step}",
                    report_on_device(costed_problem, result, device, at), run_on_device(plan, device, step))


def compare(name: str, report: Step, run: Step) -> None:
    """Print one step's figures and the tensors only one of the predictions holds."""
    print(f"{name}: report {report.peak / MIB:.3f} MiB (resident {report.resident / MIB:.3f}, workspace "
          f"{report.workspace / MIB:.3f}), run {run.peak / MIB:.3f} MiB (resident {run.resident / MIB:.3f}, workspace "
          f"{run.workspace / MIB:.3f}; an operator's internal tensors are among those it holds)")
    for side, mine, other in (("report", report, run), ("run", run, report)):
        only = {tensor: size for tensor, size in mine.tensors.items() if tensor not in other.tensors}
        print(f"  only the {side} holds {sum(only.values()) / MIB:.3f} MiB in {len(only)} tensors:")
        for tensor, size in sorted(only.items(), key=lambda item: -item[1])[:SHOWN]:
            print(f"    {size / MIB:8.3f}  {tensor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo architecture (tools/real_model_zoo.py) or an ONNX file")
    parser.add_argument("--exporter", default="legacy", choices=EXPORTERS)
    parser.add_argument("--batch", type=int, default=None, help="rows per input of a zoo architecture")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--budget", default="min")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--devices", default=None, help="a device file (default: the CPU)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.model)
        training = TrainingOptions()
        if not path.exists():
            training = TrainingOptions(loss=architecture(args.model).loss)
            path = export(args.model, args.exporter, Path(folder) / "model.onnx", batch=args.batch)
        options = RematOptions(mode=args.mode, training=training, time_limit=args.time_limit,
                               find_minimum=args.budget == "min", devices=args.devices)
        problem = costed(path, options)
        result = rewritten(solve_at(problem, args.budget, options))
    if len(result.problem.devices) > 1:
        compare_devices(problem, result, args.devices)
        return
    reported, ran = report_steps(problem, result), run_steps(result.model)
    report = result.report
    print(f"budget {report.budget_bytes / MIB:.3f} MiB, report peak {report.predicted_peak_bytes / MIB:.3f}, "
          f"run peak {max(step.peak for step in ran.values()) / MIB:.3f}")
    at_report = max(reported, key=lambda step: reported[step].peak)
    at_run = max(ran, key=lambda step: ran[step].peak)
    for label, step in (("the report's peak", at_report), ("run's peak", at_run)):
        if step in reported and step in ran:
            compare(f"step {step} ({label}, {result.problem.op_names[result.schedule.events[step].op]})",
                    reported[step], ran[step])


if __name__ == "__main__":
    main()
