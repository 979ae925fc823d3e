"""Load and validate an ONNX model: readable with its external weights, checker-clean; then, in onnx-ir, its
nodes named and its input shapes fixed by in-place passes whose requires/ensures state what they need and give."""

from __future__ import annotations

import functools
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_remat.core.errors import ModelError, UsageError, one_line
from onnx_remat.passes.manager import named, root_cause, run_passes
from onnx_remat.passes.model_files import read_model
from onnx_remat.passes.sequences import SequenceReadsToSlices


def load_model(source: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """Read a model from a path, external weights included (or take a ModelProto), and run the ONNX checker on it
    (on the file when there is one: faster, and it holds models beyond protobuf's 2 GiB)."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        name = "the model"
    else:
        name = str(source)
        model = read_model(Path(source))
    if not model.graph.node:
        raise ModelError(f"{name} has no nodes: is it an ONNX model file?")
    try:
        onnx.checker.check_model(model if isinstance(source, onnx.ModelProto) else str(source))
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise ModelError(f"{name} fails the ONNX checker: {one_line(exc)}") from None
    _refuse_unrunnable_opset(model, name)
    _refuse_negative_dimensions(model, name)
    return model


def _refuse_negative_dimensions(model: onnx.ModelProto, name: str) -> None:
    """ModelError for a declared dimension below zero (the checker lets it through; sizes would come out negative)."""
    graph = model.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim if d.HasField("dim_value")]
        if any(size < 0 for size in dims):
            raise ModelError(f"{name} declares tensor {value.name!r} with a negative dimension {dims}: "
                             "fix the model's shapes")


def _refuse_unrunnable_opset(model: onnx.ModelProto, name: str) -> None:
    """ModelError if onnxruntime cannot run the model's default-domain opset."""
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if version and not _onnxruntime_runs_opset(version):
        raise ModelError(f"{name} uses ai.onnx opset {version}, newer than onnxruntime {_onnxruntime_version()} "
                         "runs: export it at an older opset or upgrade onnxruntime")


@functools.cache
def _onnxruntime_runs_opset(version: int) -> bool:
    """Whether onnxruntime loads a one-node model at this opset (it states its range nowhere else)."""
    import onnxruntime as ort

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [x],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", version)])
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime raises its own exception types for an unknown opset
        return False
    return True


def _onnxruntime_version() -> str:
    import onnxruntime as ort

    return ort.__version__


class FixInputShapes(ir.passes.InPlacePass):
    """Give graph inputs the shapes asked for. Requires every name asked for to be a graph input; ensures every
    graph input has a concrete shape with no empty dimension (sizes downstream follow from these)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        self.shapes = shapes

    def requires(self, model: ir.Model) -> None:
        inputs = _graph_inputs(model.graph)
        for name in self.shapes:
            if name not in inputs:
                raise UsageError(f"--input-shape names {name!r}, but the model's inputs are {', '.join(inputs)}")

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        inputs = _graph_inputs(model.graph)
        for name, shape in self.shapes.items():
            _set_shape(inputs[name], shape)
        return ir.passes.PassResult(model, modified=bool(self.shapes))

    def ensures(self, model: ir.Model) -> None:
        for name, value in _graph_inputs(model.graph).items():
            dims = _dims(value)
            symbolic = [d.value or "?" for d in dims if not isinstance(d, int)]
            if symbolic:
                example = "x".join(str(d) if isinstance(d, int) else "1" for d in dims)
                raise ModelError(f"input {name!r} has symbolic dimensions ({', '.join(symbolic)}): "
                                 f"fix them with --input-shape {name}={example}")
            if 0 in dims:
                who = "--input-shape gives" if name in self.shapes else "the model gives"
                raise ModelError(f"{who} input {name!r} an empty shape {'x'.join(map(str, dims))}: give every "
                                 f"dimension a size above zero with --input-shape {name}=...")


def _graph_inputs(graph: ir.Graph) -> dict[str, ir.Value]:
    """The graph's inputs that are not initializers, by name."""
    return {named(value): value for value in graph.inputs if value.name not in graph.initializers}


def _dims(value: ir.Value) -> list[int | ir.SymbolicDim]:
    """The value's dimensions as declared (none when it declares no shape)."""
    return list(value.shape) if value.shape is not None else []


def _set_shape(value: ir.Value, shape: tuple[int, ...]) -> None:
    """Fix `value`'s shape at `shape`; UsageError if that changes its rank or a dimension it fixes."""
    dims = _dims(value)
    if len(dims) != len(shape):
        raise UsageError(
            f"--input-shape gives {value.name!r} {len(shape)} dimensions, but the model declares {len(dims)}"
        )
    for dim, size in zip(dims, shape, strict=True):
        if isinstance(dim, int) and dim != size:
            raise UsageError(
                f"--input-shape sets {value.name!r} to {shape}, but the model fixes that dimension at {dim}"
            )
    value.shape = ir.Shape(shape)


class NameNodes(ir.passes.InPlacePass):
    """Give every unnamed or duplicate-named node of the main graph a unique readable name (`<op>_<index>`): the
    rewrite and the report refer to nodes by name. Ensures the main graph's node names are unique and non-empty.
    Not onnx-ir's NameFixPass: that also names every unnamed value, and an omitted optional output (a Dropout's
    mask) given a name is one the runtime computes and holds."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        used = {node.name for node in model.graph if node.name}
        seen: set[str] = set()
        modified = False
        for index, node in enumerate(model.graph):
            if node.name and node.name not in seen:
                seen.add(node.name)
                continue
            base = node.name or f"{node.op_type}_{index}"
            candidate, k = base, 1
            while candidate in used or candidate in seen:
                candidate, k = f"{base}_{k}", k + 1
            node.name = candidate
            seen.add(candidate)
            used.add(candidate)
            modified = True
        return ir.passes.PassResult(model, modified)

    def ensures(self, model: ir.Model) -> None:
        names = [node.name for node in model.graph]
        if not all(names) or len(set(names)) != len(names):
            raise ValueError("NameNodes left a node unnamed or two nodes with one name")


def read_graph(source: str | Path | onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]]) -> ir.Model:
    """The model read and checked (`load_model`) into onnx-ir, with its sequence reads turned into slices, every
    node named and its input shapes fixed."""
    try:
        model = ir.serde.deserialize_model(load_model(source))
    except ir.serde.SerdeError as exc:
        raise ModelError(f"onnx-ir cannot read the model: {one_line(root_cause(exc))}") from None
    return run_passes(model, [SequenceReadsToSlices(), NameNodes(), FixInputShapes(input_shapes)])
