"""The command line starts without loading a runtime or a solver (issue 15): structural checks, never timings
(tools/bench_startup.py measures the times)."""

from __future__ import annotations

import json
import subprocess
import sys

from onnx_remat.core.options import SOLVERS
from onnx_remat.passes.solve import BACKENDS

HEAVY = ("onnxruntime", "openvino", "highspy", "ortools", "pulp", "matplotlib", "torch", "onnxscript", "onnx_ir",
         "sympy")


def heavy_loaded(code: str) -> list[str]:
    """The HEAVY modules loaded once `code` has run in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_importing_the_cli_loads_no_runtime_or_solver():
    assert heavy_loaded("import onnx_remat.cli.main") == []


def test_every_parser_builds_without_a_runtime_or_solver():
    code = ("from onnx_remat.cli.main import COMMANDS, build_parser, command_module\n"
            "build_parser()\n"
            "for name in COMMANDS:\n"
            "    command_module(name).build_parser()")
    assert heavy_loaded(code) == []


def test_every_solver_but_auto_names_a_backend():
    assert ("auto", *BACKENDS) == SOLVERS
