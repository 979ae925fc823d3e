"""The MILP on HiGHS: in this process for small models, in a child process (child.py) for larger ones.

HiGHS checks its interrupt callbacks in the simplex only between iteration batches, and in a large root LP
not for tens of seconds (docs/measurements.md).
So a model with more than IN_PROCESS_NONZEROS matrix entries is solved by the script highs_worker.py in a
child process, which streams progress and writes every improving solution as it finds it; `stop` sends the
child SIGINT and, if it has not answered within child.GRACE seconds (or the caller's grace), kills it. The
outcome is then "interrupted" with the best solution it streamed (or none: the caller holds its warm start) and the last
bound it reported. Small models stay in-process: starting Python with numpy and highspy costs more than
solving them, and their LPs reach a callback within milliseconds.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from onnx_remat.passes.solve import highs_worker
from onnx_remat.passes.solve.backend import MilpOutcome, MilpProgress, SolveStatus, SparseMilp
from onnx_remat.passes.solve.child import GRACE, run_worker

WORKER = Path(highs_worker.__file__)

INTEGRALITY_TOLERANCE = 1e-9
"""How far HiGHS may leave an integer column from a whole number (its default is 1e-6). A computation taken at
1 - 1e-6 counts a 2 MiB output as 2 bytes short in the memory rows, so at a budget that fits to the byte (the
minimum) HiGHS returned schedules 4 bytes over it; at 1e-9 a 500 MB tensor is half a byte short at most."""

IN_PROCESS_NONZEROS = 30_000
"""Matrix entries up to which HiGHS runs in this process (see the module docstring). The peers' 41-operator training
chains (25.7k entries) reach their first interrupt callback in 0.05-0.1 s in-process, where a child takes 0.3-0.6 s
to start; at 64k-101k entries (their U-Net and 81-operator chains) the first callback comes after 0.35-0.47 s."""

STREAMED_GRACE = 0.0
"""Seconds HiGHS's child may have to answer after a stop before it is killed, for a caller that keeps what it streamed
(its improving solutions and bounds): none. In an LP it took 1 s to notice the stop after CP-SAT met the memory-cut
bound (the peers' chain40_p60, 101k nonzeros; measured); a minimum search at the README's main job under two busy
loops ran up to 7 s past its time, most of it child.GRACE."""


def solve_highs(
    milp: SparseMilp,
    time_limit: float | None = None,
    warm_start: np.ndarray | None = None,
    progress: MilpProgress | None = None,
    gaps: tuple[float, float] = (1e-4, 1e-6),
    stop: threading.Event | None = None,
    in_process: bool | None = None,
    grace: float = GRACE,
) -> MilpOutcome:
    """Solve with HiGHS on 2 threads; `gaps` are the relative and absolute MIP gaps to stop at.

    Setting `stop` interrupts the solve (status "interrupted", with the best solution found so far), within
    about a second. `in_process` forces where HiGHS runs (default: by the model's size); `grace`: seconds its child
    has to answer after a stop before it is killed (its best solution and last bound are kept either way)."""
    deadline = None if time_limit is None else time.time() + time_limit
    options = {"threads": 2, "random_seed": 0, "mip_rel_gap": gaps[0], "mip_abs_gap": gaps[1],
               "mip_feasibility_tolerance": INTEGRALITY_TOLERANCE}
    stop = stop or threading.Event()
    if in_process is None:
        in_process = milp.matrix.nnz <= IN_PROCESS_NONZEROS
    if in_process:
        arrays = highs_worker.model_arrays(milp)
        status, x, bound = highs_worker.run(arrays, options, warm_start, stop, progress, None, deadline)
        return MilpOutcome(x, SolveStatus(status), bound)
    return _in_child(milp, options, deadline, warm_start, progress, stop, grace)


def _in_child(
    milp: SparseMilp,
    options: dict[str, float],
    deadline: float | None,
    warm_start: np.ndarray | None,
    progress: MilpProgress | None,
    stop: threading.Event,
    grace: float,
) -> MilpOutcome:
    """Run highs_worker.py on the model; killed after a stop, the best solution and bound it streamed."""
    options = {**options, "deadline": math.nan if deadline is None else deadline}
    last_bound: list[float | None] = [None]

    def on_line(line: str) -> None:
        try:
            seconds, incumbent, bound = (float(v) for v in line.split())
        except ValueError:  # not a progress line (HiGHS writing to stdout): nothing to report
            return
        known_incumbent, known_bound = (v if math.isfinite(v) else None for v in (incumbent, bound))
        last_bound[0] = known_bound if known_bound is not None else last_bound[0]
        if progress is not None:
            progress(seconds, known_incumbent, known_bound)

    with tempfile.TemporaryDirectory() as directory:
        given, answer = Path(directory) / "model.npz", Path(directory) / "answer.npz"
        np.savez(
            given,
            **highs_worker.model_arrays(milp),  # type: ignore[arg-type]  # numpy's stubs match **kwds to allow_pickle
            warm_start=np.zeros(0) if warm_start is None else warm_start.astype(np.float64),
            option_names=np.array(list(options)),
            option_values=np.array(list(options.values()), dtype=float),
        )
        if not run_worker(WORKER, [str(given), str(answer)], answer, on_line, stop, "HiGHS", grace):
            best = _best_streamed(milp, answer.with_name("best.npy"))
            return MilpOutcome(best, SolveStatus.INTERRUPTED, last_bound[0])
        with np.load(answer) as found:
            status, x, bound = SolveStatus(str(found["status"])), found["x"], float(found["bound"])
    return MilpOutcome(x if len(x) else None, status, bound if math.isfinite(bound) else None)


def _best_streamed(milp: SparseMilp, best: Path) -> np.ndarray | None:
    """The last improving solution the worker wrote, if it wrote one of the model's size."""
    if not best.exists():
        return None
    x = np.load(best)
    return x if len(x) == len(milp.cost) else None
