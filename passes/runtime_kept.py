"""What a runtime keeps per node, and per session, after the first run: resident for every later run of the session.

onnxruntime's CPU provider keeps SHARED_BUFFER_BYTES for each node that writes into its input's buffer (a view such
as Reshape or Identity, an activation run in place: aliasing.shared_buffers), from the node's first run on, and
nothing measurable for a node writing a buffer of its own. Measured by `tools/kept_memory.py` on chains of 2000 nodes
of one op type on 16 KiB tensors, median of 5 fresh processes: 217-244 bytes per node for Relu, Sigmoid, HardSigmoid,
Tanh, Softmax, LogSoftmax, Identity and Reshape, 0-57 (the RSS counters' page-granular noise) for 24 op types that
write a buffer of their own, Conv, MatMul, Add and Where among them; a Relu in place after an Exp kept 307 per Relu
(3 processes), one whose input is read again 53 (docs/measurements.md). Other runtimes and providers keep nothing
counted here: OpenVINO (measured the same way, 3 processes: 0 KiB kept by chains of 2000 Relu, Add or Reshape, 28-32
by Conv at 500 and 2000 alike) and a GPU provider (its per-node state would be in host memory, not the device's; not
measured).

Per session, onnxruntime's CPU provider keeps the stack its intra-op worker threads touched: each session has its own
pool of (intra-op threads - 1) workers (the caller is the last thread), every one with an 8 MiB stack mapping of which
a GEMM slice run on the worker touches SGEMM_STACK_BYTES (MLAS packs a panel of A, 12 x 128 floats, and one of B,
128 x 128 floats, on the stack: 70 KiB and the frames), resident from then on: a stack never shrinks. MLAS splits
each GEMM of a batch (`MlasGemmBatch`: a MatMul whose B has batch dimensions) over one thread per
`workspace.THREAD_COMPLEXITY` multiply-adds, at least one, and hands the batch's slices to the pool, so that a batch
of small GEMMs reaches every thread; it packs no B that onnxruntime prepacked at load (a MatMul's or Gemm's
initializer). Measured on t5_encoder's training step (dynamo, 256 rows) at its minimum, one session per node with 2
threads: each MatMul and Gemm that ran a slice on the worker grew its stack mapping by 72 KiB, no other node type by
more than 12 KiB; the caller's own stack is touched once per process (the measurement's throwaway run). A chain of 40
MatMuls of [2, 4, 16, 16] activations (a batch of 8 GEMMs of 4 Ki multiply-adds, as in the attention of a tiny
transformer) kept 72-76 KiB with 2 threads in 4 of 5 fresh processes, 0-4 with one; whether the worker takes a slice
before the caller has run them all is a race, so a process may keep none.

Nothing is counted for glibc's main heap: `measure_devices` gives its free pages back and holds its free chunks
before the run that learns what is kept, with no top pad, so a run's blocks of a page or more are mapped on their own
and its smaller ones grow the heap by what they need while they live (`sizes.HEAP_TENSOR_BYTES`); what the first run
then leaves beside the terms above is 0-8 KiB (docs/measurements.md, "The heap's holes").
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

import onnx_ir as ir

from onnx_remat.core.devices import Device
from onnx_remat.passes.aliasing import shared_buffers
from onnx_remat.passes.manager import name_of
from onnx_remat.passes.sizes import TensorInfo
from onnx_remat.passes.workspace import gemm_threads

SHARED_BUFFER_BYTES = 223
"""onnxruntime CPU: bytes kept per node writing into its input's buffer (the median over the eight op types)."""
SGEMM_STACK_BYTES = 72 * 1024
"""onnxruntime CPU: stack bytes an intra-op worker thread keeps touched after its first GEMM slice."""


def kept_per_shared_buffer(device: Device) -> int:
    """Bytes `device`'s runtime keeps for each node writing into its input's buffer, after its first run."""
    return SHARED_BUFFER_BYTES if _onnxruntime_cpu(device) else 0


def kept_per_session(device: Device, nodes: Iterable[ir.Node], infos: dict[str, TensorInfo]) -> int:
    """Bytes `device`'s runtime keeps for a session running `nodes`, after its first run: the stacks of the intra-op
    worker threads that MLAS runs slices of its packing GEMMs on."""
    if not _onnxruntime_cpu(device):
        return 0
    threads = intra_op_threads(device)
    busiest = max((packing_gemm_threads(node, infos, threads) for node in nodes), default=0)
    return max(busiest - 1, 0) * SGEMM_STACK_BYTES


def packing_gemm_threads(node: ir.Node, infos: dict[str, TensorInfo], threads: int) -> int:
    """Threads of a pool of `threads` that MLAS runs slices of the node's GEMMs on, where it packs B on the stack (0
    for a node that packs none): each GEMM of its batch split over `workspace.gemm_threads` of its multiply-adds
    (rounded up to whole threads per GEMM, as `MlasGemmBatch` does), all the batch's slices handed to the pool."""
    gemm = packing_gemm(node, infos)
    if gemm is None:
        return 0
    multiply_adds, batch = gemm
    per_gemm = -(-gemm_threads(multiply_adds, threads) // batch)
    return min(per_gemm * batch, threads)


def packing_gemm(node: ir.Node, infos: dict[str, TensorInfo]) -> tuple[int, int] | None:
    """(multiply-adds of one GEMM, GEMMs in the batch) of a node whose MLAS SGEMM packs its B on the stack, else
    None: a Conv (B is its im2col matrix), a ConvTranspose, a MatMul or Gemm whose B is not an initializer. A MatMul
    whose B has batch dimensions is a batch of GEMMs; one whose B is a matrix, A's rows flattened into one."""
    names = [name_of(value) for value in [*node.inputs[:2], *node.outputs[:1]]]
    if len(names) < 3 or any(name not in infos for name in names):
        return None
    a, b, out = (infos[name] for name in names)
    if node.op_type == "Conv":
        return out.numel * math.prod(b.shape[1:]), 1
    if node.op_type == "ConvTranspose":
        return a.numel * math.prod(b.shape[1:]), 1
    weight = node.inputs[1]
    if node.op_type in ("MatMul", "Gemm") and a.shape and weight is not None and not weight.is_initializer():
        transposed = node.op_type == "Gemm" and node.attributes.get_int("transA", 0) == 1
        batch = math.prod(out.shape[:-2]) if node.op_type == "MatMul" and len(b.shape) > 2 else 1
        return out.numel // max(batch, 1) * a.shape[0 if transposed else -1], max(batch, 1)
    return None


def intra_op_threads(device: Device) -> int:
    """The threads of an onnxruntime session's intra-op pool: the device's, else onnxruntime's default, one per
    physical core."""
    return device.threads or physical_cores()


def physical_cores() -> int:
    """This machine's physical CPU cores (distinct package and core ids in sysfs; the logical CPUs without them)."""
    topologies = Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology")
    cores = {((t / "physical_package_id").read_text(), (t / "core_id").read_text()) for t in topologies}
    return len(cores) or os.cpu_count() or 1


def _onnxruntime_cpu(device: Device) -> bool:
    return device.runtime == "onnxruntime" and device.provider == "CPUExecutionProvider"


def sharing_nodes(nodes: Iterable[ir.Node], graph_outputs: set[str]) -> set[ir.Node]:
    """The nodes, run in their order, that write into their input's buffer (aliasing.shared_buffers)."""
    nodes = list(nodes)
    owner = shared_buffers(nodes, graph_outputs)
    return {node for node in nodes if node.outputs and name_of(node.outputs[0]) in owner}
