"""Measure each device's peak memory while a multi-device plan runs, in a fresh process.

Both engines share one process, whose resident set (RSS) cannot be split by device as a whole; the steps can be:
a segment runs on one device, so what the process's memory rises by while it runs is that device's. The child
(this module run as a script, with `measure.MEASURING_ENV` so that freed tensors leave the resident set at once
and no telemetry thread of onnxruntime allocates during a step) runs the plan once on throwaway compilations (the
engines' one-time initialization), compiles every segment again, runs the plan once (the warm-up) and then `runs`
times watched step by step (`run_devices.Probe`). Around every step it reads VmRSS, and the peak of the resident set
over the step exactly (`rss_peak.PeakWatch`: read before every call that lowers it; where seccomp is missing,
VmHWM after `5` into /proc/self/clear_refs, which falls short by up to 31 pages per CPU). A device's measured peak at
a step is

    parameter bytes its segments read (`Plan.parameter_bytes`; the engines' own copies of them are not counted)
  + bytes the values the executor holds on the device take (`resident_bytes`: a value glibc mapped on its own takes
    whole pages, its header in the first; one in the main heap its data size)
  + what its runtime kept from the warm-up run (below)
  + for a segment on the device: its peak - VmRSS before it (its outputs, intermediates and scratch)

taken as the largest over the steps that touch the device (its segments and the copies into it), the median over the
watched runs. `with_measured_peaks` measures in one such process, and in more when that one lands near a budget or over
it (`verdict`): the heap's layout, and so the peak, moves from one process to the next. "Kept" is honest about engines
that hold memory between calls: in the warm-up run each segment's rise in RSS beyond the outputs it hands over stays
resident for every later run, so it is added to its device's memory from then on. With the runtimes of `runtimes`
(bindings cleared, OpenVINO requests and intermediate memory released after each call) it is near zero; a runtime that
caches buffers shows up here rather than hiding in the resident set before the step. Not counted: the host's part of a
copy (the array in host memory while it moves), graph inputs held on the host, and the engines' code, graphs and
compiled kernels.

Page granularity and allocator slack make small tensors measure poorly. glibc maps a block of 4 KiB or more on its
own only when it has to grow: a free chunk of the heap large enough, or the top pad of a heap that grew, serves it
first, so the child holds the heap's large free chunks and sets the pad to 0 before the learning run
(`_release_heap_holes`); a held value that still landed in the heap (in a chunk the learning run freed) takes its
bytes there and whole pages otherwise, which its address tells (256 held outputs of 64 KiB take 17 pages each,
measured 17.0 MiB; counted at their data size they came to 16.8). Blocks under 4 KiB come from the heap, which does
not shrink below its highest live block. What a runtime keeps is partly its own state: onnxruntime keeps about 0.22
KiB per node that writes into its input's buffer, after the node's first run (chains of 2000 Relu nodes kept 0.42-0.44
MiB; a chain of Add or Conv nodes nothing measurable), and 72 KiB of stack per intra-op worker thread of a session that
runs a GEMM, which the predictions count (`runtime_kept`); and partly the
heap's small tensors: DenseNet-121's training step keeps 0.8-1.9 MiB (5597 nodes), MobileNetV3-small's 0.5-0.8 (2204
nodes; 85 of the dynamo export's 2556 share a buffer), spread by 0.1-1.0 MiB between fresh processes
(docs/measurements.md). That is the heap the run's small tensors needed, its holes resident after they are freed
(glibc's heap in use returns to where it was after each run; its free bytes grow): the predictions count each tensor
served from the heap at its data and `sizes.HEAP_TENSOR_BYTES` while it lives, so what is kept here stands for the
small tensors the predictions hold at their peak, not beside them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnx_remat.core.devices import Device
from onnx_remat.core.options import DEFAULT_MEMORY_PROCESSES
from onnx_remat.passes.measure import MEASURING_ENV, reset_high_water_mark, status_bytes
from onnx_remat.passes.rss_peak import PeakWatch
from onnx_remat.passes.run_devices import DeviceRun, Handoff, Key, Plan, Segment, build_plan, compile_plan, run_plan
from onnx_remat.passes.runtimes import Runtime
from onnx_remat.passes.sizes import MMAP_THRESHOLD, PAGE_BYTES
from onnx_remat.passes.verdict import near_budget

_LARGE_MODEL = 1 << 30  # bytes of serialized model above which the child gets the weights as external data
WATCHED_RUNS = 3  # runs a child watches after its warm-up; it reports their median


@dataclass(frozen=True)
class MeasuredPeaks:
    """Per device (in plan order): the measured peak bytes and the bytes its runtime kept between runs."""

    peak_bytes: tuple[int, ...]
    kept_bytes: tuple[int, ...]


def with_measured_peaks(
    run: DeviceRun, plan: Plan, feeds: dict[str, np.ndarray], processes: int = DEFAULT_MEMORY_PROCESSES
) -> DeviceRun:
    """`run` (of `plan` on `feeds`) with each device's peak bytes measured in a fresh process, and in `processes` in
    all when that lands near a device's budget or over it (`verdict.near_budget`), which `verdicts` then go by."""
    names = [device.name for device in plan.devices]
    budgets = [run.budgets.get(name) for name in names]
    with _measuring_folder(plan, feeds) as folder:
        samples = [_measure_in(folder, WATCHED_RUNS).peak_bytes]
        if any(near_budget(peak, budget) for peak, budget in zip(samples[0], budgets, strict=True)):
            samples += [_measure_in(folder, WATCHED_RUNS).peak_bytes for _ in range(processes - 1)]
    return replace(run, measured_peak_samples={
        name: tuple(peaks[d] for peaks in samples) for d, name in enumerate(names)
    })


def measure_device_peaks(plan: Plan, feeds: dict[str, np.ndarray], runs: int = WATCHED_RUNS) -> MeasuredPeaks:
    """Each device's peak bytes while `plan` runs on `feeds`, measured in a fresh process (median of `runs`)."""
    with _measuring_folder(plan, feeds) as folder:
        return _measure_in(folder, runs)


@contextlib.contextmanager
def _measuring_folder(plan: Plan, feeds: dict[str, np.ndarray]) -> Iterator[Path]:
    """A temporary folder holding what the child reads: the plan's model, the feeds and the devices."""
    with tempfile.TemporaryDirectory(prefix="onnx_remat_measure_") as workdir:
        folder = Path(workdir)
        _save_model(plan.model, folder / "model.onnx")
        np.savez(folder / "feeds.npz", **feeds)  # type: ignore[arg-type]  # numpy's stubs match **kwds to allow_pickle
        (folder / "devices.json").write_text(json.dumps([asdict(device) for device in plan.devices]))
        yield folder


def _measure_in(folder: Path, runs: int, env: dict[str, str] = MEASURING_ENV) -> MeasuredPeaks:
    """Run the child in a fresh process on what `folder` holds, with `env` added to this process's environment: its
    measured peaks (median of `runs`)."""
    environment = dict(os.environ, **env)
    done = subprocess.run(
        [sys.executable, "-P", "-m", "onnx_remat.passes.measure_devices", str(folder), str(runs)],
        capture_output=True, text=True, env=environment,
    )
    if done.returncode != 0:
        raise RuntimeError(f"measuring device memory failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return MeasuredPeaks(tuple(result["peak_bytes"]), tuple(result["kept_bytes"]))


def _save_model(model: onnx.ModelProto, path: Path) -> None:
    if model.ByteSize() < _LARGE_MODEL:
        onnx.save(model, str(path))
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving as external data rewrites the initializers in place
    onnx.save(copy, str(path), save_as_external_data=True, location="weights.bin")


def heap_span() -> range:
    """The addresses of this process's main heap (glibc's brk arena), empty if it has none."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith("[heap]"):
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                return range(start, end)
    return range(0)


def resident_bytes(address: int, nbytes: int, heap: range) -> int:
    """Resident bytes of `nbytes` of data at `address`: its size inside the main heap (it shares pages there), else
    the whole pages of its own mapping, whose first page also holds glibc's header and alignment padding."""
    if nbytes == 0 or address in heap:
        return nbytes
    return -(-(address % PAGE_BYTES + nbytes) // PAGE_BYTES) * PAGE_BYTES


def _address(value: Any) -> int:
    """Where a device value's data starts: an OrtValue's data pointer, else (an OpenVINO tensor) its array's."""
    return value.data_ptr() if isinstance(value, ort.OrtValue) else value.data.ctypes.data


class _Watch:
    """A Probe that measures per device: held bytes, the segment's rise above RSS (its peak read by `peak_watch`,
    else from VmHWM), and what runtimes keep."""

    def __init__(self, plan: Plan, runtimes: list[Runtime], kept: list[int], learn_kept: bool,
                 peak_watch: PeakWatch | None):
        self.plan = plan
        self.runtimes = runtimes
        self.kept = kept  # per device: bytes kept by its runtime between runs (added to by the warm-up run)
        self.learn_kept = learn_kept
        self.peak_watch = peak_watch
        self.peaks = list(plan.parameter_bytes)
        self.rss_before = 0

    def held(self, values: dict[Key, Any], device: int) -> int:
        """Resident bytes of the values held on `device` (never graph inputs on the host: their device is
        run_devices.HOST)."""
        runtime, heap = self.runtimes[device], heap_span()
        return sum(resident_bytes(_address(value), runtime.nbytes(value), heap)
                   for (_, where), value in values.items() if where == device)

    def before(self, index: int, values: dict[Key, Any]) -> None:
        reset_high_water_mark()
        self.rss_before = status_bytes("VmRSS")
        if self.peak_watch is not None:
            self.peak_watch.start()
        self.held_before = self.held(values, self._device(index))

    def after(self, index: int, values: dict[Key, Any]) -> None:
        high = status_bytes("VmHWM") if self.peak_watch is None else self.peak_watch.peak()
        now = status_bytes("VmRSS")
        step = self.plan.steps[index]
        device = self._device(index)
        held = self.held(values, device)
        base = self.plan.parameter_bytes[device] + self.kept[device]
        if isinstance(step, Segment):
            self.peaks[device] = max(self.peaks[device], base + self.held_before + high - self.rss_before, base + held)
            if self.learn_kept:
                handed_over = held - self.held_before
                self.kept[device] += max(0, now - self.rss_before - handed_over)
        else:
            self.peaks[device] = max(self.peaks[device], base + held)

    def _device(self, index: int) -> int:
        step = self.plan.steps[index]
        return step.target if isinstance(step, Handoff) else step.device


def _release_heap_holes() -> None:
    """Give the free pages of glibc's heap back (`malloc_trim(0)`), so that the heap a run needs is touched again,
    counted as kept, rather than served unseen from holes that loading and the throwaway run left: 3000 live
    tensors of 1 KiB measured 4.6-4.8 MiB with those holes, less than their data and the 2.9 MiB Concat of them, and
    7.0 MiB without (7.1 predicted). Then hold the heap's free chunks a block of `MMAP_THRESHOLD` or more fits in,
    and set glibc's top pad to 0, so that such a block is mapped on its own, as the predictions count it, and its
    pages leave the resident set when it is freed. glibc serves such a block from a free chunk of the heap, or from
    the 128 KiB top pad a growing heap keeps, before it maps one (an allocation tracer on llama's dynamo inference
    rewrite at its minimum: 90 of the first run's 93 tensors of 4-16 KiB came from the heap, 23 chunks over time
    touching 152 KiB of pages where 48 KiB were live at once); those pages stay resident after the block is freed
    and were counted as kept: 68-208 KiB on that rewrite against 32 predicted, 4-32 KiB with the chunks held and no
    pad (docs/measurements.md)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)
    libc.mallopt(_M_TOP_PAD, 0)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    for _ in range(_HOLD_PASSES):  # holding a chunk can merge freed small chunks into a new one
        chunks = _free_heap_chunks(MMAP_THRESHOLD)
        if not chunks:
            break
        _HELD_CHUNKS.extend(libc.malloc(size - _CHUNK_HEADER_BYTES) for size in chunks)


_M_TOP_PAD = -2  # mallopt's parameter number
_CHUNK_HEADER_BYTES = 8  # an allocated chunk's size field; malloc(size - 8) takes a free chunk of `size` whole
_HOLD_PASSES = 5
_WORD_BYTES = 8
_HELD_CHUNKS: list[int] = []  # held for the child's life


def _free_heap_chunks(at_least: int) -> list[int]:
    """The sizes of the free chunks of glibc's main heap of `at_least` bytes or more, top chunk excepted: the heap's
    chunks are walked by their size fields, the second word of each (bit 0 of the next chunk's tells whether a chunk
    is in use, the low three bits are flags), read where they are, so that no page is touched. Empty when the process
    has no main heap."""
    heap = heap_span()
    words = memoryview((ctypes.c_char * len(heap)).from_address(heap.start)).cast("B").cast("Q")
    sizes, index, end = [], 0, len(words) - 2
    while index <= end:
        size = words[index + 1] & ~7
        following = index + size // _WORD_BYTES
        if size == 0 or following > end:
            break  # the top chunk
        if size >= at_least and not words[following + 1] & 1:
            sizes.append(size)
        index = following
    return sizes


def _child(folder: Path, runs: int) -> dict[str, list[int]]:
    """Run once on throwaway compilations (what an engine initializes once per process is not a segment's), compile
    again, release the heap's holes, run once learning what runtimes keep, then `runs` watched runs: the median peak
    per device."""
    devices = tuple(Device(**fields) for fields in json.loads((folder / "devices.json").read_text()))
    plan = build_plan(onnx.load(str(folder / "model.onnx")), devices)
    with np.load(folder / "feeds.npz") as data:
        feeds = {name: data[name] for name in data.files}
    run_plan(plan, *compile_plan(plan), feeds)  # on throwaway compilations: the engines' one-time initialization
    runtimes, calls = compile_plan(plan)
    peak_watch = PeakWatch.install()
    _release_heap_holes()
    kept = [0] * len(devices)
    run_plan(plan, runtimes, calls, feeds, _Watch(plan, runtimes, kept, True, peak_watch))
    peaks = []
    for _ in range(max(runs, 1)):
        watch = _Watch(plan, runtimes, kept, False, peak_watch)
        run_plan(plan, runtimes, calls, feeds, watch)
        peaks.append(watch.peaks)
    return {
        "peak_bytes": [int(statistics.median(run[d] for run in peaks)) for d in range(len(devices))],
        "kept_bytes": kept,
    }


if __name__ == "__main__":
    print(json.dumps(_child(Path(sys.argv[1]), int(sys.argv[2]))))
