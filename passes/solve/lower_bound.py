"""A lower bound from memory cuts: what the outputs that do not fit where they are cheapest must cost.

Entering stage t (before operator t first runs), each output i < t that an operator j >= t reads, or that is
a graph output, is held on some device or on none, and device d holds at most budget - resident bytes of
them. Beyond computing every operator once on its cheapest device (the trivial bound), such an output costs
- held on no device: a recomputation, at least its cheapest cost;
- held on device d: its computation there above the cheapest, or a copy into d, whichever is less (nothing
  where it is cheapest). With two devices of which one, home, is cheapest for every operator, an output held
  on the other device only also costs its way back: a copy home, a recomputation, or a reader running on
  the other device (that reader's extra cost, shared among its inputs).
These costs come from distinct events for distinct outputs, so at each cut the cheapest fractional placement
within the capacities (a small LP) bounds the extra cost; the bound is the trivial one plus the largest of them.
Unlike the MILP's bound it costs seconds at any size.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from onnx_remat.problem import Problem

LP_TOLERANCE = 1e-6
"""Relative slack taken off each LP optimum, well above HiGHS's feasibility tolerances, so the bound stays one."""


def cut_lower_bound(problem: Problem) -> float:
    """A lower bound in seconds on every schedule of `problem` within its budgets."""
    costs = np.array(problem.cost, dtype=float)
    cheapest = costs.min(axis=0)
    placement = _placement_costs(problem, costs, cheapest)
    sizes = np.array(problem.output_bytes, dtype=float)
    capacity = np.array(problem.budgets, dtype=float) - np.array(problem.resident_bytes, dtype=float)
    outputs = set(problem.graph_outputs)
    last_read = [max(problem.successors[i], default=-1) for i in range(problem.num_ops)]
    extra = 0.0
    for t in range(1, problem.num_ops):
        live = np.array([i for i in range(t) if last_read[i] >= t or i in outputs], dtype=np.int64)
        free_fit = any(sizes[live].sum() <= room and not placement[d, live].any() for d, room in enumerate(capacity))
        if not free_fit:
            extra = max(extra, _cheapest_placement(sizes[live], placement[:, live], cheapest[live], capacity))
    return float(cheapest.sum() + extra)


def _placement_costs(problem: Problem, costs: np.ndarray, cheapest: np.ndarray) -> np.ndarray:
    """[d, i]: the least extra cost of output i being held on device d at a cut (see the module docstring)."""
    devices, n = costs.shape
    copy = np.array(problem.copy_seconds_per_byte, dtype=float)
    fixed = np.array(problem.copy_fixed_seconds, dtype=float)
    sizes = np.array(problem.output_bytes, dtype=float)
    placement = np.zeros((devices, n))
    for d in range(devices):
        copy_in = np.full(n, np.inf)  # one device: no copies
        for s in range(devices):
            if s != d:
                copy_in = np.minimum(copy_in, fixed[s, d] + sizes * copy[s, d])
        placement[d] = np.minimum(costs[d] - cheapest, copy_in)
    homes = [h for h in range(devices) if np.all(costs[h] <= cheapest)]
    if devices == 2 and homes:
        home = homes[0]
        other = 1 - home
        shares = (costs[other] - cheapest) / np.maximum(1, [len(p) for p in problem.predecessors])
        for i in range(n):
            readers = problem.successors[i]
            if readers:
                back = min(problem.copy_seconds(i, other, home), cheapest[i], shares[list(readers)].min())
                placement[other, i] += back
    return placement


def _cheapest_placement(sizes: np.ndarray, placement: np.ndarray, recompute: np.ndarray, capacity: np.ndarray) -> float:
    """min sum placement[d,i] x[d,i] + recompute[i] y[i] with sum_d x[d,i] + y[i] = 1, sum_i size_i x[d,i] <= cap_d."""
    devices, live = placement.shape
    scale = max(float(np.abs(placement).max()), float(recompute.max()), 1e-300)
    cost = np.concatenate([placement.ravel(), recompute]) / scale
    columns = np.arange(devices * live + live)
    owner = np.concatenate([np.tile(np.arange(live), devices), np.arange(live)])
    assign = sparse.csr_matrix((np.ones(len(columns)), (owner, columns)), shape=(live, len(columns)))
    device_of = np.repeat(np.arange(devices), live)
    room = sparse.csr_matrix(
        (np.tile(sizes, devices) / sizes.max(), (device_of, np.arange(devices * live))), shape=(devices, len(columns))
    )
    result = linprog(
        cost,
        A_ub=room,
        b_ub=np.maximum(capacity, 0.0) / sizes.max(),
        A_eq=assign,
        b_eq=np.ones(live),
        bounds=(0, 1),
        method="highs",
    )
    return float(result.fun) * scale * (1 - LP_TOLERANCE) if result.status == 0 else 0.0
