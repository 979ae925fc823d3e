"""Frees from computes and copies: every output released on its device right after its last use.

An instance is the output of one step (a compute, or a copy on its target) until it is freed. A
compute reads the current instance of each input on its device, a copy the current instance on its
source. Freeing each instance after its last read is what onnxruntime does with the rewritten graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from onnx_remat.core.errors import ScheduleError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Event, Free, Schedule

Step = Compute | Copy


def schedule_from_steps(
    problem: Problem, steps: Sequence[Step], final: Mapping[int, int], prune: bool = False
) -> Schedule:
    """Events for `steps` in order with frees at last use; graph output op stays on device `final[op]`.

    Unread copies and recomputations are dropped (they only cost time and memory); with `prune`, so
    is a first computation whose operator has another instance. Each copy then moves right before
    its first reader unless that would keep its source longer.
    """
    kept = _drop_unread(problem, list(steps), final, prune)
    return _with_frees(problem, _delay_copies(problem, kept, final), final)


def holders_at_end(problem: Problem, schedule: Schedule) -> dict[int, int]:
    """For each graph output, the first device holding it after the last event."""
    held: list[set[int]] = [set() for _ in problem.devices]
    for event in schedule.events:
        if isinstance(event, Free):
            held[event.device].discard(event.op)
        else:
            held[where(event)].add(event.op)
    return {op: next(d for d, ops in enumerate(held) if op in ops) for op in problem.graph_outputs}


def where(step: Step) -> int:
    """The device a step's output lands on."""
    return step.device if isinstance(step, Compute) else step.target


def _reads(problem: Problem, steps: Sequence[Step]) -> list[list[int]]:
    """For each step, the indices of the steps whose instances it reads."""
    current: dict[tuple[int, int], int] = {}
    reads: list[list[int]] = []
    for index, step in enumerate(steps):
        if isinstance(step, Compute):
            wanted = [(p, step.device) for p in problem.predecessors[step.op]]
        else:
            wanted = [(step.op, step.source)]
        missing = [key for key in wanted if key not in current]
        if missing:
            op, device = missing[0]
            raise ScheduleError(f"stage {step.stage}: {step} needs operator {op} on device {device}, where it is not")
        reads.append([current[key] for key in wanted])
        current[step.op, where(step)] = index
    return reads


def _readers(reads: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each step, the indices of the steps reading its instance, ascending."""
    readers: list[list[int]] = [[] for _ in reads]
    for index, sources in enumerate(reads):
        for source in sources:
            readers[source].append(index)
    return readers


def _final_instances(steps: Sequence[Step], final: Mapping[int, int]) -> set[int]:
    """Indices of the last instance of each graph output on the device that holds it at the end."""
    latest = {(step.op, where(step)): index for index, step in enumerate(steps)}
    return {latest[key] for key in final.items() if key in latest}


def _drop_unread(problem: Problem, steps: list[Step], final: Mapping[int, int], prune: bool) -> list[Step]:
    """Remove unread copies and recomputations (with `prune`, any unread compute of an operator with
    another). Repeated: a dropped one may have been the only reader of its inputs."""
    while True:
        readers = _readers(_reads(problem, steps))
        finals = _final_instances(steps, final)
        computes = Counter(step.op for step in steps if isinstance(step, Compute))
        seen: set[int] = set()
        kept: list[Step] = []
        for index, step in enumerate(steps):
            is_compute = isinstance(step, Compute)
            droppable = not is_compute or (computes[step.op] > 1 if prune else step.op in seen)
            if not readers[index] and index not in finals and droppable:
                computes[step.op] -= is_compute
                continue
            kept.append(step)
            if is_compute:
                seen.add(step.op)
        if len(kept) == len(steps):
            return kept
        steps = kept


def _delay_copies(problem: Problem, steps: list[Step], final: Mapping[int, int]) -> list[Step]:
    """Each copy moved right before its first reader, or right after its source's last other read if
    that comes first (never earlier than it was), so no instance lives longer on any device."""
    reads = _reads(problem, steps)
    readers = _readers(reads)
    finals = _final_instances(steps, final)
    places: list[float] = []
    for index, step in enumerate(steps):
        if isinstance(step, Copy):
            source = reads[index][0]
            others = [r for r in readers[source] if r != index]
            source_end = len(steps) if source in finals else max(others, default=index)
            places.append(min(min(readers[index], default=len(steps)), max(index, source_end) + 1) - 0.5)
        else:
            places.append(index)
    moved = [_restaged(step, steps, place) for step, place in zip(steps, places, strict=True)]
    return [moved[index] for index in sorted(range(len(steps)), key=lambda index: (places[index], index))]


def _restaged(step: Step, steps: Sequence[Step], place: float) -> Step:
    """A copy placed right after steps[floor(place)] takes that step's stage if later than its own."""
    if isinstance(step, Copy):
        return replace(step, stage=max(step.stage, steps[int(place)].stage))
    return step


def _with_frees(problem: Problem, steps: Sequence[Step], final: Mapping[int, int]) -> Schedule:
    """The steps with a Free of each instance (but the final ones) right after its last read."""
    readers = _readers(_reads(problem, steps))
    finals = _final_instances(steps, final)
    frees_after: dict[int, list[int]] = {}
    for index in range(len(steps)):
        if index not in finals:
            frees_after.setdefault(max(readers[index], default=index), []).append(index)
    events: list[Event] = []
    for index, step in enumerate(steps):
        events.append(step)
        events.extend(Free(steps[done].op, step.stage, where(steps[done])) for done in frees_after.get(index, []))
    return Schedule(tuple(events))
