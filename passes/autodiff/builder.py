"""Build the training graph: forward in training mode, loss, backward nodes, and `grad.<param>` outputs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnx_remat.errors import ModelError, UsageError
from onnx_remat.passes.autodiff.emitter import Emitter, Names
from onnx_remat.passes.autodiff.graph_info import GraphInfo
from onnx_remat.passes.autodiff.loss import LOSS, add_loss
from onnx_remat.passes.autodiff.optimizer import add_sgd, check_optimizer, updated_name
from onnx_remat.passes.autodiff.prepare import infer, ir_version_for, make_trainable, prepared_copy
from onnx_remat.passes.autodiff.rules import RULES
from onnx_remat.passes.autodiff.unroll_rnn import RECURRENT_OPS, unroll_recurrences

GRAD_PREFIX = "grad."


@dataclass(frozen=True)
class TrainingGraph:
    """The training model and how its backward nodes belong to forward nodes."""

    model: onnx.ModelProto
    backward_groups: dict[str, tuple[str, ...]]  # forward node name -> its gradient's node names
    parameters: tuple[str, ...]
    gradients: tuple[str, ...]  # `grad.<param>`, in the order of `parameters`
    running_stats: tuple[str, ...] = ()  # BatchNormalization running mean/var outputs
    loss: str = LOSS
    updates: tuple[str, ...] = ()  # `<param>.updated` after the optimizer step, in the order of `parameters`


@dataclass(frozen=True)
class _Plan:
    """Which tensors carry gradients and which nodes the backward pass visits."""

    parameters: tuple[str, ...]
    requires: frozenset[str]  # tensors that depend on a parameter through differentiable inputs
    active: frozenset[str]  # forward nodes between a parameter and the loss


def build_training_graph(model: onnx.ModelProto, loss: str = "mse", freeze: Iterable[str] = (),
                         optimizer: str | None = None, lr: float = 0.01) -> TrainingGraph:
    """Append a loss and its gradient w.r.t. every trainable float initializer, in standard ops of the model's opset;
    with `optimizer="sgd"` also each parameter's updated value `<param>.updated = param - lr * grad.<param>`."""
    check_optimizer(optimizer, lr)
    model = prepared_copy(model)
    if any(n.op_type in RECURRENT_OPS for n in model.graph.node):
        unroll_recurrences(model, infer(model))
    frozen = _frozen(model, freeze)
    stats = make_trainable(model)
    add_loss(model, loss, infer(model))
    info = infer(model)
    plan = _plan(model, info, frozen)
    backward = _Backward(model, info, plan)
    backward.run()
    _finish(model, info, stats, plan.parameters, backward.nodes)
    gradients = tuple(_grad_name(p) for p in plan.parameters)
    updates: tuple[str, ...] = ()
    if optimizer == "sgd":
        backward.add_steps(add_sgd(model.graph, plan.parameters, gradients, lr))
        updates = tuple(updated_name(p) for p in plan.parameters)
    model.ir_version = ir_version_for(model)
    onnx.checker.check_model(model, full_check=True)
    groups = {name: tuple(nodes) for name, nodes in backward.groups.items()}
    return TrainingGraph(model, groups, plan.parameters, gradients, tuple(stats), updates=updates)


def _frozen(model: onnx.ModelProto, freeze: Iterable[str]) -> frozenset[str]:
    """The initializers not to train; UsageError for names that are not initializers."""
    frozen = frozenset(freeze)
    unknown = sorted(frozen - {i.name for i in model.graph.initializer})
    if unknown:
        raise UsageError(f"cannot freeze {', '.join(unknown)}: not initializers of the model")
    return frozen


def _grad_name(param: str) -> str:
    return f"{GRAD_PREFIX}{param}"


def _differentiable(node: onnx.NodeProto, requires: set[str] | frozenset[str]) -> list[str]:
    """The node's inputs that carry a gradient into it (all float inputs for ops without a rule)."""
    rule = RULES.get(node.op_type)
    return [i for pos, i in enumerate(node.input)
            if i in requires and (rule is None or rule.differentiates(pos))]


def _plan(model: onnx.ModelProto, info: GraphInfo, frozen: frozenset[str]) -> _Plan:
    """Find the trainable parameters and the nodes on their paths to the loss; ModelError if none or no rule."""
    candidates = [i.name for i in model.graph.initializer if info.is_float(i.name) and i.name not in frozen]
    requires = set(candidates)
    for node in model.graph.node:
        if _differentiable(node, requires):
            requires |= {o for o in node.output if o and info.is_float(o)}
    reaches, active = {LOSS}, set()
    for node in reversed(model.graph.node):
        if any(o in reaches and o in requires for o in node.output):
            active.add(node.name)
            reaches |= set(_differentiable(node, requires))
    missing: dict[str, str] = {}  # op type -> the first node of that type
    for node in model.graph.node:
        if node.name in active and (node.op_type not in RULES or node.domain not in ("", "ai.onnx")):
            missing.setdefault(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}",
                               node.name)
    if missing:
        listed = "; ".join(f"{op} (e.g. node {name!r})" for op, name in sorted(missing.items()))
        raise ModelError(f"no gradient rule for these op types: {listed}")
    parameters = tuple(p for p in candidates if p in reaches)
    _refuse_integer_paths(model, info, candidates, parameters, requires)
    if not parameters:
        raise ModelError(f"no trainable parameters: none of the {len(candidates)} unfrozen float initializers "
                         "reaches the loss through floating-point tensors (all frozen, or an integer-only path?)")
    return _Plan(parameters, frozenset(requires), frozenset(active))


def _refuse_integer_paths(model: onnx.ModelProto, info: GraphInfo, candidates: list[str],
                          parameters: tuple[str, ...], requires: set[str]) -> None:
    """ModelError for parameters whose values reach the loss only through integer or boolean tensors (a Cast
    to int, an ArgMax): they would silently get no gradient. Shape and Size read no values."""
    values = {LOSS}
    for node in reversed(model.graph.node):
        if node.op_type in ("Shape", "Size") or not any(o in values for o in node.output):
            continue
        rule = RULES.get(node.op_type)
        values |= {i for pos, i in enumerate(node.input) if i and (rule is None or rule.differentiates(pos))}
    stranded = [p for p in candidates if p in values and p not in parameters]
    if not stranded:
        return
    casts = [n.name for n in model.graph.node if any(i in requires for i in n.input)
             and any(o in values and not info.is_float(o) for o in n.output)]
    names = ", ".join(stranded[:3]) + (f" and {len(stranded) - 3} more" if len(stranded) > 3 else "")
    where = f" (at node {casts[0]!r})" if casts else ""
    subject = f"parameters {names} reach" if len(stranded) > 1 else f"parameter {names} reaches"
    raise ModelError(f"an integer-only path has no gradient: {subject} the loss only through integer "
                     f"tensors{where}: keep that path in floating point, or --freeze those parameters")


class _Backward:
    """Walks the forward nodes in reverse, emitting each one's gradient nodes as its own group."""

    def __init__(self, model: onnx.ModelProto, info: GraphInfo, plan: _Plan) -> None:
        self.forward = list(model.graph.node)
        self.info = info
        self.plan = plan
        taken = {n.name for n in self.forward} | {t for n in self.forward for t in [*n.input, *n.output]}
        taken |= {v.name for v in [*model.graph.input, *model.graph.output]} | {i.name for i in model.graph.initializer}
        self.names = Names(taken)
        self.nodes: list[onnx.NodeProto] = []
        self.groups: dict[str, list[str]] = {}
        self.partial: dict[str, list[str]] = defaultdict(list)  # tensor -> gradient contributions
        self.handed: dict[str, int] = defaultdict(int)  # gradient tensor -> times handed out as a contribution
        self.last_use = self._last_uses()

    def _last_uses(self) -> dict[str, list[str]]:
        """Forward node -> the parameters whose gradient is complete once that node's gradient is emitted."""
        done: dict[str, list[str]] = defaultdict(list)
        seen: set[str] = set()
        for node in self.forward:
            if node.name not in self.plan.active:
                continue
            for param in _differentiable(node, self.plan.requires):
                if param in self.plan.parameters and param not in seen:
                    seen.add(param)
                    done[node.name].append(param)
        return done

    def emitter(self, owner: str, dtype: np.dtype) -> Emitter:
        """An emitter whose nodes join `owner`'s backward group."""
        self.groups.setdefault(owner, [])
        return Emitter(self.info, self.names, owner, self.nodes, dtype)

    def run(self) -> None:
        """Seed d loss = 1 and emit every active node's gradient in reverse order."""
        loss_node = next(n for n in self.forward if LOSS in n.output)
        e = self.emitter(loss_node.name, self.info.np_dtype(LOSS))
        self._contribute(LOSS, e.scalar(1.0))
        self._record(e, 0)
        for node in reversed(self.forward):
            if node.name in self.plan.active:
                self._visit(node)

    def _visit(self, node: onnx.NodeProto) -> None:
        """Emit one node's gradient, then complete the parameters it was the first user of."""
        start = len(self.nodes)
        carrying = [o for o in node.output if o and self.partial.get(o)]
        e = self.emitter(node.name, self.info.np_dtype(carrying[0]))
        dys = [self._total(e, o) if o else "" for o in node.output]
        rule = RULES[node.op_type]
        if rule.outputs is not None and any(dys[rule.outputs:]):
            raise ModelError(f"{node.op_type} {node.name!r}: the loss depends on an output whose gradient "
                             f"is not supported (only the first {rule.outputs})")
        needs = [bool(i) and i in self.plan.requires and rule.differentiates(pos) for pos, i in enumerate(node.input)]
        for pos, grad in rule.fn(e, node, dys, needs).items():
            if needs[pos]:
                self._contribute(node.input[pos], grad)
        for param in self.last_use.get(node.name, []):
            self._complete(e, param)
        self._record(e, start)

    def add_steps(self, steps: dict[str, list[str]]) -> None:
        """Put each parameter's optimizer nodes in the group of the forward node that completes its gradient."""
        owner = {param: node for node, params in self.last_use.items() for param in params}
        for param, names in steps.items():
            self.groups[owner[param]].extend(names)

    def _record(self, e: Emitter, start: int) -> None:
        self.groups[e.owner].extend(n.name for n in self.nodes[start:])

    def _contribute(self, tensor: str, grad: str) -> None:
        self.partial[tensor].append(grad)
        self.handed[grad] += 1

    def _total(self, e: Emitter, tensor: str) -> str:
        """The summed gradient of `tensor` ("" if nothing reached it)."""
        parts = self.partial.pop(tensor, [])
        if len(parts) > 1:
            return e.op("Sum", *parts)
        return parts[0] if parts else ""

    def _complete(self, e: Emitter, param: str) -> None:
        """Make the parameter's summed gradient the tensor `grad.<param>`, renaming in place when safe."""
        parts, name = self.partial.pop(param), _grad_name(param)
        if len(parts) > 1:
            e.ops("Sum", parts, 1, outputs=[name])
            return
        grad = parts[0]
        producer = next((n for n in self.nodes if grad in n.output), None)
        if producer is None or self.handed[grad] > 1 or any(grad in n.input for n in self.nodes):
            e.ops("Identity", [grad], 1, outputs=[name])
        else:
            producer.output[list(producer.output).index(grad)] = name


def _finish(model: onnx.ModelProto, info: GraphInfo, stats: list[str], params: tuple[str, ...],
            backward: list[onnx.NodeProto]) -> None:
    """Append the backward nodes and the outputs (typed: forward, running stats, loss, gradients)."""
    graph = model.graph
    graph.node.extend(backward)
    forward = [o.name for o in graph.output if o.name != LOSS]
    names = [*forward, *(s for s in stats if s not in forward), LOSS]
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(n, info.dtype(n), list(info.shape(n))) for n in names)
    graph.output.extend(helper.make_tensor_value_info(_grad_name(p), info.dtype(p), list(info.shape(p)))
                        for p in params)
    del graph.value_info[:]

