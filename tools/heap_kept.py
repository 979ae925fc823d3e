"""What the main heap keeps after a first run, beside what the predictions count: zoo rewrites measured with mallinfo2.

Each model of the zoo (`name:exporter:mode`) is rewritten at `--budget` and run by `measure_devices`'s child steps on
one onnxruntime CPU device with one thread (no worker-thread stack) in `--repeats` fresh processes. Around the run
that learns what is kept the child reads glibc's `mallinfo2` and the [heap] mapping's resident bytes. The table gives
the rewrite's small node outputs (served from the heap) and their bytes with objects, the predicted kept bytes (the
shared-buffer term), and the medians (ranges) of the kept bytes, the heap's resident growth, the arena's growth, and
the milliseconds a `malloc_trim(0)` takes in the child beside those of the measurement's trim and hold of the heap's
free chunks (`measure_devices._release_heap_holes`).

    python tools/heap_kept.py llama:legacy:infer gpt_mha:legacy:infer bert:dynamo:train --repeats 5
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

from onnx_remat.core.devices import Device
from onnx_remat.execution import input_values
from onnx_remat.passes import load, measure_devices
from onnx_remat.passes.measure import MEASURING_ENV
from onnx_remat.passes.run_devices import build_plan, compile_plan, run_plan
from onnx_remat.passes.sizes import on_heap, tensor_infos
from onnx_remat.pipeline import TrainingOptions, remat

DEVICE = Device("cpu", "onnxruntime", "CPUExecutionProvider", threads=1)


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_resident() -> int:
    """Resident bytes of the [heap] mapping (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:
                inside = fields[-1] == "[heap]"
            elif inside and fields[0] == "Rss:":
                return int(fields[1]) * 1024
    return 0


def child(folder: Path) -> dict[str, int]:
    """`measure_devices._child`'s steps up to the learning run, with the heap read around it, and the microseconds a
    `malloc_trim(0)` alone takes there beside those of `measure_devices._release_heap_holes` (trim and hold)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    plan = build_plan(onnx.load(str(folder / "model.onnx")), (DEVICE,))
    with np.load(folder / "feeds.npz") as data:
        feeds = {name: data[name] for name in data.files}
    run_plan(plan, *compile_plan(plan), feeds)
    runtimes, calls = compile_plan(plan)
    start = time.perf_counter()
    libc.malloc_trim(0)
    trimmed = time.perf_counter()
    measure_devices._release_heap_holes()  # trims again, then holds the free chunks
    held = time.perf_counter()
    heap, arena, kept = heap_resident(), libc.mallinfo2().arena, [0]
    run_plan(plan, runtimes, calls, feeds, measure_devices._Watch(plan, runtimes, kept, learn_kept=True))
    return {"kept": kept[0], "heap": heap_resident() - heap, "arena": libc.mallinfo2().arena - arena,
            "trim_us": int((trimmed - start) * 1e6), "hold_us": int((held - trimmed) * 1e6)}


def measure(spec: str, budget: str, repeats: int, workdir: Path) -> list[str]:
    """One row: the rewrite's small tensors, the predictions and the medians (ranges) of `repeats` processes."""
    from real_model_memory import BATCHES  # torch: not in the children, whose heap is measured
    from real_model_zoo import architecture, export

    name, exporter, mode = spec.split(":")
    folder = workdir / spec.replace(":", "_")
    folder.mkdir()
    source = export(name, exporter, folder / "source.onnx", batch=BATCHES.get(name, 32))
    result = remat(source, budget, mode=mode, training=TrainingOptions(loss=architecture(name).loss),
                   devices=(DEVICE,), time_limit=10, find_minimum=budget == "min")
    result.save(folder / "rewrite.onnx")
    model = load.load_model(folder / "rewrite.onnx")
    plan = build_plan(model, (DEVICE,))
    onnx.save(plan.model, str(folder / "model.onnx"))
    np.savez(folder / "feeds.npz", **input_values(model, None))  # type: ignore[arg-type]
    infos = tensor_infos(plan.model)
    small = {out for node in plan.model.graph.node for out in node.output
             if out in infos and on_heap(infos[out].nbytes)}
    samples = [_in_fresh_process(folder) for _ in range(repeats)]
    return [spec, str(len(plan.model.graph.node)), str(len(small)),
            f"{sum(infos[out].allocated_bytes for out in small) / 1024:.0f}", f"{plan.kept_bytes[0] / 1024:.0f}",
            *(_kib([sample[key] for sample in samples]) for key in ("kept", "heap", "arena")),
            *(_ms([sample[key] for sample in samples]) for key in ("trim_us", "hold_us"))]


def _in_fresh_process(folder: Path) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-P", __file__, "--child", str(folder)], capture_output=True, text=True,
                          env=dict(os.environ, **MEASURING_ENV), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ms(microseconds: list[int]) -> str:
    low, high = min(microseconds) / 1000, max(microseconds) / 1000
    return f"{statistics.median(microseconds) / 1000:.1f} ({low:.1f}-{high:.1f})"


def _kib(values: list[int]) -> str:
    return f"{statistics.median(values) / 1024:.0f} ({min(values) / 1024:.0f}-{max(values) / 1024:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="name:exporter:mode of the zoo")
    parser.add_argument("--budget", default="min")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per rewrite")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    table = Table(title=f"the main heap after the first run, one thread, median (range) of {args.repeats} processes")
    for column in ("model", "nodes", "small node outputs", "their KiB", "predicted kept KiB",
                   "kept KiB", "heap resident growth KiB", "arena growth KiB", "malloc_trim ms",
                   "trim and hold ms"):
        table.add_column(column, justify="left" if column == "model" else "right")
    with tempfile.TemporaryDirectory() as workdir:
        for spec in args.models:
            table.add_row(*measure(spec, args.budget, args.repeats, Path(workdir)))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
