"""Baseline schedules every solver result is compared against, and the liveness schedule builder.

Both baselines follow the frontier-advancing stage order (stage t computes operator t for the first
time, after the recomputations it needs) and free every output after its last use, which is what
onnxruntime does with the rewritten graph.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from onnx_remat.errors import ScheduleError
from onnx_remat.passes.simulate import simulate
from onnx_remat.problem import Problem
from onnx_remat.schedule import Compute, Event, Free, Schedule


def schedule_from_stages(problem: Problem, stages: Sequence[Sequence[int]], prune: bool = False) -> Schedule:
    """Events for the computes `stages[t]` (in order), each output freed right after its last use.

    A recomputation whose output is never read is dropped (it only costs time and memory); with
    `prune`, so is a first computation whose output only a later recomputation serves (the
    frontier-advancing diagonal forces those). The last instance of each graph output is kept to the end.
    """
    computes = _drop_unread([(stage, op) for stage, ops in enumerate(stages) for op in ops], problem, prune)
    last_read = _last_reads(problem, computes)
    final = _final_instances(problem, computes)
    frees_after: dict[int, list[int]] = {}
    for index, reader in enumerate(last_read):
        if index not in final:
            frees_after.setdefault(max(reader, index), []).append(computes[index][1])
    events: list[Event] = []
    for index, (stage, op) in enumerate(computes):
        events.append(Compute(op, stage))
        events.extend(Free(done, stage) for done in frees_after.get(index, []))
    return Schedule(tuple(events))


def prune_unread(problem: Problem, schedule: Schedule) -> Schedule:
    """The schedule without any computation nobody reads while the operator has another instance.

    onnxruntime holds an output nobody reads until the run ends, so such a computation costs memory
    as well as time. The result lies outside the MILP's frontier-advancing form: use it for output only,
    never as a warm start."""
    stages: list[list[int]] = [[] for _ in range(problem.num_ops)]
    for compute in schedule.computes:
        stages[compute.stage].append(compute.op)
    return schedule_from_stages(problem, stages, prune=True)


def _drop_unread(computes: list[tuple[int, int]], problem: Problem, prune: bool) -> list[tuple[int, int]]:
    """Remove unread recomputations (with `prune`, any unread instance of an operator that has another).
    Repeated: a dropped one may have been the only reader of its inputs."""
    while True:
        last_read = _last_reads(problem, computes)
        final = _final_instances(problem, computes)
        instances = Counter(op for _, op in computes)
        seen: set[int] = set()
        kept = []
        for index, (stage, op) in enumerate(computes):
            droppable = instances[op] > 1 if prune else op in seen
            if last_read[index] < 0 and index not in final and droppable:
                instances[op] -= 1
            else:
                kept.append((stage, op))
                seen.add(op)
        if len(kept) == len(computes):
            return kept
        computes = kept


def _final_instances(problem: Problem, computes: Sequence[tuple[int, int]]) -> set[int]:
    """Indices of the last compute of each graph output: those outputs are held to the end."""
    latest = {op: index for index, (_, op) in enumerate(computes)}
    return {latest[op] for op in problem.graph_outputs if op in latest}


def _last_reads(problem: Problem, computes: Sequence[tuple[int, int]]) -> list[int]:
    """For each compute (an instance of an output), the index of the last compute reading it, or -1."""
    last_read = [-1] * len(computes)
    current: dict[int, int] = {}
    for index, (stage, op) in enumerate(computes):
        for pred in problem.predecessors[op]:
            if pred not in current:
                raise ScheduleError(f"stage {stage} computes operator {op} before its input {pred} exists")
            last_read[current[pred]] = index
        current[op] = index
    return last_read


def keep_all(problem: Problem) -> Schedule:
    """Topological order, every operator once, each output freed after its last use: no recomputation."""
    return schedule_from_stages(problem, [[t] for t in range(problem.num_ops)])


def chen_sqrt_n(problem: Problem) -> Schedule:
    """Chen et al. 2016: ~sqrt(n) segments; only segment ends (and graph outputs) outlive their segment.

    An output of an earlier segment that is not a checkpoint is recomputed, from the checkpoints it
    depends on, when an operator needs it; it is then kept while the frontier stays in that segment.
    """
    length = max(1, math.ceil(math.sqrt(problem.num_ops)))
    checkpoints = {i for i in range(problem.num_ops) if (i + 1) % length == 0} | set(problem.graph_outputs)
    stages: list[list[int]] = []
    recomputed: set[int] = set()
    for t in range(problem.num_ops):
        if t % length == 0:
            recomputed = set()
        held = checkpoints | recomputed | set(range(t - t % length, t))
        stages.append(_needed(problem, t, held.__contains__))
        recomputed.update(stages[-1])
    return schedule_from_stages(problem, stages)


def frontier_only(problem: Problem) -> Schedule:
    """Hold across stages only the previous operator's output and graph outputs; recompute the rest.

    The least-memory baseline (and the costliest): it seeds the minimum-budget search and gives the
    MILP a warm start at budgets where Chen's checkpoints no longer fit.
    """
    outputs = set(problem.graph_outputs)
    stages = [_needed(problem, t, lambda p, t=t: p in outputs or p == t - 1) for t in range(problem.num_ops)]
    return schedule_from_stages(problem, stages)


def _needed(problem: Problem, op: int, available: Callable[[int], bool]) -> list[int]:
    """`op` and every ancestor it must recompute because it is not available, ascending."""
    needed, stack = {op}, [op]
    while stack:
        for pred in problem.predecessors[stack.pop()]:
            if pred not in needed and not available(pred):
                needed.add(pred)
                stack.append(pred)
    return sorted(needed)


BASELINES: dict[str, Callable[[Problem], Schedule]] = {
    "keep-all": keep_all,
    "chen-sqrt-n": chen_sqrt_n,
    "frontier-only": frontier_only,
}


def best_baseline(problem: Problem) -> tuple[str, Schedule] | None:
    """The cheapest baseline whose peak fits device 0's budget, or None if none fits."""
    best: tuple[float, str, Schedule] | None = None
    for name, build in BASELINES.items():
        schedule = build(problem)
        simulation = simulate(problem, schedule)
        if simulation.peak_bytes[0] <= problem.budgets[0] and (best is None or simulation.total_cost < best[0]):
            best = (simulation.total_cost, name, schedule)
    return None if best is None else (best[1], best[2])
