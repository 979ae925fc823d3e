"""A staged schedule's figures (peak, cost) in numpy, its events built only on demand.

A baseline is stages of computations on one device, each output freed right after its last read (what
`baselines.schedule_from_stages` makes of them). Frontier-only on DenseNet-121's training step has 577,000
computations and 1.15 million events: building them took 8-22 s and simulating them 2-3 s, paid for every problem
although only the chosen baseline's events are ever used. Here the liveness (which instance each computation reads,
when each is freed) and the memory it implies are array operations over the computations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnx_remat.core.errors import ScheduleError
from onnx_remat.core.problem import Problem
from onnx_remat.core.schedule import Compute, Event, Free, Schedule


@dataclass(frozen=True)
class StagedRun:
    """Computations in order on one device: operator, stage, and the index of the computation after which the
    output is freed (`len(ops)`: kept to the end, the last instance of a graph output)."""

    ops: np.ndarray
    stages: np.ndarray
    freed_after: np.ndarray

    def peak_bytes(self, problem: Problem, device: int) -> int:
        """The most `device` holds at once: resident bytes and the loaded groups its computations read, what its
        runtime keeps for the computations, live outputs, and the running operator's workspace."""
        sizes = np.asarray(problem.output_bytes, dtype=np.int64)[self.ops]
        workspace = np.asarray(problem.workspace_bytes, dtype=np.int64)[self.ops]
        freed = np.zeros(len(self.ops) + 1, dtype=np.int64)
        np.add.at(freed, self.freed_after, sizes)
        held_before = np.cumsum(sizes) - sizes - (np.cumsum(freed[:-1]) - freed[:-1])
        running = held_before + sizes + workspace
        kept = int(np.asarray(problem.kept_bytes[device], dtype=np.int64)[self.ops].sum())
        return problem.resident_with(device, self.ops.tolist()) + kept + max(0, int(running.max(initial=0)))

    def compute_cost(self, problem: Problem, device: int) -> float:
        """Seconds of every computation on `device`, summed in order (as the simulator sums them)."""
        costs = np.asarray(problem.cost[device], dtype=np.float64)[self.ops]
        return float(np.cumsum(costs)[-1]) if len(costs) else 0.0

    def schedule(self, device: int) -> Schedule:
        """The events on `device`: each computation, then the frees of the outputs last read by it (ascending)."""
        order = np.argsort(self.freed_after, kind="stable")
        bounds = np.searchsorted(self.freed_after[order], np.arange(len(self.ops) + 1))
        ops, stages, frees = self.ops.tolist(), self.stages.tolist(), order.tolist()
        events: list[Event] = []
        for index, (op, stage) in enumerate(zip(ops, stages, strict=True)):
            events.append(Compute(op, stage, device))
            events.extend(Free(ops[done], stage, device) for done in frees[bounds[index]:bounds[index + 1]])
        return Schedule(tuple(events))


def staged_run(problem: Problem, stages: Sequence[Sequence[int]]) -> StagedRun:
    """The computations `stages[t]` (in order), each output freed right after its last read, the last instance of each
    graph output kept to the end. Every recomputation must be read (as when each stage computes an operator and the
    missing ancestors it needs): then it is the schedule `schedule_from_stages` builds, which would drop an unread
    one."""
    ops = np.fromiter((op for stage in stages for op in stage), dtype=np.int64)
    stage_of = np.repeat(np.arange(len(stages), dtype=np.int64), [len(stage) for stage in stages])
    readers, read = _reads(problem, ops)
    last_read = np.arange(len(ops), dtype=np.int64)
    np.maximum.at(last_read, read, readers)
    last_read[_last_instances(ops, problem.graph_outputs)] = len(ops)
    return StagedRun(ops, stage_of, last_read)


def _reads(problem: Problem, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reading computation, computation read) for each input of each computation: the latest earlier computation of
    that input."""
    counts = np.fromiter((len(p) for p in problem.predecessors), dtype=np.int64, count=problem.num_ops)
    starts = np.concatenate(([0], np.cumsum(counts)))
    flat = np.fromiter((p for preds in problem.predecessors for p in preds), dtype=np.int64, count=int(starts[-1]))
    per_step = counts[ops]
    readers = np.repeat(np.arange(len(ops), dtype=np.int64), per_step)
    offsets = np.arange(len(readers), dtype=np.int64) - np.repeat(np.cumsum(per_step) - per_step, per_step)
    inputs = flat[np.repeat(starts[ops], per_step) + offsets]
    order = np.argsort(ops, kind="stable")
    keys = ops[order] * len(ops) + order
    found = np.searchsorted(keys, inputs * len(ops) + readers) - 1
    read = order[np.maximum(found, 0)]
    missing = (found < 0) | (ops[read] != inputs)
    if missing.any():
        step = int(np.argmax(missing))
        raise ScheduleError(f"computation #{int(readers[step])} of operator {int(ops[readers[step]])} needs operator "
                            f"{int(inputs[step])}, which is not computed before it")
    return readers, read


def _last_instances(ops: np.ndarray, graph_outputs: Sequence[int]) -> np.ndarray:
    """Indices of the last computation of each graph output that is computed."""
    last = np.full(int(ops.max(initial=-1)) + 1, -1, dtype=np.int64)
    np.maximum.at(last, ops, np.arange(len(ops), dtype=np.int64))
    wanted = np.asarray([op for op in set(graph_outputs) if op < len(last)], dtype=np.int64)
    found = last[wanted]
    return found[found >= 0]
