"""Graph outputs nobody reads, computed again last: a lower peak for the same computations once the first is pruned.

A weight's gradient is a graph output nobody reads: computed in the backward step that makes it, it is held from there
to the end of the run. Its inputs (a layer's input and its output's gradient) can be much smaller than it where
layers are late and narrow and weights large (squeezenet1_1's training step: its last layers' 0.57 MiB gradients from
inputs of a few KiB), so computing it again at the end, its inputs held until then, lowers the memory in between.
In the frontier-advancing form (stage t computes operator t first) the first computation stays, freed at once, and
the last stage computes it again: the solver's output drops that unread first computation (`prune_unread`), leaving
the operator computed once, later. Deferral is greedy, largest output first, each kept only where it lowers the peak:
one staged replay per graph output nobody reads (Problem.computed_once excluded: those run once).
"""

from __future__ import annotations

import numpy as np

from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Copy, Schedule
from onnx_remat.passes.solve.staged import StagedRun, staged_run

COMPUTATIONS_PER_OPERATOR = 4
"""Computations per operator beyond which a schedule is not deferred: each graph output nobody reads costs a replay of
them all. swin_v2_t's training step (3095 operators, 210 such outputs): the eviction heuristic's schedule at 364 MiB
makes 1.26 per operator and is deferred in 0.19 s; chen-sqrt-n makes 14.5, frontier-only 808 (measured)."""


def deferred(problem: Problem, schedule: Schedule) -> Schedule:
    """`schedule` (one device, no copies) with graph outputs nobody reads computed again at its end, each where that
    lowers its peak; `schedule` itself where none does, where it copies or runs on several devices, or where it makes
    more than COMPUTATIONS_PER_OPERATOR computations per operator."""
    if problem.num_devices != 1 or any(isinstance(event, Copy) for event in schedule.events):
        return schedule
    stages: list[list[int]] = [[] for _ in range(problem.num_ops)]
    for event in schedule.events:
        if isinstance(event, Compute):
            stages[event.stage].append(event.op)
    base = staged_run(problem, stages)
    if len(base.ops) > COMPUTATIONS_PER_OPERATOR * problem.num_ops:
        return schedule
    chosen: list[int] = []
    best = base.peak_bytes(problem, 0)
    for op in _unread_outputs(problem):
        trial = _with_deferred(problem, base, sorted([*chosen, op]))
        if (peak := trial.peak_bytes(problem, 0)) < best:
            best, chosen = peak, sorted([*chosen, op])
    return _with_deferred(problem, base, chosen).schedule(0) if chosen else schedule


def _unread_outputs(problem: Problem) -> list[int]:
    """Graph outputs no operator reads that may be computed twice, but the last operator, largest first."""
    once, last = set(problem.computed_once), problem.num_ops - 1
    found = {op for op in problem.graph_outputs if not problem.successors[op] and op not in once and op != last}
    return sorted(found, key=lambda op: (-problem.output_bytes[op], op))


def _with_deferred(problem: Problem, base: StagedRun, ops: list[int]) -> StagedRun:
    """`base` with `ops` (ascending) computed again after its last computation, in the last stage: their earlier
    computations freed at once, the inputs they read held until then. After the last operator, not before it as the
    MILP orders a stage (by operator): then its inputs are gone (squeezenet1_1's training step 6.20 MiB against 6.68,
    measured)."""
    count, inserted = len(base.ops), len(ops)
    freed = np.where(base.freed_after == count, count + inserted, base.freed_after)
    latest = np.full(problem.num_ops, -1, dtype=np.int64)
    latest[base.ops] = np.arange(count)  # the last of repeated indices wins: each operator's latest computation
    old = latest[ops]
    freed[old] = old
    for index, op in enumerate(ops, start=count):
        for reading in latest[list(problem.predecessors[op])].tolist():
            freed[reading] = max(freed[reading], index)
    return StagedRun(
        np.concatenate((base.ops, np.asarray(ops, dtype=np.int64))),
        np.concatenate((base.stages, np.full(inserted, problem.num_ops - 1, dtype=np.int64))),
        np.concatenate((freed, np.full(inserted, count + inserted, dtype=np.int64))),
    )
