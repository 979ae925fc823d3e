"""Control flow in training. An If (torch.cond, as the dynamo exporter writes it) is differentiated by an If on the
same condition whose branches recompute and differentiate each branch: the gradients match autograd on either branch,
nested, through a parameter one branch alone reads, and in a rewritten step. A Loop that may stop early is refused
naming it, also where the parameters reach the loss only through its body's reads of outer tensors. Scan (torch's
scan operator, dynamo) is unrolled over its fixed length before differentiation, and a Loop of constant trip count (a
scripted for loop, legacy) when the model is loaded."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from conftest import step_as_proto
from onnx import TensorProto, helper, numpy_helper
from test_autodiff_rules import TORCH_TOLERANCE, rand, rel_err, run_ort

from onnx_remat.core.errors import ModelError
from onnx_remat.passes.autodiff.unroll_loops import UnrollConstantLoops
from onnx_remat.passes.execute import random_feeds, run
from onnx_remat.passes.measure import held_before_run, measure_activation_peak
from onnx_remat.pipeline import TrainingOptions, prepare, remat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from real_model_zoo import CondMLP  # noqa: E402
from real_models import check as check_model  # noqa: E402

CONTRIB = "com.microsoft"
SOLVE_SECONDS = 2.0
"""Each solve stops by then with its best schedule, which is checked: nothing here waits for a proof."""


def branch(name: str, op: str) -> object:
    """A branch applying op to the outer tensor h."""
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 3])
    return helper.make_graph([helper.make_node(op, ["h"], [f"{name}_out"])], name, [], [out])


def if_model(then_branch: onnx.GraphProto | None = None, else_op: str = "Tanh") -> onnx.ModelProto:
    """torch.cond(x.sum() > 0, relu, tanh, (h,)) with h = w * x (or other branches): w reaches the loss through the
    branches, and the condition alone through a boolean."""
    out = helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [3, 2] if else_op == "Transpose" else [2, 3])
    else_branch = helper.make_graph([helper.make_node(else_op, ["h"], ["else_out"])], "else", [], [out])
    nodes = [helper.make_node("Mul", ["w", "x"], ["h"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["output"], name="cond",
                              then_branch=then_branch or branch("then", "Relu"),
                              else_branch=else_branch)]
    inits = [numpy_helper.from_array(rand(2, 3, seed=5).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)],
                             ir_version=10)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_reading_parameters_in_its_branches_trains(sign: float) -> None:
    """The gradient of w, read only inside the branches, on the branch the input's sign takes."""
    x = sign * np.abs(rand(2, 3, seed=6)).astype(np.float32)
    got = run_ort(step_as_proto(if_model(), loss="sum", freeze=["zero"]).model, {"x": x})
    w = torch.tensor(rand(2, 3, seed=5).astype(np.float32), dtype=torch.float64, requires_grad=True)
    h = w * torch.tensor(x, dtype=torch.float64)
    (torch.relu(h) if sign > 0 else torch.tanh(h)).sum().backward()
    assert rel_err(got["grad.w"], w.grad.numpy()) < TORCH_TOLERANCE


def test_if_whose_branches_give_unequal_shapes_is_refused() -> None:
    """One branch transposes: the If's output has no one shape for the schedule."""
    with pytest.raises(ModelError, match=r"If 'cond': its branches give outputs of unequal or unknown shapes "
                       r"\(\[2,3\] and \[3,2\]\)"):
        step_as_proto(if_model(else_op="Transpose"), loss="sum", freeze=["zero"])


def test_if_with_a_ruleless_op_in_a_branch_names_it() -> None:
    """A contrib op (onnxruntime's Gelu) on the gradient path inside a branch: named with the If it is in."""
    out = helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 3])
    then = helper.make_graph([helper.make_node("Gelu", ["h"], ["then_out"], name="gelu", domain=CONTRIB)], "then",
                             [], [out])
    with pytest.raises(ModelError, match=r"no gradient rule for these op types: com.microsoft.Gelu \(e.g. node "
                       r"'cond.grad/recompute/0' inside If 'cond'\)"):
        step_as_proto(if_model(then_branch=then), loss="sum", freeze=["zero"])


class CondNet(torch.nn.Module):
    """A linear layer, torch.cond on the input's sum, a linear head. True: ReLU times `scale` (a parameter no other
    branch reads) or, `nested`, a torch.cond on x[0, 0] between sigmoid(mid(h)) and h * scale; false: tanh."""

    def __init__(self, nested: bool) -> None:
        super().__init__()
        self.nested = nested
        self.inner, self.mid, self.head = torch.nn.Linear(8, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)
        self.scale = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def inner_cond(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x[0, 0] > 0, lambda u: torch.sigmoid(self.mid(u)), lambda u: u * self.scale, (t,))

        def scaled(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(t) * self.scale

        def squashed(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(t)

        then = inner_cond if self.nested else scaled
        return self.head(torch.cond(x.sum() > 0, then, squashed, (self.inner(x), x)))


@pytest.fixture(scope="module")
def exported_conds(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[CondNet, onnx.ModelProto]]:
    """CondNet plain and nested, each with its training step as torch.onnx.export(dynamo=True) writes the module
    (unoptimized: constants stay constants) and build_training_graph makes it, exported once for the module."""
    steps = {}
    for nested in (False, True):
        torch.manual_seed(0)
        module = CondNet(nested)
        path = tmp_path_factory.mktemp("cond") / "cond.onnx"
        torch.onnx.export(module, (torch.ones(2, 8),), dynamo=True, optimize=False, verbose=False).save(str(path))
        steps[nested] = module, step_as_proto(onnx.load(str(path)), loss="sum").model
    return steps


COND_INPUTS = {"true": np.abs(rand(2, 8, seed=7)), "false": -np.abs(rand(2, 8, seed=7)),
               "true, inner false": np.abs(rand(2, 8, seed=7)) * np.where(np.arange(16) == 0, -1, 1).reshape(2, 8)}


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("taken", list(COND_INPUTS))
def test_exported_cond_matches_autograd(exported_conds: dict[bool, tuple[CondNet, onnx.ModelProto]], nested: bool,
                                        taken: str) -> None:
    """The step's loss and every parameter's gradient against autograd, on each branch (nested: each inner one);
    a parameter the branch not taken reads gets zeros."""
    module, step = exported_conds[nested]
    x = COND_INPUTS[taken].astype(np.float32)
    got = run_ort(step, {"x": x})
    reference = copy.deepcopy(module).double()
    loss = reference(torch.tensor(x, dtype=torch.float64)).sum()
    loss.backward()
    assert rel_err(got["loss"], loss.detach().numpy()) < TORCH_TOLERANCE
    exported = {i.name for i in step.graph.initializer}
    params = {name: p for name, p in reference.named_parameters() if name in exported}  # not mid's when unused
    assert {k.removeprefix("grad.") for k in got if k.startswith("grad.")} == set(params)
    for name, param in params.items():
        want = np.zeros(param.shape) if param.grad is None else param.grad.numpy()
        assert np.abs(got[f"grad.{name}"] - want).max() <= TORCH_TOLERANCE * max(np.abs(want).max(), 1.0), name


def test_cond_mlp_rewritten_step_matches_and_measures_within_budget(tmp_path: Path) -> None:
    """The step rewritten at a budget that forces recomputation gives the un-rewritten step's numbers on either
    branch, and measures within the budget: the backward If's recomputed branch is its workspace."""
    torch.manual_seed(0)
    path, rewritten = tmp_path / "mlp.onnx", tmp_path / "mlp.remat.onnx"
    torch.onnx.export(CondMLP(), (torch.ones(2048, 32),), dynamo=True, optimize=False, verbose=False).save(str(path))
    options = TrainingOptions(loss="sum")
    step = prepare(path, mode="train", training=options).proto
    result = remat(path, "min", mode="train", training=options, time_limit=SOLVE_SECONDS)
    budget = result.report.budget_bytes
    assert result.report.recomputations
    result.save(rewritten)
    feeds = random_feeds(step, seed=0)
    for sign in (1.0, -1.0):
        feeds["x"] = sign * np.abs(feeds["x"])
        for got, want in zip(run(result.model, feeds), run(step, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert measure_activation_peak(rewritten, repeats=1) <= budget - held_before_run(result.model)


def scan_model(directions: tuple[int, int], axes: tuple[int, int]) -> onnx.ModelProto:
    """A recurrence h' = tanh(h W + x_t), W read from the outer graph only, over 3 steps of xs (scanned along
    axes[0], in direction directions[0]); outputs every h' (stacked along axes[1], in directions[1]) and the last."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["hw"]), helper.make_node("Add", ["hw", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_next"]), helper.make_node("Identity", ["h_next"], ["y_t"])],
        "body", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("h", "x_t")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in ("h_next", "y_t")])
    scan = helper.make_node("Scan", ["h0", "xs"], ["h_last", "ys"], name="scan", body=body, num_scan_inputs=1,
                            scan_input_directions=[directions[0]], scan_output_directions=[directions[1]],
                            scan_input_axes=[axes[0]], scan_output_axes=[axes[1]])
    nodes = [scan, helper.make_node("Mul", ["ys", "probe"], ["weighted"]),
             helper.make_node("ReduceSum", ["weighted"], ["part"], keepdims=0),
             helper.make_node("ReduceSum", ["h_last"], ["last"], keepdims=0),
             helper.make_node("Add", ["part", "last"], ["output"])]
    ys_shape = [2, 4]
    ys_shape.insert(axes[1], 3)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rand(4, 4) * 0.5), ("h0", rand(2, 4, seed=1)), ("probe", rand(*ys_shape, seed=2)))]
    xs_shape = [2, 4]
    xs_shape.insert(axes[0], 3)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("xs", TensorProto.FLOAT, xs_shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize(("directions", "axes"), [((0, 0), (0, 0)), ((1, 0), (1, 2)), ((0, 1), (0, 1))])
def test_scan_is_unrolled_and_trained(directions: tuple[int, int], axes: tuple[int, int]) -> None:
    """The unrolled steps' gradients of W and h0 (W read only inside the body) match torch's for the same
    recurrence, forward or reversed, along other axes."""
    model = scan_model(directions, axes)
    values = {i.name: torch.tensor(numpy_helper.to_array(i), dtype=torch.float64, requires_grad=i.name != "probe")
              for i in model.graph.initializer}
    xs = rand(*[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim], seed=3)
    training = step_as_proto(model, loss="sum", freeze=["probe"])
    got = run_ort(training.model, {"xs": xs.astype(np.float32)})
    h, ys = values["h0"], []
    steps = torch.tensor(xs).movedim(axes[0], 0)
    for x in (steps.flip(0) if directions[0] else steps):
        h = torch.tanh(h @ values["w"] + x)
        ys.append(h)
    stacked = torch.stack(ys[::-1] if directions[1] else ys, axes[1])
    ((stacked * values["probe"]).sum() + h.sum()).backward()
    for name in ("w", "h0"):
        assert rel_err(got[f"grad.{name}"], values[name].grad.numpy()) < TORCH_TOLERANCE


def test_exported_scan_trains(tmp_path: Path) -> None:
    """torch's scan operator as the dynamo exporter writes it (tools/real_models.py): the training step matches
    autograd and survives a rewrite."""
    outcome = check_model("op_scan", "dynamo", tmp_path, time_limit=SOLVE_SECONDS)
    assert not outcome.problems()
    assert outcome.gradients_compared == outcome.gradients_written > 0


def loop_model(condition: str, scanned: bool = True) -> onnx.ModelProto:
    """Loop(3, true, x) over h' = tanh(h W + i), W read from the outer graph, its condition `condition` ("passed":
    the incoming one; "computed": i < 1, as a while loop's; "data": sum h' < 0.5, a `break` on the data); outputs
    the last h and, `scanned`, every 2 h' stacked."""
    conditions = {"passed": [helper.make_node("Identity", ["cond_in"], ["cond_out"])],
                  "computed": [helper.make_node("Less", ["i", "one"], ["cond_out"])],
                  "data": [helper.make_node("ReduceSum", ["h_next"], ["total"], keepdims=0),
                           helper.make_node("Less", ["total", "limit"], ["cond_out"])]}
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["hw"]), helper.make_node("Cast", ["i"], ["fi"], to=1),
         helper.make_node("Add", ["hw", "fi"], ["pre"]), helper.make_node("Tanh", ["pre"], ["h_next"]),
         *[helper.make_node("Add", ["h_next", "h_next"], ["y"])] * scanned, *conditions[condition]],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_next", TensorProto.FLOAT, [2, 4]),
         *[helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])] * scanned])
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w", (rand(4, 4) * 0.5).astype(np.float32)), ("trips", np.array(3, np.int64)), ("true", np.array(True)),
        ("one", np.array(1, np.int64)), ("limit", np.array(0.5, np.float32)))]
    outputs = [helper.make_tensor_value_info("h_last", TensorProto.FLOAT, [2, 4]),
               *[helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)] * scanned]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "true", "x"], [o.name for o in outputs], name="loop", body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_constant_loop_is_unrolled_alike() -> None:
    """A Loop of constant trip count whose condition stays true becomes its steps, with the same outputs."""
    model = loop_model("passed")
    unrolled = ir.from_proto(model)
    assert UnrollConstantLoops()(unrolled).modified
    assert not any(node.op_type == "Loop" for node in unrolled.graph)
    feeds = {"x": rand(2, 4, seed=4).astype(np.float32)}
    before, after = run_ort(model, feeds), run_ort(ir.to_proto(unrolled), feeds)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-6)


def test_loop_that_may_stop_early_is_left() -> None:
    """At load, for inference too: the Loop stops where it may; unrolled, every trip would be computed."""
    assert not UnrollConstantLoops()(ir.from_proto(loop_model("computed"))).modified


def loop_reference(x: np.ndarray, condition: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop_model's last h in torch (float64), stopping as the Loop does, and its W."""
    w = torch.tensor((rand(4, 4) * 0.5).astype(np.float32), dtype=torch.float64, requires_grad=True)
    h = torch.tensor(x, dtype=torch.float64)
    for i in range(3):
        h = torch.tanh(h @ w + i)
        going = i < 1 if condition == "computed" else bool(h.sum() < 0.5)
        if not going:
            break
    return h, w


@pytest.mark.parametrize("condition", ["computed", "data"])
@pytest.mark.parametrize(("seed", "scale"), [(8, 2.0), (4, 2.0), (18, 8.0)])  # "data": 1, 2 and 3 trips
def test_loop_that_may_stop_early_trains_under_a_mask(condition: str, seed: int, scale: float) -> None:
    """A Loop of constant trip count whose condition comes out of its body (a `break`), without per-trip outputs:
    the training step's loss and W's gradient match autograd's on the loop as it runs, however many trips that is."""
    x = rand(2, 4, seed=seed).astype(np.float32) * scale
    step = step_as_proto(loop_model(condition, scanned=False), loss="sum", freeze=["limit"])
    assert not any(node.op_type == "Loop" for node in step.model.graph.node)
    got = run_ort(step.model, {"x": x})
    h, w = loop_reference(x, condition)
    h.sum().backward()
    assert rel_err(got["loss"], h.sum().detach().numpy()) < TORCH_TOLERANCE
    assert rel_err(got["grad.w"], w.grad.numpy()) < TORCH_TOLERANCE


def test_loop_that_may_stop_early_with_per_trip_outputs_is_refused() -> None:
    """How many per-trip outputs it gives depends on the data: left as a Loop, refused naming it."""
    with pytest.raises(ModelError, match=r"depends on the input values \(Loop node 'loop'\)"):
        step_as_proto(loop_model("data"), loss="sum", freeze=["limit"])


def test_exported_scripted_loop_trains(tmp_path: Path) -> None:
    """A scripted for loop as the legacy exporter writes it (a Loop of trip count 3, its weight read inside):
    inference and the training step match, before and after a rewrite (tools/real_models.py)."""
    outcome = check_model("op_scripted_loop", "legacy", tmp_path, time_limit=SOLVE_SECONDS)
    assert not outcome.problems()
    assert outcome.gradients_compared == outcome.gradients_written > 0


def test_loop_that_may_stop_early_is_unrolled_when_prepared_for_training() -> None:
    """At load in train mode, before shapes are resolved: a body that states no shapes (as the legacy exporter's,
    symbolic) leaves the Loop's outputs unsized, which would be refused."""
    model = loop_model("data", scanned=False)
    for value in [*model.graph.node[0].attribute[0].g.output, *model.graph.output]:
        for k, dim in enumerate(value.type.tensor_type.shape.dim):
            dim.dim_param = f"d{k}"
    step = prepare(model, mode="train", training=TrainingOptions(loss="sum", freeze=("limit",))).proto
    assert not any(node.op_type == "Loop" for node in step.graph.node)
    x = rand(2, 4, seed=4).astype(np.float32) * 2
    h, w = loop_reference(x, "data")
    h.sum().backward()
    assert rel_err(run_ort(step, {"x": x})["grad.w"], w.grad.numpy()) < TORCH_TOLERANCE
