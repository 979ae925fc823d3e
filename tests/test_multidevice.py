"""The multi-device MILP: hand-made cases with known optima, three devices, HiGHS against CBC on random DAGs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_remat.core.errors import InfeasibleBudgetError, SolverError
from onnx_remat.core.problem import Loaded, Problem
from onnx_remat.core.schedule import Compute, Copy
from onnx_remat.passes.simulate import check_schedule, simulate
from onnx_remat.passes.solve import SolveResult, solve
from onnx_remat.passes.solve.baselines import keep_all, on_device
from onnx_remat.passes.solve.checkmate_milp import build_model, write_mps
from onnx_remat.passes.solve.min_budget import MinBudget, minimum_budget, minimum_equal_budget, step_bytes
from onnx_remat.passes.solve.offload import offload


def problem(
    edges, sizes, costs, budgets, copy=0.1, outputs=None, workspace=None, resident=None, fixed=0.0
) -> Problem:
    """Operators 0..n-1 on len(costs) devices; `copy` seconds per byte plus `fixed` per copy between any two."""
    n, devices = len(sizes), len(costs)
    return Problem(
        op_names=tuple(f"op{i}" for i in range(n)),
        edges=tuple(sorted(set(edges))),
        output_bytes=tuple(sizes),
        cost=tuple(tuple(float(c) for c in row) for row in costs),
        resident_bytes=tuple(resident or (0,) * devices),
        budgets=tuple(budgets),
        graph_outputs=tuple(outputs if outputs is not None else (n - 1,)),
        devices=tuple(f"dev{d}" for d in range(devices)),
        workspace_bytes=tuple(workspace or ()),
        copy_seconds_per_byte=tuple(tuple(0.0 if d == e else copy for e in range(devices)) for d in range(devices)),
        copy_fixed_seconds=tuple(tuple(0.0 if d == e else fixed for e in range(devices)) for d in range(devices)),
    )


def with_loaded(p: Problem, *groups: tuple[int, tuple[int, ...]]) -> Problem:
    """`p` with loaded groups, each (bytes on every device, its readers)."""
    return replace(p, loaded=tuple(Loaded((size,) * p.num_devices, readers) for size, readers in groups))


def checked(p: Problem, result: SolveResult) -> SolveResult:
    """The result after the simulator agrees with its cost and budgets."""
    assert check_schedule(p, result.schedule).total_cost == pytest.approx(result.objective)
    return result


def copies(result: SolveResult) -> list[Copy]:
    return [e for e in result.schedule.events if isinstance(e, Copy)]


def devices_of(result: SolveResult) -> dict[int, set[int]]:
    """For each operator, the devices computing it."""
    found: dict[int, set[int]] = {}
    for c in result.schedule.computes:
        found.setdefault(c.op, set()).add(c.device)
    return found


def test_big_input_on_the_slow_device_small_one_copied_to_the_fast_device():
    """op0 and op1 only fit the slow device; the expensive op2 runs on the fast one after a 1-byte copy."""
    p = problem([(0, 1), (1, 2)], [10, 1, 1], [[1, 1, 10], [10, 10, 100]], [3, 100])
    result = checked(p, solve(p))
    assert result.status == "optimal"
    assert result.objective == pytest.approx(10 + 10 + 10 + 0.1)
    assert devices_of(result) == {0: {1}, 1: {1}, 2: {0}}
    assert copies(result) == [Copy(1, 2, 1, 0)]


@pytest.mark.parametrize(("fast_budget", "expected"), [(10, 11.0), (11, 2.0 + 10 * 0.1)])
def test_a_copy_occupies_its_target(fast_budget: int, expected: float):
    """op1 is cheap on device 0 but needs op0 (10 bytes; its workspace keeps it off device 0) copied
    there: with budget 10 the copy does not fit beside op1's output, which the paper's model ignores."""
    p = problem([(0, 1)], [10, 1], [[1, 1], [1, 10]], [fast_budget, 100], workspace=[5, 0])
    result = checked(p, solve(p))
    assert result.objective == pytest.approx(expected)
    assert bool(copies(result)) == (fast_budget == 11)


def test_offloading_a_skip_tensor_beats_recomputing_it():
    """op0 is costly and read again by op3; device 0 cannot hold it through op2, so it is copied to
    device 1, kept there, and copied back for op3."""
    costs = [[100, 1, 1, 1], [1000, 10, 10, 10]]
    p = problem([(0, 1), (1, 2), (2, 3), (0, 3)], [10, 10, 10, 1], costs, [25, 100])
    result = checked(p, solve(p))
    assert result.objective == pytest.approx(103 + 2 * 10 * 0.1)
    assert [(c.op, c.source, c.target) for c in copies(result)] == [(0, 0, 1), (0, 1, 0)]
    assert all(c.device == 0 for c in result.schedule.computes)


def test_a_device_below_the_parameters_runs_the_operator_whose_weights_it_holds():
    """op1 is ten times cheaper on device 1, whose 40 bytes cannot hold all 105 bytes of parameters but do hold op1's
    5: op1 runs there (its input copied in, its output copied back). Counting every parameter on every device refused
    the budget."""
    p = with_loaded(problem([(0, 1), (1, 2)], [10, 10, 10], [[1, 10, 1], [1, 1, 1]], [1000, 40]), (100, (0, 2)),
                    (5, (1,)))
    result = checked(p, solve(p))
    assert result.status == "optimal"
    assert result.objective == pytest.approx(3 + 2 * 10 * 0.1)
    assert devices_of(result) == {0: {0}, 1: {1}, 2: {0}}
    assert simulate(p, result.schedule).peak_bytes == (100 + 10 + 10, 5 + 10 + 10)  # op1's weights on 1 only
    with pytest.raises(InfeasibleBudgetError):  # every parameter counted on every device: device 1 is useless
        solve(replace(p, loaded=(), resident_bytes=(105, 105)))


def test_a_device_below_the_parameters_parks_a_skip_tensor():
    """The skip tensor of `test_offloading_a_skip_tensor_beats_recomputing_it` beside 50 bytes of parameters on
    device 0: device 1, with 20 bytes, holds no parameter (it computes nothing) and parks the skip tensor."""
    costs = [[100, 1, 1, 1], [1000, 10, 10, 10]]
    p = with_loaded(problem([(0, 1), (1, 2), (2, 3), (0, 3)], [10, 10, 10, 1], costs, [75, 20]), (50, (0, 1, 2, 3)))
    result = checked(p, solve(p))
    assert result.objective == pytest.approx(103 + 2 * 10 * 0.1)
    assert [(c.op, c.source, c.target) for c in copies(result)] == [(0, 0, 1), (0, 1, 0)]
    assert simulate(p, result.schedule).peak_bytes[1] == 10
    assert offload(p, compute=0, store=1) is not None


def test_minimum_budgets_count_only_the_parameters_a_device_loads():
    """The device running everything holds the parameters; the one parking holds none, so its minimum is a copy."""
    costs = [[100, 1, 1, 1], [1000, 10, 10, 10]]
    p = with_loaded(problem([(0, 1), (1, 2), (2, 3), (0, 3)], [10, 10, 10, 1], costs, [75, 10**6]), (50, (0, 1, 2, 3)))
    assert minimum_budget(p, 1) == MinBudget(0, 0)
    p = replace(p, budgets=(10**6, 10**6))
    assert minimum_budget(p, 0).feasible == 0
    assert minimum_equal_budget(p).lower >= 50 + step_bytes(p, 3)


def test_a_minimum_no_heuristic_reaches_within_the_other_budgets_is_refused():
    """Device 1 holds 5 bytes whatever runs there, over its budget of 0: no budget of device 0 helps (the search
    ended in a ValueError from min() of nothing: EfficientNet-B0 with ov-cpu below its parameters did, before a device
    held only the parameters it reads)."""
    p = problem([(0, 1)], [10, 1], [[1, 1], [1, 1]], [100, 0], resident=(0, 5))
    with pytest.raises(InfeasibleBudgetError, match="other devices"):
        minimum_budget(p, 0)


def test_no_single_device_fits_but_a_mixed_schedule_does():
    """Graph outputs op0 and op2 (10 bytes each) cannot both stay on one 15-byte device."""
    p = problem([(0, 1), (1, 2)], [10, 1, 10], [[1, 1, 1], [1, 1, 1]], [15, 15], outputs=(0, 2))
    for device in range(2):
        with pytest.raises(InfeasibleBudgetError):
            solve(on_device(p, device))
    result = checked(p, solve(p))
    assert result.objective == pytest.approx(3 + 0.1)


def test_three_devices_each_run_what_they_are_fastest_at():
    costs = [[1, 9, 9], [9, 1, 9], [9, 9, 1]]
    p = problem([(0, 1), (1, 2)], [1, 1, 1], costs, [10, 10, 10], copy=0.5)
    result = checked(p, solve(p))
    assert result.objective == pytest.approx(3 + 2 * 0.5)
    assert devices_of(result) == {0: {0}, 1: {1}, 2: {2}}


def test_minimum_budget_of_one_device_with_the_others_fixed():
    """Device 1 can do everything with 100 bytes; with 10 it can make op0 but not run op1 beside it."""
    p = problem([(0, 1)], [10, 1], [[1, 1], [1, 10]], [0, 100], resident=(3, 0))
    assert minimum_budget(p, 0) == MinBudget(3, 3)
    p = problem([(0, 1)], [10, 1], [[1, 1], [1, 10]], [100, 10])
    assert minimum_budget(p, 0) == MinBudget(11, 11)
    # Device 1 cannot keep output op0 while running op2: op0 moves to device 0 (not op2, which needs 11).
    p = problem([(0, 1), (1, 2)], [10, 1, 10], [[1, 1, 1], [1, 1, 1]], [100, 15], outputs=(0, 2))
    assert minimum_budget(p, 0) == MinBudget(10, 10)


def test_write_mps(tmp_path: Path):
    p = problem([(0, 1)], [10, 1], [[1, 1], [1, 10]], [11, 100])
    path = tmp_path / "model.mps"
    write_mps(p, path)
    text = path.read_text()
    assert "C_1_0_1_0" in text and "R_0_1_1" in text
    assert text.count("\n") > len(build_model(p).milp.cost)


@st.composite
def two_device_problems(draw) -> Problem:
    n = draw(st.integers(2, 5))
    edges = [(u, v) for v in range(1, n) for u in draw(st.sets(st.integers(0, v - 1), min_size=1, max_size=2))]
    sizes = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    costs = [draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)) for _ in range(2)]
    single = problem(edges, sizes, costs[:1], [10**9])
    keep = simulate(single, keep_all(single)).peak_bytes[0]
    step = max(step_bytes(single, v) for v in range(n))
    budgets = [int(step + (keep - step) * draw(st.floats(0.0, 1.0))) for _ in range(2)]
    copy, fixed = draw(st.sampled_from([0.0, 0.05, 0.5])), draw(st.sampled_from([0.0, 0.0, 1.5]))
    readers = st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True).map(lambda ops: tuple(sorted(ops)))
    groups = draw(st.lists(st.tuples(st.integers(1, 9), readers), max_size=2))
    budgets = [budget + draw(st.sampled_from([0, sum(size for size, _ in groups)])) for budget in budgets]
    return with_loaded(problem(edges, sizes, costs, budgets, copy=copy, fixed=fixed), *groups)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_device_problems())
def test_highs_and_cbc_agree_and_beat_every_single_device(p: Problem):
    try:
        highs = checked(p, solve(p, "highs"))
    except InfeasibleBudgetError:
        with pytest.raises(InfeasibleBudgetError):
            solve(p, "cbc")
        return
    cbc = checked(p, solve(p, "cbc"))
    assert highs.status == cbc.status == "optimal"
    assert highs.model_objective == pytest.approx(cbc.model_objective, abs=1e-6)
    for device in range(2):
        try:
            single = solve(on_device(p, device))
        except InfeasibleBudgetError:
            continue
        assert highs.model_objective <= single.model_objective + 1e-9


def optimum(p: Problem) -> float:
    """The proven optimum of `p` (checked by the simulator), or infinity where no schedule fits."""
    try:
        result = checked(p, solve(p))
    except InfeasibleBudgetError:
        return math.inf
    assert result.status == "optimal"
    return result.model_objective


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_device_problems())
def test_loading_lies_between_no_parameters_and_every_parameter_on_every_device(p: Problem):
    """Every schedule within the budgets when each device holds every loaded group also fits when it holds only those
    its computations read, and that schedule fits when no device holds any: the optima are ordered."""
    free = replace(p, loaded=())
    everywhere = replace(p, loaded=(), resident_bytes=tuple(p.resident_with(d, range(p.num_ops)) for d in range(2)))
    assert optimum(free) <= optimum(p) + 1e-9
    assert optimum(p) <= optimum(everywhere) + 1e-9


def test_every_compute_lands_on_a_valid_device():
    p = problem([(0, 1), (1, 2)], [10, 1, 1], [[1, 1, 10], [10, 10, 100]], [3, 100])
    assert all(isinstance(c, Compute) and c.device in (0, 1) for c in solve(p).schedule.computes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_device_problems())
def test_offloading_heuristic_passes_the_simulator_within_budgets(p: Problem):
    for compute, store in ((0, 1), (1, 0), (0, None)):
        schedule = offload(p, compute, store)
        if schedule is not None:
            check_schedule(p, schedule)


def test_eviction_heuristic_recomputes_what_is_cheaper_than_a_round_trip():
    """As below, but op0 is cheap and copies dear: op0 is dropped and recomputed for op3, nothing copied."""
    p = problem([(0, 1), (1, 2), (2, 3), (0, 3)], [10, 10, 10, 1], [[1, 1, 1, 1], [9, 9, 9, 9]], [25, 100], copy=1.0)
    schedule = offload(p, 0, 1)
    assert schedule is not None and schedule.recompute_count() == 1
    assert not [e for e in schedule.events if isinstance(e, Copy)]
    assert check_schedule(p, schedule).total_cost == pytest.approx(5)


def test_offloading_heuristic_parks_a_skip_tensor_instead_of_recomputing():
    """0 -> 1 -> 2 -> 3 with 0 also read by 3: the fast device cannot hold 0 through 1 and 2, so 0 is parked."""
    p = problem([(0, 1), (1, 2), (2, 3), (0, 3)], [10, 10, 10, 1], [[1, 1, 1, 1], [9, 9, 9, 9]], [25, 100], copy=0.01)
    schedule = offload(p, 0, 1)
    assert schedule is not None
    assert [(c.op, c.source, c.target) for c in schedule.events if isinstance(c, Copy)] == [(0, 0, 1), (0, 1, 0)]
    assert check_schedule(p, schedule).total_cost == pytest.approx(4 + 2 * 10 * 0.01)


@pytest.mark.parametrize(("compute", "store"), [(0, 1), (1, 0)])
@pytest.mark.parametrize("budget", [2, 3, 4])
def test_offloading_never_drops_a_parked_output_it_is_copying_back(compute, store, budget):
    """Copying op 0 back to run op 3 needs room on the compute device; parking op 2 to make it may drop parked
    outputs from the store, but never op 0 itself (a Hypothesis example once did: a copy from where it was gone)."""
    p = problem([(0, 1), (0, 3), (1, 2), (2, 4)], [2, 1, 2, 1, 1], [[1] * 5, [1, 1, 2, 1, 1]], [budget, budget],
                copy=0.0)
    schedule = offload(p, compute, store)
    if schedule is not None:
        check_schedule(p, schedule)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_device_problems())
def test_equal_budget_minimum_brackets_the_true_one(p: Problem):
    """Below `lower` on every device the MILP proves no schedule fits; at `feasible` one does."""
    minimum = minimum_equal_budget(p)
    assert minimum.lower <= minimum.feasible
    with pytest.raises(InfeasibleBudgetError):
        solve(replace(p, budgets=(minimum.lower - 1,) * p.num_devices))
    at_minimum = replace(p, budgets=(minimum.feasible,) * p.num_devices)
    check_schedule(at_minimum, solve(at_minimum).schedule)


def test_a_recomputation_cascade_deeper_than_pythons_recursion_limit():
    """A 2000-operator chain whose last output a big operator's workspace evicts, then read at the end: the heuristic
    recomputes the whole chain, one nested call per operator (ShuffleNetV2's training step at its minimum raised
    RecursionError)."""
    m, big = 2000, 100
    edges = [(i, i + 1) for i in range(m - 1)] + [(m - 1, m + 1), (m, m + 1)]
    p = problem(edges, [2] * m + [big, 1], [[1.0] * (m + 2)], [big + 4], workspace=[0] * m + [3, 0])
    schedule = offload(p, 0)
    assert schedule is not None and schedule.recompute_count() >= m
    check_schedule(p, schedule)


def test_a_graph_too_large_for_the_milp_with_no_fitting_heuristic_says_so():
    """Past MAX_MILP_CELLS only heuristics answer: when none fits, the error says why and to raise the budgets, not
    to raise a time limit that was never reached (EfficientNet-B0's training step on two CPUs at 30% each)."""
    n = 240
    p = problem([(i, i + 1) for i in range(n - 1)], [1] * n, [[1.0] * n] * 2, [2, 2], outputs=list(range(n)))
    with pytest.raises(SolverError, match="too large for the exact solver.*raise the budgets"):
        solve(p)
