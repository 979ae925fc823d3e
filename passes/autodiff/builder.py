"""Build the training graph: forward in training mode, loss, backward nodes, and `grad.<param>` outputs; on onnx-ir,
as the functional pass BuildTrainingStep."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from onnx_remat.core.errors import ModelError, UsageError
from onnx_remat.passes.autodiff.emitter import Emitter, Names
from onnx_remat.passes.autodiff.graph_info import GraphInfo
from onnx_remat.passes.autodiff.loss import LOSS, add_loss
from onnx_remat.passes.autodiff.optimizer import add_sgd, check_optimizer, updated_name
from onnx_remat.passes.autodiff.reverse import (
    Reverse,
    differentiated_reads,
    refuse_ruleless,
    requiring,
    ruleless,
)
from onnx_remat.passes.autodiff.rules import RULES
from onnx_remat.passes.autodiff.training_form import (
    infer,
    ir_version_for,
    make_trainable,
    reject_training,
    training_form_copy,
)
from onnx_remat.passes.autodiff.unroll_loops import unroll_scans, unroll_stopping_loops
from onnx_remat.passes.autodiff.unroll_rnn import RECURRENT_OPS, unroll_recurrences
from onnx_remat.passes.expand_functions import defined_body, expand_nodes, model_opset
from onnx_remat.passes.manager import named, without_weights
from onnx_remat.passes.shapes import WEIGHT_BYTES

GRAD_PREFIX = "grad."


@dataclass(frozen=True)
class TrainingGraph:
    """The training model and how its backward nodes belong to forward nodes."""

    model: ir.Model
    backward_groups: dict[str, tuple[str, ...]]  # forward node name -> its gradient's node names
    parameters: tuple[str, ...]
    gradients: tuple[str, ...]  # `grad.<param>`, in the order of `parameters`
    running_stats: tuple[str, ...] = ()  # BatchNormalization running mean/var outputs
    loss: str = LOSS
    updates: tuple[str, ...] = ()  # `<param>.updated` after the optimizer step, in the order of `parameters`


class BuildTrainingStep(ir.passes.FunctionalPass):
    """The training step of a forward model (`build_training_graph`) as a new model; `backward_groups` are its
    gradient nodes' names by forward node after a call. Requires a forward-only model; ensures the step passes the
    ONNX checker."""

    def __init__(self, loss: str = "mse", freeze: Iterable[str] = (), optimizer: str | None = None,
                 lr: float = 0.01) -> None:
        super().__init__()
        check_optimizer(optimizer, lr)
        self.loss, self.freeze, self.optimizer, self.lr = loss, tuple(freeze), optimizer, lr
        self.backward_groups: dict[str, tuple[str, ...]] = {}

    def requires(self, model: ir.Model) -> None:
        reject_training(model)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        step = build_training_graph(model, self.loss, self.freeze, self.optimizer, self.lr)
        self.backward_groups = step.backward_groups
        return ir.passes.PassResult(step.model, modified=True)

    def ensures(self, model: ir.Model) -> None:
        onnx.checker.check_model(without_weights(model, WEIGHT_BYTES), full_check=True)


@dataclass(frozen=True)
class _GradientPaths:
    """Which tensors carry gradients and which nodes the backward pass visits."""

    parameters: tuple[ir.Value, ...]
    requires: frozenset[ir.Value]  # tensors that depend on a parameter through differentiable inputs
    active: frozenset[ir.Node]  # forward nodes between a parameter and the loss


def build_training_graph(model: ir.Model, loss: str = "mse", freeze: Iterable[str] = (),
                         optimizer: str | None = None, lr: float = 0.01) -> TrainingGraph:
    """A copy of `model` with a loss appended and its gradient w.r.t. every trainable float initializer, in standard
    ops of the model's opset; with `optimizer="sgd"` also each parameter's updated value
    `<param>.updated = param - lr * grad.<param>`."""
    check_optimizer(optimizer, lr)
    model = training_form_copy(model)
    if any(n.op_type in RECURRENT_OPS for n in model.graph):
        unroll_recurrences(model, infer(model))
    if any(n.op_type == "Scan" for n in model.graph):
        unroll_scans(model, infer(model))
    if any(n.op_type == "Loop" for n in model.graph):
        unroll_stopping_loops(model)
    frozen = _frozen(model, freeze)
    stats = make_trainable(model)
    add_loss(model, loss, _loss_info(model))
    info = infer(model)
    while expansions := _ruleless_bodies(model, info, frozen):
        expand_nodes(model, expansions)
        info = infer(model)
    paths = _gradient_paths(model, info, frozen)
    backward = _Backward(model, info, paths)
    backward.run()
    gradients = _finish(model, info, stats, paths.parameters, backward)
    updates: tuple[str, ...] = ()
    if optimizer == "sgd":
        backward.add_steps(add_sgd(model.graph, paths.parameters, gradients, lr))
        updates = tuple(updated_name(named(p)) for p in paths.parameters)
    model.ir_version = ir_version_for(model)
    groups = {name: tuple(nodes) for name, nodes in backward.groups.items()}
    return TrainingGraph(model, groups, tuple(named(p) for p in paths.parameters), tuple(named(g) for g in gradients),
                         tuple(named(s) for s in stats), updates=updates)


def _frozen(model: ir.Model, freeze: Iterable[str]) -> frozenset[str]:
    """The initializers not to train; UsageError for names that are not initializers."""
    frozen = frozenset(freeze)
    unknown = sorted(frozen - set(model.graph.initializers))
    if unknown:
        raise UsageError(f"cannot freeze {', '.join(unknown)}: not initializers of the model")
    return frozen


def _grad_name(param: ir.Value) -> str:
    return f"{GRAD_PREFIX}{named(param)}"


def _differentiable(node: ir.Node, requires: set[ir.Value] | frozenset[ir.Value]) -> list[ir.Value]:
    """The node's operands that carry a gradient into it (for an op without a rule every value it reads: a Loop's
    subgraph's outer reads too, so that one on a gradient path is named as having no rule)."""
    return [value for value in differentiated_reads(RULES, node) if value in requires]


def _loss(model: ir.Model) -> ir.Value:
    """The graph output `loss` add_loss appended."""
    return next(output for output in model.graph.outputs if output.name == LOSS)


@dataclass(frozen=True)
class _Walk:
    """The unfrozen float initializers, the tensors that depend on them, those the loss depends on, and the nodes
    between them."""

    candidates: list[ir.Value]
    requires: set[ir.Value]
    reaches: set[ir.Value]
    active: set[ir.Node]


def _loss_info(model: ir.Model) -> GraphInfo:
    """What the loss reads of the model, its first output's shape: as the model has it where resolved already (as
    `prepare` leaves it: a whole inference fewer, 0.07 CPU s on DenseNet-121), else inferred."""
    shape = model.graph.outputs[0].shape if model.graph.outputs else None
    return GraphInfo(model) if shape is not None and shape.is_static() else infer(model)


def _walk(model: ir.Model, info: GraphInfo, frozen: frozenset[str]) -> _Walk:
    """Walk forward from the trainable initializers and back from the loss."""
    graph = model.graph
    candidates = [v for name, v in graph.initializers.items() if info.is_float(v) and name not in frozen]
    requires = requiring(RULES, info, list(graph), set(candidates))
    reaches, active = {_loss(model)}, set()
    for node in reversed(graph):
        if any(o in reaches and o in requires for o in node.outputs):
            active.add(node)
            reaches |= set(_differentiable(node, requires))
    return _Walk(candidates, requires, reaches, active)


DIFFERENTIATED_AS_BODY = frozenset({"Attention", "RotaryEmbedding"})
"""Ops without a rule of their own whose ONNX function body (opset 23's) is differentiated instead: standard math
with rules. Not every op with a body: Bernoulli's would hide a random op behind a Cast that passes no gradient."""


def _ruleless_bodies(model: ir.Model, info: GraphInfo,
                     frozen: frozenset[str]) -> list[tuple[ir.Node, onnx.FunctionProto]]:
    """The nodes of DIFFERENTIATED_AS_BODY on a gradient path, with their function bodies."""
    opset, active = model_opset(model), _walk(model, info, frozen).active
    return [(node, body) for node in model.graph
            if node in active and node.op_type in DIFFERENTIATED_AS_BODY
            and (body := defined_body(node, opset)) is not None]


def _gradient_paths(model: ir.Model, info: GraphInfo, frozen: frozenset[str]) -> _GradientPaths:
    """Find the trainable parameters and the nodes on their paths to the loss; ModelError if none or no rule."""
    graph = model.graph
    walk = _walk(model, info, frozen)
    candidates, requires, reaches, active = walk.candidates, walk.requires, walk.reaches, walk.active
    missing: dict[str, str] = {}  # op type -> the first node of that type
    for node in graph:
        if node in active and (op := ruleless(RULES, node)) is not None:
            missing.setdefault(op, named(node))
    refuse_ruleless(missing)
    parameters = tuple(p for p in candidates if p in reaches)
    _refuse_integer_paths(model, info, candidates, parameters, requires)
    if not parameters:
        raise ModelError(f"no trainable parameters: none of the {len(candidates)} unfrozen float initializers "
                         "reaches the loss through floating-point tensors (all frozen, or an integer-only path?)")
    return _GradientPaths(parameters, frozenset(requires), frozenset(active))


def _refuse_integer_paths(model: ir.Model, info: GraphInfo, candidates: list[ir.Value],
                          parameters: tuple[ir.Value, ...], requires: set[ir.Value]) -> None:
    """ModelError for parameters whose values reach the loss only through integer or boolean tensors (a Cast
    to int, an ArgMax): they would silently get no gradient. Paths through NO_GRADIENT's ops (Shape, a random
    draw) do not count."""
    values: set[ir.Value] = {_loss(model)}
    for node in reversed(model.graph):
        if not any(o in values for o in node.outputs):
            continue
        values |= set(differentiated_reads(RULES, node))
    stranded = [named(p) for p in candidates if p in values and p not in parameters]
    if not stranded:
        return
    casts = [named(n) for n in model.graph if any(i in requires for i in n.inputs)
             and any(o in values and not info.is_float(o) for o in n.outputs)]
    names = ", ".join(stranded[:3]) + (f" and {len(stranded) - 3} more" if len(stranded) > 3 else "")
    where = f" (at node {casts[0]!r})" if casts else ""
    subject = f"parameters {names} reach" if len(stranded) > 1 else f"parameter {names} reaches"
    raise ModelError(f"an integer-only path has no gradient: {subject} the loss only through integer "
                     f"tensors{where}: keep that path in floating point, or --freeze those parameters")


class _Backward(Reverse):
    """Walks the forward nodes in reverse, emitting each one's gradient nodes as its own group."""

    def __init__(self, model: ir.Model, info: GraphInfo, paths: _GradientPaths) -> None:
        super().__init__(RULES, info, paths.requires)
        graph = model.graph
        self.forward = list(graph)
        self.loss = _loss(model)
        self.paths = paths
        taken = {named(n) for n in self.forward} | {v.name for n in self.forward for v in [*n.inputs, *n.outputs]
                                                     if v is not None and v.name}
        taken |= {v.name for v in [*graph.inputs, *graph.outputs] if v.name} | set(graph.initializers)
        self.names = Names(taken)
        self.nodes: list[ir.Node] = []
        self.groups: dict[str, list[str]] = {}
        self.gradients: dict[ir.Value, ir.Value] = {}  # parameter -> its complete gradient `grad.<param>`
        self.last_use = self._last_uses()

    def _last_uses(self) -> dict[str, list[ir.Value]]:
        """Forward node name -> the parameters whose gradient is complete once that node's gradient is emitted."""
        done: dict[str, list[ir.Value]] = defaultdict(list)
        seen: set[ir.Value] = set()
        for node in self.forward:
            if node not in self.paths.active:
                continue
            for param in _differentiable(node, self.paths.requires):
                if param in self.paths.parameters and param not in seen:
                    seen.add(param)
                    done[named(node)].append(param)
        return done

    def emitter(self, owner: str, dtype: np.dtype) -> Emitter:
        """An emitter whose nodes join `owner`'s backward group."""
        self.groups.setdefault(owner, [])
        return Emitter(self.info, self.names, owner, self.nodes, dtype)

    def run(self) -> None:
        """Seed d loss = 1 and emit every active node's gradient in reverse order."""
        loss_node = self.loss.producer()
        if loss_node is None:
            raise ModelError(f"the loss {LOSS!r} is no node's output")
        e = self.emitter(named(loss_node), self.info.np_dtype(self.loss))
        self.contribute(self.loss, e.scalar(1.0))
        self._record(e, 0)
        for node in reversed(self.forward):
            if node in self.paths.active:
                self._visit(node)

    def _visit(self, node: ir.Node) -> None:
        """Emit one node's gradient, then complete the parameters it was the first user of."""
        start = len(self.nodes)
        e = self.emitter(named(node), self.info.np_dtype(self.carrying(node)[0]))
        self.differentiate(e, node)
        for param in self.last_use.get(named(node), []):
            self._complete(e, param)
        self._record(e, start)

    def add_steps(self, steps: dict[str, list[str]]) -> None:
        """Put each parameter's optimizer nodes in the group of the forward node that completes its gradient."""
        owner = {named(param): node for node, params in self.last_use.items() for param in params}
        for param, names in steps.items():
            self.groups[owner[param]].extend(names)

    def _record(self, e: Emitter, start: int) -> None:
        self.groups[e.owner].extend(named(n) for n in self.nodes[start:])

    def _complete(self, e: Emitter, param: ir.Value) -> None:
        """Make the parameter's summed gradient the tensor `grad.<param>`, renaming in place when safe."""
        parts = self.partial.pop(param)
        grad = parts[0]
        producer = grad.producer()
        if len(parts) > 1:
            grad = e.op("Sum", *parts)
        elif producer is None or producer not in self.nodes or self.handed[grad] > 1 or grad.uses():
            grad = e.op("Identity", grad)
        grad.name = _grad_name(param)
        self.gradients[param] = grad


def _finish(model: ir.Model, info: GraphInfo, stats: Sequence[ir.Value], params: tuple[ir.Value, ...],
            backward: _Backward) -> list[ir.Value]:
    """Append the backward nodes and the outputs (forward, running stats, loss, gradients typed like their
    parameters); the gradients, in the order of `params`."""
    graph = model.graph
    graph.extend(backward.nodes)
    gradients = [backward.gradients[p] for p in params]
    for param, grad in zip(params, gradients, strict=True):
        grad.dtype, grad.shape = info.dtype(param), ir.Shape(info.shape(param))
    forward = [o for o in graph.outputs if o is not backward.loss]
    outputs = [*forward, *(s for s in stats if s not in forward), backward.loss, *gradients]
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    return gradients
