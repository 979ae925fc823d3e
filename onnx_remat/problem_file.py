"""Problem files: the solver's Problem as documented JSON, so results can be reproduced and other solvers compared.

Format (version 1), one JSON object; every key is required but `computed_once`, `loaded` and an operator's
`kept_bytes` and `node_steps`, no other key is allowed:

    {
      "format": "onnx-remat-problem",
      "version": 1,
      "devices": [{"name": "cpu", "resident_bytes": 1024, "budget_bytes": 4096}, ...],
      "copy_seconds_per_byte": [[0.0, 1e-10], [1e-10, 0.0]],
      "copy_fixed_seconds": [[0.0, 2e-5], [2e-5, 0.0]],
      "operators": [
        {"name": "conv1", "seconds": [0.002, 0.005], "output_bytes": 512, "workspace_bytes": 0,
         "kept_bytes": [160, 0], "node_steps": {"bytes": [512, 1024, 512], "last_reads": [[0, 1]]}}, ...
      ],
      "edges": [[0, 1], ...],
      "graph_outputs": [7, ...],
      "computed_once": [3, ...],
      "loaded": [{"bytes": [4096, 4096], "readers": [0, 9]}, ...]
    }

- `devices[d]`: the device's name, the bytes it holds for the whole run whatever runs there (with one device:
  parameters, graph inputs) and its budget: the bytes it may hold at any moment, resident bytes included.
- `copy_seconds_per_byte[d][e]`, `copy_fixed_seconds[d][e]`: moving an output of b bytes from device d to device e
  takes `fixed + per_byte * b` seconds (devices x devices matrices; the fixed part is paid by every hand-off).
- `operators[i]`, in a topological order: `seconds[d]` to run it on device d (one entry per device), the bytes
  of its output, the transient bytes it needs while it runs, and `kept_bytes[d]`: what device d's runtime keeps for
  each computation of it there, held for the whole run (optional on reading: none); `node_steps`: its nodes one by
  one, the bytes of its own tensors while each runs and, for an input operator it stops reading before its last
  node, [input, last node reading it]: replayed as run, an input the schedule frees after it is held only until then
  (optional: none, every input held to its end).
- `edges`: [u, v] means operator v reads operator u's output; u < v (indices into `operators`).
- `graph_outputs`: operators whose output must still be held on some device when the run ends.
- `computed_once`: operators that may be computed only once (random ones: Dropout in training, RandomUniformLike...);
  their output is held or copied until its last use. Optional on reading (files written before it: none).
- `loaded`: tensors (parameters, graph inputs with several devices) that device d holds for the whole run, `bytes[d]`,
  once one of their `readers` (operator indices) is computed there. Optional on reading (none).

A problem's `segment_frame` (several devices) is not written: its bound is in `kept_bytes` and `loaded`, which a
problem read back replays (as run too) instead of each session's own frame.

Sizes are whole non-negative bytes, times non-negative seconds. A file that breaks any of this is refused on
reading with a ModelError (exit code 3: an unusable input) naming the field and what to fix.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from onnx_remat.core.errors import ModelError
from onnx_remat.core.files import write_atomically
from onnx_remat.core.problem import Loaded, NodeSteps, Problem

FORMAT = "onnx-remat-problem"
VERSION = 1
_TOP_KEYS = (
    "format", "version", "devices", "copy_seconds_per_byte", "copy_fixed_seconds", "operators", "edges", "graph_outputs"
)
_OPTIONAL_TOP_KEYS = ("computed_once", "loaded")
_LOADED_KEYS = ("bytes", "readers")
_DEVICE_KEYS = ("name", "resident_bytes", "budget_bytes")
_OPERATOR_KEYS = ("name", "seconds", "output_bytes", "workspace_bytes")
_OPTIONAL_OPERATOR_KEYS = ("kept_bytes", "node_steps")
_NODE_STEPS_KEYS = ("bytes", "last_reads")


def problem_to_json(problem: Problem) -> dict[str, Any]:
    """The problem as a JSON-ready dict in the documented format."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "devices": [
            {"name": name, "resident_bytes": resident, "budget_bytes": budget}
            for name, resident, budget in zip(problem.devices, problem.resident_bytes, problem.budgets, strict=True)
        ],
        "copy_seconds_per_byte": [list(row) for row in problem.copy_seconds_per_byte],
        "copy_fixed_seconds": [list(row) for row in problem.copy_fixed_seconds],
        "operators": [
            {
                "name": problem.op_names[i],
                "seconds": [problem.cost[d][i] for d in range(problem.num_devices)],
                "output_bytes": problem.output_bytes[i],
                "workspace_bytes": problem.workspace_bytes[i],
                "kept_bytes": [problem.kept_bytes[d][i] for d in range(problem.num_devices)],
                **_node_steps_json(problem, i),
            }
            for i in range(problem.num_ops)
        ],
        "edges": [list(edge) for edge in problem.edges],
        "graph_outputs": list(problem.graph_outputs),
        "computed_once": list(problem.computed_once),
        "loaded": [{"bytes": list(group.bytes), "readers": list(group.readers)} for group in problem.loaded],
    }


def _node_steps_json(problem: Problem, op: int) -> dict[str, Any]:
    """An operator's "node_steps" entry, if the problem has node steps."""
    if not problem.node_steps:
        return {}
    steps = problem.node_steps[op]
    return {"node_steps": {"bytes": list(steps.bytes), "last_reads": [list(read) for read in steps.last_reads]}}


def write_problem(problem: Problem, path: str | Path) -> None:
    """Write `problem` to `path` as JSON, atomically (a temporary file, then a rename)."""
    text = json.dumps(problem_to_json(problem), indent=1)
    write_atomically(Path(path), (text + "\n").encode())


def read_problem(path: str | Path) -> Problem:
    """Read and validate a problem file; raise ModelError saying what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ModelError(f"problem file {path} does not exist: check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read problem file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"problem file {path} is not JSON ({exc}): write it with --emit-problem") from None
    return problem_from_json(data, str(path))


def problem_from_json(data: Any, where: str = "problem") -> Problem:
    """The Problem described by a parsed problem file; raise ModelError naming the first bad field."""
    top = _object(data, where, _TOP_KEYS, _OPTIONAL_TOP_KEYS)
    if top["format"] != FORMAT:
        raise ModelError(f'{where}: "format" must be {FORMAT!r}, not {top["format"]!r}')
    if top["version"] != VERSION:
        raise ModelError(f"{where}: version {top['version']!r} is not supported: this onnx-remat reads version 1")
    devices = [_object(d, f"{where}: devices[{k}]", _DEVICE_KEYS) for k, d in enumerate(_list(top, "devices", where))]
    if not devices:
        raise ModelError(f'{where}: "devices" is empty: give at least one device')
    names = [_text(d["name"], f"{where}: devices[{k}].name") for k, d in enumerate(devices)]
    if len(set(names)) != len(names):
        raise ModelError(f"{where}: device names {names} repeat: give each device its own name")
    count = len(devices)
    copy = _matrix(top["copy_seconds_per_byte"], count, f"{where}: copy_seconds_per_byte")
    fixed = _matrix(top["copy_fixed_seconds"], count, f"{where}: copy_fixed_seconds")
    operators = [
        _object(op, f"{where}: operators[{i}]", _OPERATOR_KEYS, _OPTIONAL_OPERATOR_KEYS)
        for i, op in enumerate(_list(top, "operators", where))
    ]
    n = len(operators)
    seconds = [_seconds_row(op["seconds"], count, f"{where}: operators[{i}].seconds") for i, op in enumerate(operators)]
    edges = tuple(_edge(e, n, f"{where}: edges[{k}]") for k, e in enumerate(_list(top, "edges", where)))
    outputs = tuple(
        _index(o, n, f"{where}: graph_outputs[{k}]") for k, o in enumerate(_list(top, "graph_outputs", where))
    )
    once = _computed_once(top, n, where)
    kept = [_kept_row(op.get("kept_bytes", [0] * count), count, f"{where}: operators[{i}].kept_bytes")
            for i, op in enumerate(operators)]
    return Problem(
        op_names=tuple(_text(op["name"], f"{where}: operators[{i}].name") for i, op in enumerate(operators)),
        edges=edges,
        output_bytes=tuple(
            _bytes(op["output_bytes"], f"{where}: operators[{i}].output_bytes") for i, op in enumerate(operators)
        ),
        cost=tuple(tuple(row[d] for row in seconds) for d in range(count)),
        resident_bytes=tuple(
            _bytes(d["resident_bytes"], f"{where}: devices[{k}].resident_bytes") for k, d in enumerate(devices)
        ),
        budgets=tuple(_bytes(d["budget_bytes"], f"{where}: devices[{k}].budget_bytes") for k, d in enumerate(devices)),
        graph_outputs=outputs,
        devices=tuple(names),
        workspace_bytes=tuple(
            _bytes(op["workspace_bytes"], f"{where}: operators[{i}].workspace_bytes") for i, op in enumerate(operators)
        ),
        copy_seconds_per_byte=copy,
        copy_fixed_seconds=fixed,
        computed_once=once,
        kept_bytes=tuple(tuple(row[d] for row in kept) for d in range(count)),
        loaded=_loaded(top, n, count, where),
        node_steps=_node_steps(operators, edges, where),
    )


def _object(value: Any, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """`value` as an object with exactly `keys`, and any of `optional`."""
    if not isinstance(value, dict):
        raise ModelError(f"{where} must be a JSON object with keys {', '.join(keys)}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise ModelError(f"{where} lacks {', '.join(map(repr, missing))}: every one of {', '.join(keys)} is required")
    extra = sorted(set(value) - set(keys) - set(optional))
    if extra:
        allowed = ", ".join((*keys, *optional))
        raise ModelError(f"{where} has unknown keys {', '.join(map(repr, extra))}: allowed are {allowed}")
    return value


def _computed_once(top: dict[str, Any], n: int, where: str) -> tuple[int, ...]:
    """The distinct operator indices of the optional "computed_once" list (none if absent)."""
    if "computed_once" not in top:
        return ()
    once = tuple(_index(o, n, f"{where}: computed_once[{k}]") for k, o in enumerate(_list(top, "computed_once", where)))
    if len(set(once)) != len(once):
        raise ModelError(f"{where}: computed_once {list(once)} repeats an operator: list each once")
    return once


def _loaded(top: dict[str, Any], n: int, count: int, where: str) -> tuple[Loaded, ...]:
    """The optional "loaded" groups (none if absent): bytes per device and at least one reader each."""
    groups = []
    for g, value in enumerate(_list(top, "loaded", where) if "loaded" in top else []):
        here = f"{where}: loaded[{g}]"
        group = _object(value, here, _LOADED_KEYS)
        readers = tuple(_index(r, n, f"{here}.readers[{k}]") for k, r in enumerate(_list(group, "readers", here)))
        if not readers:
            raise ModelError(f"{here}.readers is empty: list the operators reading the group")
        groups.append(Loaded(_kept_row(group["bytes"], count, f"{here}.bytes"), readers))
    return tuple(groups)


def _node_steps(operators: list[dict[str, Any]], edges: tuple[tuple[int, int], ...],
                where: str) -> tuple[NodeSteps, ...]:
    """The operators' optional "node_steps" (none if no operator has any): bytes per node, and [input, node] pairs
    naming an input operator (an edge into the operator) and one of its nodes."""
    if not any("node_steps" in op for op in operators):
        return ()
    inputs: dict[int, set[int]] = {}
    for u, v in edges:
        inputs.setdefault(v, set()).add(u)
    found = []
    for i, op in enumerate(operators):
        here = f"{where}: operators[{i}].node_steps"
        if "node_steps" not in op:
            found.append(NodeSteps())
            continue
        steps = _object(op["node_steps"], here, _NODE_STEPS_KEYS)
        sizes = tuple(_bytes(b, f"{here}.bytes[{k}]") for k, b in enumerate(_list(steps, "bytes", here)))
        reads = []
        for k, read in enumerate(_list(steps, "last_reads", here)):
            if (not isinstance(read, list) or len(read) != 2 or any(isinstance(v, bool) or not isinstance(v, int)
                                                                    for v in read)
                    or read[0] not in inputs.get(i, set()) or not 0 <= read[1] < len(sizes)):
                raise ModelError(f"{here}.last_reads[{k}] must be [input operator, node]: an operator with an edge "
                                 f"into operator {i} and a node index in 0..{len(sizes) - 1}")
            reads.append((read[0], read[1]))
        found.append(NodeSteps(sizes, tuple(reads)))
    return tuple(found)


def _list(top: dict[str, Any], key: str, where: str) -> list[Any]:
    value = top[key]
    if not isinstance(value, list):
        raise ModelError(f"{where}: {key!r} must be a JSON list")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ModelError(f"{where} must be a non-empty string, not {value!r}")
    return value


def _bytes(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelError(f"{where} must be a whole number of bytes >= 0, not {value!r}")
    return value


def _kept_row(value: Any, count: int, where: str) -> tuple[int, ...]:
    """A list of `count` byte counts, one per device."""
    if not isinstance(value, list) or len(value) != count:
        raise ModelError(f"{where} must be a list of {count} whole numbers of bytes, one per device")
    return tuple(_bytes(v, f"{where}[{k}]") for k, v in enumerate(value))


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ModelError(f"{where} must be a finite number of seconds >= 0, not {value!r}")
    return float(value)


def _seconds_row(value: Any, count: int, where: str) -> tuple[float, ...]:
    """A list of `count` seconds, one per device."""
    if not isinstance(value, list) or len(value) != count:
        raise ModelError(f"{where} must be a list of {count} numbers, one per device")
    return tuple(_seconds(v, f"{where}[{k}]") for k, v in enumerate(value))


def _matrix(value: Any, count: int, where: str) -> tuple[tuple[float, ...], ...]:
    """A devices x devices matrix of seconds per byte."""
    if not isinstance(value, list) or len(value) != count:
        raise ModelError(f"{where} must be a {count} x {count} list of lists, one row per device")
    return tuple(_seconds_row(row, count, f"{where}[{d}]") for d, row in enumerate(value))


def _index(value: Any, n: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ModelError(f"{where} must be an operator index in 0..{n - 1}, not {value!r}")
    return value


def _edge(value: Any, n: int, where: str) -> tuple[int, int]:
    """[u, v] with u < v: the operators are in a topological order."""
    if not isinstance(value, list) or len(value) != 2:
        raise ModelError(f"{where} must be a pair [u, v] of operator indices")
    u, v = _index(value[0], n, where), _index(value[1], n, where)
    if u >= v:
        raise ModelError(f"{where} = [{u}, {v}] does not go forward: list operators in a topological order (u < v)")
    return u, v
