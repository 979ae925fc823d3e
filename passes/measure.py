"""Measure the activation memory of one onnxruntime run, in a fresh process.

The child loads the session (weights), runs once to warm up, runs again and reads the peak of its resident set
(`rss_peak.PeakWatch`; where seccomp is missing, VmHWM after `5` into /proc/self/clear_refs, which falls short by up
to 31 pages per CPU): the peak above the resident set before the run is what the run's live tensors and scratch
buffers took. A fresh process per
measurement keeps allocator state from earlier runs out of it, and glibc is told to map every
block of a page (4 KiB) or more on its own when it has to grow (a free chunk of its heap large
enough still serves first), so a freed tensor leaves the resident set at once (as it does in a
device allocator); such a block takes whole pages (`sizes.allocated_bytes`). Without that, glibc
raises its mmap threshold after the first free of a large block, serves later tensors from the
heap, and the warm-up run leaves the heap touched:
the measured peak then drops to a fraction of the live tensors. At a 64 KiB threshold the many small tensors of a
training step (BatchNorm statistics and gradients, late DenseNet blocks) fragment the heap instead: the first run
left 3.8-4.2 MiB of it resident on DenseNet-121's minimum-budget training step, which `measure_devices` counts as
kept by the runtime (1.4-1.5 MiB at 4 KiB, 2.2-2.4 at 16 KiB, 1.2 at 1 KiB where a 1 KiB tensor takes a page).

The child also runs with onnxruntime's telemetry off (`ORT_DISABLE_TELEMETRY`). Importing onnxruntime 1.32 on Linux
starts a thread that, at a moment set by a timer, sends the telemetry events over HTTP (libcurl, linked into
onnxruntime): name lookups, two resolver threads, their stacks and buffers, and code paged in from onnxruntime and
libc, about 0.4-0.5 MiB of resident set that no run of a model needs. Where the moment lands depends on how fast the
child gets there: during a watched step it raises that step's high-water mark, during `measure_devices`' learning run
it is counted as kept and added to every watched run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_remat.passes.aliasing import shared_buffers
from onnx_remat.passes.execution_frame import ORT_VALUE_BYTES, frame_bytes
from onnx_remat.passes.manager import name_of, named
from onnx_remat.passes.shapes import resolve_shapes
from onnx_remat.passes.sizes import MMAP_THRESHOLD, held_as_initializer, tensor_infos
from onnx_remat.passes.workspace import workspace_bytes

MEASURING_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": "0", "ORT_DISABLE_TELEMETRY": "1",
}
"""The environment of a measuring child: glibc's thresholds (above), and onnxruntime's telemetry off (below)."""


def measure_activation_peak(model_path: str | Path, repeats: int = 3, threads: int = 1) -> int:
    """Median over `repeats` fresh processes of the bytes one run holds above its starting RSS."""
    return int(statistics.median(_measure_once(Path(model_path), threads) for _ in range(repeats)))


def predicted_activation_peak(model: onnx.ModelProto, threads: int = 1, per_value: int = ORT_VALUE_BYTES) -> int:
    """What `measure_activation_peak` should see for a model run in file order: the largest sum, over nodes,
    of live buffers plus the node's workspace (`node_memory`), and the run's execution frame (`per_value` bytes per
    value of the graph: `execution_frame`)."""
    tensors = max((sum(step.live.values()) + step.workspace for step in node_memory(model, threads)), default=0)
    return tensors + frame_bytes(model, per_value)


@dataclass(frozen=True)
class NodeMemory:
    """While a node runs: the bytes of each live buffer (by tensor name; the node's outputs included) and its
    workspace."""

    live: dict[str, int]
    workspace: int


def node_memory(model: onnx.ModelProto, threads: int = 1) -> Iterator[NodeMemory]:
    """Per node of a model run in file order, what it holds while it runs. A buffer lives from its producer to the
    last reader of any tensor in it (a reshape shares its input's); graph outputs and tensors no node reads live to
    the end (onnxruntime frees unread outputs only then). A Constant's output is an initializer, resident before the
    run (`sizes.held_as_initializer`), not among them. Each node's live buffers are a dict of their own, never
    changed after it is yielded (no copy per node: a rewrite has thousands of nodes)."""
    model = resolve_shapes(model)
    infos = tensor_infos(model)
    graph = ir.serde.deserialize_model(model).graph
    nodes = list(graph)
    outputs = [named(output) for output in graph.outputs]
    owner = shared_buffers(nodes, set(outputs))
    last_use = {owner.get(name, name): index for index, node in enumerate(nodes) for name in map(name_of, node.inputs)}
    last_use.update({name: len(nodes) for name in outputs})
    live: dict[str, int] = {}
    for index, node in enumerate(nodes):
        allocated = [] if held_as_initializer(node) else map(name_of, node.outputs)
        live.update((name, infos[name].allocated_bytes) for name in allocated if name and name not in owner)
        yield NodeMemory(live, workspace_bytes(node, infos, threads))
        live = {name: size for name, size in live.items() if last_use.get(name, len(nodes)) > index}


def held_before_run(model: onnx.ModelProto) -> int:
    """Bytes `measure_activation_peak` finds resident before the run: parameters, Constants' values (initializers
    once loaded) and graph inputs. Other nodes fed by constants alone (a report's resident prelude) run inside the
    run and count as activations there."""
    infos = tensor_infos(model)
    names = {init.name for init in model.graph.initializer} | {value.name for value in model.graph.input}
    names |= {name for node in model.graph.node if held_as_initializer(node) for name in node.output}
    return sum(infos[name].allocated_bytes for name in names)


def _measure_once(model_path: Path, threads: int, env: dict[str, str] | None = None) -> int:
    """One measurement in a child process (this module run as a script)."""
    environment = dict(os.environ, **(MEASURING_ENV if env is None else env), OMP_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, "-P", "-m", "onnx_remat.passes.measure", str(model_path), str(threads)],
        capture_output=True, text=True, env=environment, check=True,
    )
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak"])


def status_bytes(key: str) -> int:
    """A `kB` field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_high_water_mark() -> None:
    """Make this process's VmHWM start again from its current resident set."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def _child(model_path: str, threads: int) -> int:
    """Warm up, then run once more: the peak bytes above the RSS before the run (read exactly by
    `rss_peak.PeakWatch`, else from the high-water mark)."""
    import onnx

    from onnx_remat.passes.execute import ort_session, random_feeds
    from onnx_remat.passes.rss_peak import PeakWatch

    feeds = random_feeds(onnx.load(model_path, load_external_data=False), seed=0)
    session = ort_session(model_path, threads=threads)
    session.run(None, feeds)
    watch = PeakWatch.install()
    reset_high_water_mark()
    before = status_bytes("VmRSS")
    if watch is not None:
        watch.start()
    session.run(None, feeds)
    return (status_bytes("VmHWM") if watch is None else watch.peak()) - before


if __name__ == "__main__":
    print(json.dumps({"peak": _child(sys.argv[1], int(sys.argv[2]))}))
