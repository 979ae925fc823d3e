"""Transient memory an operator holds while it runs, beyond its inputs and outputs.

The model is onnxruntime's CPU kernels for float tensors on x86-64 (MLAS), read from their sources
and checked against measured peaks of single-node graphs (passes/measure.py). What counts is memory
the kernel touches (resident pages), not what it allocates:
- Conv: MlasConvPrepare's working buffer. None for a pointwise convolution (1x1, stride 1, no pad);
  the whole im2col matrix (OutputSize x K floats) when there are more filters than output pixels;
  else one 128x128 float panel per working thread. With batch or groups > 1 MLAS allocates
  OutputSize x max(K, filters) floats per thread but fills only one panel of it: measured 0 to
  threads x 64 KiB, not the 9-36 MiB allocated for a batch-4 64-channel 64x64 Conv.
- ConvTranspose: the col2im matrix, (filters x kernel) x input pixels floats, fully written.
- Where: the X picks and the Y picks, then merged into the output: each the broadcast of the condition with its
  operand, so two output-sized temporaries with a full condition or two full operands (measured 3x the output), one
  for a broadcast condition and a scalar operand (a masked fill: measured 1.95x, and 2.95x with a full condition).
- Einsum (einsum_compute_preprocessor, einsum_typed_compute_processor): letters ordered by first appearance; an
  operand not in that order is transposed into it; letters only one operand has, and no later operand or the output,
  are summed away first (ReduceSum); each pair then multiplies through a batched MatMul: the left operand transposed
  to (kept shared, left-only, summed) when it is not already, the right operand always copied (transposed to (kept
  shared, summed, right-only) or as it is), the product a temporary of its own, transposed once more when its order
  differs from the output's (or, before the last pair, from the letter order), then copied into the output. Each is a
  tensor of its own, all held until the node ends: measured within 0.3-3% for two operands (Mamba-2's chunked scan,
  attention forms, `ij,jk->ik` with either operand transposed or the output transposed). Three operands measured
  55% of this sum (`ij,jk,kl->il`: the first pair's copies are freed before the second): an overestimate.
- ScatterElements: its indices copied to an int64 vector: measured 4 MiB beside the output for 512 Ki indices.
- LSTM, GRU (DeepCPU kernels): every step's gate pre-activations (4 or 3 x hidden per row and step), a few
  row x hidden state buffers and the sequence lengths per direction; a reverse direction also copies its input and
  output reversed; the final states the node is not asked for (PyTorch's dynamo export asks for Y alone) are
  written into buffers of its own. Each buffer is allocated on its own (whole pages). Measured within 2-5% for batch
  2048-4096, 6-12 steps, hidden 16-32, one and two directions; the dynamo-exported LSTM and GRU of the real-model
  matrix (2048 rows) measured 76-116 KiB under their prediction alone, 140-250 KiB over it before the final states.
- Sum, Mean, Max, Min of three or more inputs: one output-sized temporary for the running result (measured 1.9x
  the output for 3-6 inputs, with or without broadcasting; none for two).
- HardSwish: onnxruntime has no kernel for it and runs its function body, HardSigmoid then Mul, whose HardSigmoid
  output is an output-sized temporary (measured 7.9 MiB for a 4 MiB output; HardSigmoid alone 3.9 MiB). `prepare`
  expands HardSwish into those nodes (passes/expand_functions.py), so no problem has one; the rule serves the
  prediction of a model read as written (measure.predicted_activation_peak: tools/measure_memory.py, `run`).
- If: the tensors its larger branch computes, each while it is live in the branch (passes/branch_memory.py); a
  training step's backward If recomputes its branch inside.
- MatMul with batch dimensions: per GEMM of the batch, onnxruntime's MatMulComputeHelper keeps the offsets of A, B and
  the output (three vectors of size_t) and hands MLAS one MLAS_SGEMM_DATA_PARAMS (64 bytes): 88 bytes per GEMM, measured
  80-90 beside the output for 1024-8192 matrix-vector products (Mixtral's experts gathered per token: 1024).
- MatMul without batch dimensions, Gemm (constant or activation B), pooling, reductions, other element-wise ops: none
  measured (packing panels live on the stack; constant weights are prepacked at load time and count as resident).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnx_remat.passes.branch_memory import if_branch_bytes
from onnx_remat.passes.einsum_terms import explicit_terms
from onnx_remat.passes.manager import name_of
from onnx_remat.passes.sizes import TensorInfo, allocated_bytes

FLOAT_BYTES = 4
INDEX_BYTES = 8  # int64
INT32_BYTES = 4
SGEMM_PARAMS_BYTES = 64  # sizeof(MLAS_SGEMM_DATA_PARAMS): pointers and leading dimensions of A, B, C, alpha, beta
OFFSET_BYTES = 8  # size_t: one offset into A, B or the output per GEMM of a batched MatMul
PANEL_FLOATS = 128 * 128  # MLAS_SGEMM_STRIDEN * MLAS_SGEMM_STRIDEK: a thread's GEMM panel
THREAD_COMPLEXITY = 64 * 1024  # MLAS_SGEMM_THREAD_COMPLEXITY: multiply-adds worth one more thread
MAX_THREADS = 16  # MLAS_MAXIMUM_THREAD_COUNT
VARIADIC_OPS = frozenset({"Sum", "Mean", "Max", "Min"})
INLINED_OPS = frozenset({"HardSwish"})
"""Ops onnxruntime's CPU provider runs as their function body, with one output-sized intermediate."""
RECURRENT_GATES = {"LSTM": 4, "GRU": 3}
"""Per recurrent op: gate pre-activations per hidden unit and step, per direction."""
RECURRENT_FINAL_STATES = {"LSTM": 2, "GRU": 1}
"""Per recurrent op: its final-state outputs after Y (Y_h and Y_c; Y_h)."""


def workspace_bytes(node: ir.Node, infos: dict[str, TensorInfo], threads: int = 1) -> int:
    """Scratch bytes of one node in onnxruntime's CPU kernels with `threads` intra-op threads."""
    names = [name_of(value) for value in (*node.inputs[:2], node.outputs[0])]
    if node.domain not in ("", "ai.onnx") or not all(name in infos for name in names):
        return 0
    if node.op_type == "Conv":
        return FLOAT_BYTES * _conv_floats(node, infos, threads)
    if node.op_type == "ConvTranspose":
        return FLOAT_BYTES * _conv_transpose_floats(node, infos)
    if node.op_type == "Where":
        return _where_picks_bytes(node, infos)
    if node.op_type == "Einsum":
        return _einsum_bytes(node, infos)
    if node.op_type == "MatMul":
        return _matmul_batch_bytes(infos[name_of(node.outputs[0])])
    if node.op_type == "ScatterElements":
        return INDEX_BYTES * math.prod(infos[name_of(node.inputs[1])].shape)
    if node.op_type in VARIADIC_OPS and len([value for value in node.inputs if value is not None]) >= 3:
        return infos[name_of(node.outputs[0])].allocated_bytes
    if node.op_type in INLINED_OPS:
        return infos[name_of(node.outputs[0])].allocated_bytes
    if node.op_type in RECURRENT_GATES:
        return _recurrent_bytes(node, infos)
    if node.op_type == "If":
        return if_branch_bytes(node, infos)
    return 0


def _matmul_batch_bytes(output: TensorInfo) -> int:
    """Bytes of a batched MatMul's per-GEMM vectors: the offsets of A, B and the output, the GEMM parameters for MLAS
    (none without a batch)."""
    gemms = math.prod(output.shape[:-2])
    if gemms <= 1:
        return 0
    return allocated_bytes(SGEMM_PARAMS_BYTES * gemms) + 3 * allocated_bytes(OFFSET_BYTES * gemms)


def _einsum_bytes(node: ir.Node, infos: dict[str, TensorInfo]) -> int:
    """Bytes of the tensors onnxruntime's Einsum makes on the way (module docstring), each on its own pages."""
    if any(name_of(value) not in infos for value in node.inputs):
        return 0
    operands = [infos[name_of(value)] for value in node.inputs]
    output = infos[name_of(node.outputs[0])]
    terms, out = explicit_terms(node.attributes.get_string("equation", ""), [len(info.shape) for info in operands])
    sizes = {letter: size for term, info in zip(terms, operands, strict=True)
             for letter, size in zip(term, info.shape, strict=True)}
    order = "".join(dict.fromkeys("".join(terms)))

    def tensor(letters: str) -> int:
        return TensorInfo(tuple(sizes[letter] for letter in letters), output.elem_type).allocated_bytes

    def ordered(letters: set[str] | str) -> str:
        return "".join(letter for letter in order if letter in letters)

    temporaries = [tensor(term) for term in terms if term != ordered(term)]
    result = _einsum_summed(ordered(terms[0]), set(out).union(*terms[1:]), tensor, temporaries)
    for index, term in enumerate(terms[1:], start=1):
        needed = set(out).union(*terms[index + 1:])
        right = _einsum_summed(ordered(term), needed | set(result), tensor, temporaries)
        kept = ordered(set(result) & set(right) & needed)
        summed = ordered((set(result) & set(right)) - needed)
        left_only, right_only = ordered(set(result) - set(right)), ordered(set(right) - set(result))
        temporaries += [tensor(result)] * (result != kept + left_only + summed) + [tensor(right)]
        result = kept + left_only + right_only
        temporaries.append(tensor(result))
        target = out if index == len(terms) - 1 else ordered(result)
        if result != target:
            temporaries.append(tensor(result))
            result = target
    if len(terms) == 1 and result != out:
        temporaries.append(output.allocated_bytes)
    return sum(temporaries)


def _einsum_summed(letters: str, needed: set[str], tensor: Callable[[str], int], temporaries: list[int]) -> str:
    """An Einsum operand's letters after the ReduceSum over those nothing after it reads (its temporary appended)."""
    kept = "".join(letter for letter in letters if letter in needed)
    if kept != letters:
        temporaries.append(tensor(kept))
    return kept


def _recurrent_bytes(node: ir.Node, infos: dict[str, TensorInfo]) -> int:
    """Bytes of an LSTM's or GRU's scratch buffers, each allocated on its own (`_recurrent_buffers`)."""
    return sum(allocated_bytes(nbytes) for nbytes in _recurrent_buffers(node, infos))


def _recurrent_buffers(node: ir.Node, infos: dict[str, TensorInfo]) -> list[int]:
    """Byte sizes of the buffers a DeepCPU LSTM or GRU allocates, all held at once (both directions' until the
    node ends): per direction the gates of every step, the state rows and the sequence lengths (int32 per row), the
    reversed input and output for the second direction; for the node, the final states it is not asked for (an
    LSTM's Y_h and Y_c, a GRU's Y_h), which it writes anyway."""
    attrs = node.attributes
    x = infos[name_of(node.inputs[0])].shape
    steps, rows, features = (x[1], x[0], x[2]) if attrs.get_int("layout", 0) else (x[0], x[1], x[2])
    hidden = attrs.get_int("hidden_size", 0)
    directions = 2 if attrs.get_string("direction", "forward") == "bidirectional" else 1
    state = FLOAT_BYTES * rows * hidden
    per_direction = [RECURRENT_GATES[node.op_type] * steps * state, *[state] * _state_buffers(node),
                     INT32_BYTES * rows]
    reversed_copies = [FLOAT_BYTES * steps * rows * features, steps * state] * (directions - 1)
    final_states = [directions * state for index in range(1, RECURRENT_FINAL_STATES[node.op_type] + 1)
                    if len(node.outputs) <= index or not name_of(node.outputs[index])]
    return per_direction * directions + reversed_copies + final_states


def _state_buffers(node: ir.Node) -> int:
    """Buffers of rows x hidden per direction: an LSTM's initial hidden state, previous and clipped cell states; a
    GRU's states, its biases
    repeated per row (four with linear_before_reset, else three) and, with linear_before_reset, the linear output."""
    if node.op_type == "LSTM":
        return 3
    linear_before_reset = bool(node.attributes.get_int("linear_before_reset", 0))
    biases = (4 if linear_before_reset else 3) if len(node.inputs) > 3 and node.inputs[3] is not None else 0
    return 2 + biases + linear_before_reset


def _where_picks_bytes(node: ir.Node, infos: dict[str, TensorInfo]) -> int:
    """A Where's two temporaries: the condition broadcast with X, and with Y."""
    condition, *operands = (infos.get(name_of(value)) for value in node.inputs)
    if condition is None or any(operand is None for operand in operands):
        return 0
    return sum(TensorInfo(tuple(np.broadcast_shapes(condition.shape, operand.shape)), operand.elem_type).allocated_bytes
               for operand in operands if operand is not None)


def _conv_floats(node: ir.Node, infos: dict[str, TensorInfo], threads: int) -> int:
    """Elements of the working buffer MlasConvPrepare asks for."""
    x, w, y = (infos[name_of(value)].shape for value in (node.inputs[0], node.inputs[1], node.outputs[0]))
    attrs = node.attributes
    group = attrs.get_int("group", 1)
    kernel = w[2:]
    k = (x[1] // group) * math.prod(kernel)
    output_size, filters = math.prod(y[2:]), w[0] // group
    strides_one = all(s == 1 for s in attrs.get_ints("strides", [1]))
    unpadded = attrs.get_string("auto_pad", "NOTSET") in ("NOTSET", "VALID")
    no_padding = unpadded and all(p == 0 for p in attrs.get_ints("pads", [0]))
    if strides_one and no_padding and math.prod(kernel) == 1:
        return 0
    if filters > output_size:
        return output_size * k
    if x[0] > 1 or group > 1:
        return min(threads, x[0] * group) * PANEL_FLOATS
    return gemm_threads(filters * output_size * k, threads) * PANEL_FLOATS


def gemm_threads(complexity: int, threads: int) -> int:
    """Threads MLAS splits a GEMM (or a convolution) over: one per THREAD_COMPLEXITY multiply-adds, capped."""
    return max(1, min(complexity // THREAD_COMPLEXITY + 1, MAX_THREADS, threads))


def _conv_transpose_floats(node: ir.Node, infos: dict[str, TensorInfo]) -> int:
    """Elements of ConvTranspose's col2im buffer (reused across images and groups)."""
    x, w = infos[name_of(node.inputs[0])].shape, infos[name_of(node.inputs[1])].shape
    return w[1] * math.prod(w[2:]) * math.prod(x[2:])
