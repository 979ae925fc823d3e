"""The MILP on Google's CP-SAT: the same sparse 0/1 model, scaled to integers, on 2 workers.

CP-SAT needs integer variables and coefficients. Integer columns stay as they are; continuous columns
within [0, 1] become 0/1 (in the Checkmate model those are FREE, whose best value is 0 or 1 whenever R
and S are); the other continuous columns (memory) are counted in whole bytes, and every row holding a
memory column or a fractional coefficient is multiplied by the model's byte unit, which makes it whole
bytes. Costs are scaled to integers rounding down, so CP-SAT's bound stays a bound on the true cost.

OR-Tools bundles its own HiGHS under the same shared-library name as highspy's, so the two cannot be
loaded into one process (whichever comes second fails on missing symbols): CP-SAT runs in a child
process (child.py), the script cpsat_worker.py, which reads the integer model from a file, streams its
progress on stdout and writes its answer to a file. Stopping sends the child SIGINT; it stops with its
best solution.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from onnx_remat.core.errors import SolverError
from onnx_remat.passes.solve.backend import MilpOutcome, MilpProgress, SolveStatus, SparseMilp
from onnx_remat.passes.solve.child import run_worker

OBJECTIVE_STEPS = 1e7
"""The largest objective coefficient, in CP-SAT's integer units: finer than any cost ratio that matters."""

UNBOUNDED = 2**40
"""The upper end of a memory column with no upper bound, in bytes."""

INT_MAX = 2**63 - 1
"""CP-SAT's infinity for a row bound."""

TOLERANCE = 1e-6
"""How far from a whole number a scaled coefficient or bound may be before the model is refused."""

WORKER = Path(__file__).with_name("cpsat_worker.py")


class IntegerModel:
    """A SparseMilp scaled to integers for CP-SAT, and how to map values back: x = y / column_scale."""

    def __init__(self, milp: SparseMilp):
        binary = (milp.col_lower >= 0) & (milp.col_upper <= 1)
        self.column_scale = np.where(milp.integer | binary, 1.0, milp.byte_unit)
        self.col_lower = _whole(np.ceil, milp.col_lower * self.column_scale, UNBOUNDED)
        self.col_upper = _whole(np.floor, milp.col_upper * self.column_scale, UNBOUNDED)
        matrix = milp.matrix.tocsr()
        row_of = np.repeat(np.arange(matrix.shape[0]), np.diff(matrix.indptr))
        scaled = self.column_scale[matrix.indices] != 1.0
        fractional = np.abs(matrix.data - np.round(matrix.data)) > TOLERANCE
        needs_bytes = np.bincount(row_of, weights=scaled | fractional, minlength=matrix.shape[0]) > 0
        row_scale = np.where(needs_bytes, milp.byte_unit, 1.0)
        coefficients = matrix.data * row_scale[row_of] / self.column_scale[matrix.indices]
        whole = np.round(coefficients)
        if np.any(np.abs(coefficients - whole) > TOLERANCE * np.maximum(1.0, np.abs(coefficients))):
            raise SolverError("CP-SAT needs whole-byte memory rows: the model has a coefficient it cannot scale")
        self.indptr, self.indices, self.coefficients = matrix.indptr, matrix.indices, whole.astype(np.int64)
        self.row_lower = _whole(np.ceil, milp.row_lower * row_scale, INT_MAX)
        self.row_upper = _whole(np.floor, milp.row_upper * row_scale, INT_MAX)
        weights = milp.cost / self.column_scale
        largest = float(np.abs(weights).max(initial=0.0))
        self.objective_scale = OBJECTIVE_STEPS / largest if largest > 0 else 1.0
        self.objective_cols = np.flatnonzero(weights)
        self.objective_coefficients = np.floor(weights[self.objective_cols] * self.objective_scale + TOLERANCE)

    def hint(self, x: np.ndarray) -> np.ndarray:
        """A solution vector (a warm start) in CP-SAT's integers."""
        return np.round(x * self.column_scale).astype(np.int64)

    def solution(self, values: np.ndarray) -> np.ndarray:
        """The solution vector of CP-SAT's integer values."""
        return values / self.column_scale

    def save(self, path: Path, hint: np.ndarray | None, parameters: dict[str, float]) -> None:
        """Write the model, the hint (if any) and the solver parameters for the worker."""
        np.savez(
            path,
            col_lower=self.col_lower,
            col_upper=self.col_upper,
            indptr=self.indptr,
            indices=self.indices,
            coefficients=self.coefficients,
            row_lower=self.row_lower,
            row_upper=self.row_upper,
            objective_cols=self.objective_cols,
            objective_coefficients=self.objective_coefficients.astype(np.int64),
            hint=np.zeros(0, dtype=np.int64) if hint is None else hint,
            parameter_names=np.array(list(parameters)),
            parameter_values=np.array(list(parameters.values()), dtype=float),
        )


def _whole(rounding: np.ufunc, values: np.ndarray, infinity: int) -> np.ndarray:
    """Bounds rounded inward to whole numbers (within TOLERANCE), infinite ones replaced by +-`infinity`."""
    finite = np.isfinite(values)
    nudge = TOLERANCE if rounding is np.floor else -TOLERANCE
    whole = np.where(finite, rounding(np.where(finite, values, 0.0) + nudge), 0.0).astype(np.int64)
    return np.where(finite, whole, np.sign(values).astype(np.int64) * infinity)


def solve_cpsat(
    milp: SparseMilp,
    time_limit: float | None = None,
    warm_start: np.ndarray | None = None,
    progress: MilpProgress | None = None,
    gaps: tuple[float, float] = (1e-4, 1e-6),
    stop: threading.Event | None = None,
) -> MilpOutcome:
    """Solve with CP-SAT on 2 workers; `gaps` are the relative and absolute gaps to stop at.

    Setting `stop` stops the search (status "interrupted", with the best solution found so far)."""
    start = time.perf_counter()
    model = IntegerModel(milp)
    parameters = {
        "num_workers": 2,
        "random_seed": 0,
        "relative_gap_limit": gaps[0],
        "absolute_gap_limit": gaps[1] * model.objective_scale,
    }
    if time_limit is not None:
        parameters["max_time_in_seconds"] = max(0.01, time_limit - (time.perf_counter() - start))
    with tempfile.TemporaryDirectory() as directory:
        given, answer = Path(directory) / "model.npz", Path(directory) / "answer.npz"
        model.save(given, None if warm_start is None else model.hint(warm_start), parameters)
        stop = stop or threading.Event()
        if not run_worker(WORKER, [str(given), str(answer)], answer, _reporter(model, progress), stop, "CP-SAT"):
            return MilpOutcome(None, SolveStatus.INTERRUPTED, None)
        with np.load(answer) as found:
            status, values, bound = str(found["status"]), found["values"], float(found["bound"])
    if status == "MODEL_INVALID":
        raise SolverError("CP-SAT refused the model")
    if status == "INFEASIBLE":
        return MilpOutcome(None, SolveStatus.INFEASIBLE, None)
    x = model.solution(values) if status in ("OPTIMAL", "FEASIBLE") else None
    proven = bound / model.objective_scale if math.isfinite(bound) else None
    if status == "OPTIMAL":
        return MilpOutcome(x, SolveStatus.OPTIMAL, proven)
    return MilpOutcome(x, SolveStatus.INTERRUPTED if stop.is_set() else SolveStatus.TIME_LIMIT, proven)


def _reporter(model: IntegerModel, progress: MilpProgress | None) -> Callable[[str], None]:
    """Parse the worker's "incumbent bound" lines (CP-SAT's integer units) into `progress` calls."""
    start = time.perf_counter()

    def report(line: str) -> None:
        if progress is not None:
            values = (float(v) / model.objective_scale for v in line.split())
            progress(time.perf_counter() - start, *(v if math.isfinite(v) else None for v in values))

    return report
