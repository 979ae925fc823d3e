"""One device's runtime: compile an ONNX model on it, run it on values resident there, move values to and from host.

onnxruntime: a session per model with the device's execution provider and thread count, in file order and with
no graph rewriting (`execute.session_options`), run through an IO binding so inputs and outputs stay on the device;
the binding is cleared after each call, so it holds no value the executor has let go of.
OpenVINO: `core.compile_model` on the device (f32 instead of its bf16 default, latency hint, the device's
INFERENCE_NUM_THREADS). A model is compiled on one device as a whole, so no OpenVINO `affinity` (a HETERO
setting) is needed. A compiled model keeps its intermediate buffers and an infer request its output tensors
between calls; a schedule frees them, so each call runs a fresh request and then releases the compiled model's
intermediate memory: a segment's buffers live only while it runs, its outputs as long as the executor holds them
(a kept request holds them longer: docs/measurements.md). The release costs time, part of the per-call overhead
cost_profiled measures.
Used to profile operators (cost_profiled) and to run multi-device models (run_devices).

`layer_assignment_settings` gives the onnxruntime session option that pins the nodes of a rewritten model to
devices by their `layer_ann` metadata, for running it in a single onnxruntime session with several providers.
"""

from __future__ import annotations

import abc
import functools
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnx_remat.core.devices import Device
from onnx_remat.passes.execute import node_failures_refused, session_options

if TYPE_CHECKING:  # imported where an OpenVINO device runs: 0.15-0.2 s a command on the CPU alone does not need
    import openvino as ov

Values = dict[str, Any]
"""Tensor name -> a value resident on one device (an OrtValue or an ov.Tensor)."""

_KERNEL_TIME = "_kernel_time"  # the suffix of a node's event in onnxruntime's profile
_ORT_MEMORY = {"CUDAExecutionProvider": "cuda"}
# onnxruntime's device designators in `session.layer_assignment_settings`, per execution provider.
_ORT_DESIGNATORS = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "DmlExecutionProvider": "dml"}


class Runtime(abc.ABC):
    """How one device runs a model with resident inputs, and moves tensors to and from host memory."""

    def __init__(self, device: Device):
        self.device = device

    @abc.abstractmethod
    def compile(self, model: onnx.ModelProto) -> Callable[[Values], Values]:
        """`model` compiled on the device: a call from its input values to fresh output values, all resident."""

    @abc.abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """`array` as a value resident on the device."""

    @abc.abstractmethod
    def to_host(self, value: Any) -> np.ndarray:
        """A device value as a numpy array the device may not overwrite."""

    @abc.abstractmethod
    def nbytes(self, value: Any) -> int:
        """The bytes of a device value's data."""

    @abc.abstractmethod
    def node_seconds(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int) -> list[dict[str, float]]:
        """For each of `runs` runs of the whole `model` (after a warm-up run), the seconds each node the runtime
        executed took, by the name the runtime reports: an ONNX node's name, or for a node it made (a reorder, a
        fusion), a name starting with the tensor or node it serves."""

    def prepare(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """A call that runs `model` once on the device, its inputs already there (for timing)."""
        run = self.compile(model)
        values = {name: self.from_host(array) for name, array in feeds.items()}
        return lambda: run(values)


class OnnxRuntime(Runtime):
    """An onnxruntime session per model, run through an IO binding so nothing is copied per run."""

    @property
    def memory(self) -> str:
        return _ORT_MEMORY.get(self.device.provider, "cpu")

    def compile(self, model: onnx.ModelProto) -> Callable[[Values], Values]:
        session = self._session(model, session_options(threads=self.device.threads))
        binding = session.io_binding()
        names = [output.name for output in session.get_outputs()]

        def run(values: Values) -> Values:
            for name, value in values.items():
                binding.bind_ortvalue_input(name, value)
            for name in names:  # bound anew every call: a bound output is otherwise overwritten by the next run
                binding.bind_output(name, self.memory)
            with node_failures_refused():
                session.run_with_iobinding(binding)
            outputs = dict(zip(names, binding.get_outputs(), strict=True))
            binding.clear_binding_inputs()  # the binding would keep inputs and outputs alive until the next call
            binding.clear_binding_outputs()
            return outputs

        return run

    def node_seconds(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int) -> list[dict[str, float]]:
        options = session_options(threads=self.device.threads)
        with tempfile.TemporaryDirectory() as directory:
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(directory) / "profile")
            session = self._session(model, options)
            with node_failures_refused():
                session.run(None, feeds)
            for _ in range(runs):
                session.run(None, feeds)
            events = json.loads(Path(session.end_profiling()).read_text())
        timed = [event for event in events if event.get("cat") == "Node" and event["name"].endswith(_KERNEL_TIME)]
        per_run: list[dict[str, float]] = []
        seen: set[str] = set()
        for event in timed:  # in execution order; a node seen again starts the next run
            name = event["name"].removesuffix(_KERNEL_TIME)
            if not per_run or name in seen:
                per_run.append({})
                seen.clear()
            seen.add(name)
            per_run[-1][name] = event["dur"] * 1e-6
        return per_run[-runs:]

    def _session(self, model: onnx.ModelProto, options: ort.SessionOptions) -> ort.InferenceSession:
        """A session of `model` on the device's provider, without common-subexpression merging (it undoes
        recomputation)."""
        return ort.InferenceSession(model.SerializeToString(), options, providers=[self.device.provider],
                                    disabled_optimizers=["CommonSubexpressionElimination"])

    def from_host(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(array, self.memory, 0)

    def to_host(self, value: ort.OrtValue) -> np.ndarray:
        return np.array(value.numpy())  # numpy() is a view that does not keep a host-backed value alive

    def nbytes(self, value: ort.OrtValue) -> int:
        itemsize = helper.tensor_dtype_to_np_dtype(value.element_type()).itemsize
        return int(np.prod(value.shape(), dtype=np.int64)) * itemsize


class OpenVino(Runtime):
    """An OpenVINO compiled model per model (f32, latency hint, the device's thread limit); every call a fresh infer
    request, the compiled model's intermediate memory released after it (see the module docstring).

    An output value is its request's tensor, alive as long as a reference to it is."""

    def compile(self, model: onnx.ModelProto) -> Callable[[Values], Values]:
        compiled = self._compiled(model, {})
        names = [output.name for output in model.graph.output]

        def run(values: Values) -> Values:
            request = compiled.create_infer_request()
            for name, value in values.items():
                request.set_tensor(name, value)
            request.infer()
            outputs = {name: request.get_tensor(name) for name in names}
            compiled.release_memory()
            return outputs

        return run

    def node_seconds(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int) -> list[dict[str, float]]:
        import openvino as ov

        compiled = self._compiled(model, {"PERF_COUNT": True})
        request = compiled.create_infer_request()
        request.infer(feeds)
        per_run = []
        for _ in range(runs):
            request.infer(feeds)
            per_run.append({info.node_name: info.real_time.total_seconds() for info in request.profiling_info
                            if info.status == ov.ProfilingInfo.Status.EXECUTED})
        return per_run

    def from_host(self, array: np.ndarray) -> ov.Tensor:
        import openvino as ov

        # OpenVINO knows int64 as numpy's `long` only; onnxruntime returns `long long` on Linux.
        return ov.Tensor(np.ascontiguousarray(array).view(np.dtype(array.dtype.str)))

    def _compiled(self, model: onnx.ModelProto, extra: dict[str, Any]) -> ov.CompiledModel:
        """`model` compiled on the device: f32, latency hint, the device's thread limit, and `extra` settings."""
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", **extra}
        if self.device.threads:
            config["INFERENCE_NUM_THREADS"] = self.device.threads
        core = _openvino_core()
        return core.compile_model(core.read_model(model.SerializeToString()), self.device.provider, config)

    def to_host(self, value: ov.Tensor) -> np.ndarray:
        return np.array(value.data)

    def nbytes(self, value: ov.Tensor) -> int:
        return int(value.byte_size)


@functools.cache
def _openvino_core() -> ov.Core:
    import openvino as ov

    return ov.Core()


def runtime_for(device: Device) -> Runtime:
    """The runtime that runs `device`."""
    return OnnxRuntime(device) if device.runtime == "onnxruntime" else OpenVino(device)


def layer_assignment_settings(devices: Sequence[Device]) -> str:
    """onnxruntime's `session.layer_assignment_settings` value that sends the nodes tagged `layer_ann=<name>`
    to each onnxruntime device's provider, e.g. `cpu(=cpu); cuda(=gpu)` (the `=` asks for an exact match).

    onnxruntime (1.32 here) treats it as a preference: a node whose provider lacks a kernel falls back."""
    rules = [
        f"{_ORT_DESIGNATORS[d.provider]}(={d.name})"
        for d in devices if d.runtime == "onnxruntime" and d.provider in _ORT_DESIGNATORS
    ]
    return "; ".join(rules)
