"""Whole small networks: training-graph gradients in onnxruntime and OpenVINO vs torch autograd; bad inputs."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from conftest import step_as_proto
from onnx import TensorProto, helper, numpy_helper
from test_autodiff_rules import run_openvino, run_ort

from onnx_remat.core.errors import ModelError, UsageError

TOLERANCE = 1e-4


class Net:
    """A tiny ONNX graph builder that keeps every weight for the torch twin of the network."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: dict[str, np.ndarray] = {}

    def param(self, name: str, shape: tuple[int, ...], scale: float = 0.3, center: float = 0.0) -> str:
        self.weights[name] = (center + scale * self.rng.standard_normal(shape)).astype(np.float32)
        return name

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        return self.op("Constant", [], name, value=numpy_helper.from_array(value))

    def model(self, input_shape: tuple[int, ...], output: str) -> onnx.ModelProto:
        inits = [numpy_helper.from_array(v, k) for k, v in self.weights.items()]
        graph = helper.make_graph(self.nodes, "net", [helper.make_tensor_value_info("input", 1, input_shape)],
                                  [helper.make_tensor_value_info(output, 1, None)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def conv_bn_relu(net: Net, x: str, name: str, cin: int, cout: int, stride: int = 1) -> str:
    w = net.param(f"{name}.w", (cout, cin, 3, 3), (2 / (9 * cin)) ** 0.5)
    c = net.op("Conv", [x, w], f"{name}.conv", pads=[1, 1, 1, 1], strides=[stride, stride])
    scale, bias = net.param(f"{name}.g", (cout,), 0.1, 1.0), net.param(f"{name}.b", (cout,), 0.1)
    mean, var = net.param(f"{name}.m", (cout,), 0.1), net.param(f"{name}.v", (cout,), 0.1, 1.0)
    bn = net.op("BatchNormalization", [c, scale, bias, mean, var], f"{name}.bn")
    return net.op("Relu", [bn], f"{name}.relu")


def torch_conv_bn_relu(p: dict, x: torch.Tensor, name: str, stride: int = 1) -> torch.Tensor:
    c = F.conv2d(x, p[f"{name}.w"], padding=1, stride=stride)
    bn = F.batch_norm(c, p[f"{name}.m"].detach().clone(), p[f"{name}.v"].detach().clone(), p[f"{name}.g"],
                      p[f"{name}.b"], training=True)
    return F.relu(bn)


def cnn() -> tuple[onnx.ModelProto, Callable, tuple[int, ...]]:
    """conv/bn/relu/maxpool twice, global average pool, flatten, gemm: 10 classes."""
    net = Net(1)
    x = conv_bn_relu(net, "input", "b1", 3, 8)
    x = net.op("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_bn_relu(net, x, "b2", 8, 8)
    x = net.op("Flatten", [net.op("GlobalAveragePool", [x], "gap")], "flatten")
    x = net.op("Gemm", [x, net.param("fc.w", (10, 8)), net.param("fc.b", (10,))], "fc", transB=1)

    def twin(p: dict, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch_conv_bn_relu(p, x, "b1"), 2)
        x = torch_conv_bn_relu(p, x, "b2").mean((2, 3))
        return x @ p["fc.w"].T + p["fc.b"]
    return net.model((4, 3, 16, 16), x), twin, (4, 3, 16, 16)


def residual() -> tuple[onnx.ModelProto, Callable, tuple[int, ...]]:
    """A ResNet basic block: conv-bn-relu-conv-bn plus the input, then relu."""
    net = Net(2)
    x = conv_bn_relu(net, "input", "r1", 4, 4)
    w = net.param("r2.w", (4, 4, 3, 3), 0.2)
    c = net.op("Conv", [x, w], "r2.conv", pads=[1, 1, 1, 1])
    bn = net.op("BatchNormalization", [c, net.param("r2.g", (4,), 0.1, 1.0), net.param("r2.b", (4,), 0.1),
                                       net.param("r2.m", (4,), 0.1), net.param("r2.v", (4,), 0.1, 1.0)], "r2.bn")
    out = net.op("Relu", [net.op("Add", [bn, "input"], "skip")], "out")

    def twin(p: dict, x: torch.Tensor) -> torch.Tensor:
        h = F.conv2d(torch_conv_bn_relu(p, x, "r1"), p["r2.w"], padding=1)
        h = F.batch_norm(h, p["r2.m"].detach().clone(), p["r2.v"].detach().clone(), p["r2.g"], p["r2.b"], True)
        return F.relu(h + x)
    return net.model((4, 4, 16, 16), out), twin, (4, 4, 16, 16)


def unet() -> tuple[onnx.ModelProto, Callable, tuple[int, ...]]:
    """One-level U-Net: conv-in-lrelu, maxpool, conv-in-lrelu, conv-transpose up, concat skip, 1x1 conv."""
    net = Net(3)

    def block(x: str, name: str, cin: int, cout: int) -> str:
        c = net.op("Conv", [x, net.param(f"{name}.w", (cout, cin, 3, 3), 0.3), net.param(f"{name}.cb", (cout,), 0.1)],
                   f"{name}.conv", pads=[1, 1, 1, 1])
        n = net.op("InstanceNormalization", [c, net.param(f"{name}.g", (cout,), 0.1, 1.0),
                                            net.param(f"{name}.b", (cout,), 0.1)], f"{name}.in")
        return net.op("LeakyRelu", [n], f"{name}.lrelu", alpha=0.1)

    skip = block("input", "enc", 2, 4)
    low = block(net.op("MaxPool", [skip], "down", kernel_shape=[2, 2], strides=[2, 2]), "mid", 4, 8)
    up = net.op("ConvTranspose", [low, net.param("up.w", (8, 4, 2, 2), 0.3), net.param("up.b", (4,), 0.1)], "up",
                strides=[2, 2])
    cat = net.op("Concat", [up, skip], "cat", axis=1)
    out = net.op("Conv", [cat, net.param("head.w", (3, 8, 1, 1), 0.3)], "head")

    def twin(p: dict, x: torch.Tensor) -> torch.Tensor:
        def tblock(x: torch.Tensor, name: str) -> torch.Tensor:
            c = F.conv2d(x, p[f"{name}.w"], p[f"{name}.cb"], padding=1)
            return F.leaky_relu(F.instance_norm(c, weight=p[f"{name}.g"], bias=p[f"{name}.b"]), 0.1)
        s = tblock(x, "enc")
        u = F.conv_transpose2d(tblock(F.max_pool2d(s, 2), "mid"), p["up.w"], p["up.b"], stride=2)
        return F.conv2d(torch.cat([u, s], 1), p["head.w"])
    return net.model((2, 2, 16, 16), out), twin, (2, 2, 16, 16)


def transformer() -> tuple[onnx.ModelProto, Callable, tuple[int, ...]]:
    """Post-LayerNorm encoder block: 2-head self-attention and an Erf-GELU MLP, both residual."""
    net, (b, t, d, h) = Net(4), (2, 5, 8, 2)
    hd = d // h
    x = "input"

    def linear(x: str, name: str, din: int, dout: int) -> str:
        mm = net.op("MatMul", [x, net.param(f"{name}.w", (din, dout), din ** -0.5)], f"{name}.mm")
        return net.op("Add", [mm, net.param(f"{name}.b", (dout,), 0.1)], f"{name}.add")

    def heads(x: str, name: str, perm: list[int]) -> str:
        r = net.op("Reshape", [x, net.const(f"{name}.shape", np.array([b, t, h, hd], np.int64))], f"{name}.split")
        return net.op("Transpose", [r], f"{name}.heads", perm=perm)

    q = heads(linear(x, "q", d, d), "qh", [0, 2, 1, 3])
    k = heads(linear(x, "k", d, d), "kh", [0, 2, 3, 1])
    v = heads(linear(x, "v", d, d), "vh", [0, 2, 1, 3])
    scores = net.op("Div", [net.op("MatMul", [q, k], "qk"), net.const("sqrt_d", np.array(hd ** 0.5, np.float32))],
                    "scaled")
    attn = net.op("MatMul", [net.op("Softmax", [scores], "softmax", axis=-1), v], "attn")
    merged = net.op("Reshape", [net.op("Transpose", [attn], "merge", perm=[0, 2, 1, 3]),
                                net.const("merged.shape", np.array([b, t, d], np.int64))], "merged")
    x1 = net.op("Add", [linear(merged, "o", d, d), x], "res1")
    ln1 = net.op("LayerNormalization", [x1, net.param("ln1.g", (d,), 0.1, 1.0), net.param("ln1.b", (d,), 0.1)], "ln1")
    hid = linear(ln1, "fc1", d, 16)
    erf = net.op("Erf", [net.op("Div", [hid, net.const("sqrt2", np.array(2 ** 0.5, np.float32))], "gelu.div")],
                 "gelu.erf")
    half = net.const("half", np.array(0.5, np.float32))
    one = net.const("one", np.array(1.0, np.float32))
    gelu = net.op("Mul", [net.op("Mul", [hid, half], "gelu.half"), net.op("Add", [erf, one], "gelu.add")], "gelu")
    x2 = net.op("Add", [linear(gelu, "fc2", 16, d), ln1], "res2")
    out = net.op("LayerNormalization", [x2, net.param("ln2.g", (d,), 0.1, 1.0), net.param("ln2.b", (d,), 0.1)],
                 "ln2")

    def twin(p: dict, x: torch.Tensor) -> torch.Tensor:
        def lin(x: torch.Tensor, name: str) -> torch.Tensor:
            return x @ p[f"{name}.w"] + p[f"{name}.b"]

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(b, t, h, hd).transpose(1, 2)
        q, k, v = (split(lin(x, n)) for n in "qkv")
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        x1 = lin(attn.transpose(1, 2).reshape(b, t, d), "o") + x
        ln1 = F.layer_norm(x1, (d,), p["ln1.g"], p["ln1.b"])
        x2 = lin(F.gelu(lin(ln1, "fc1")), "fc2") + ln1
        return F.layer_norm(x2, (d,), p["ln2.g"], p["ln2.b"])
    return net.model((b, t, d), out), twin, (b, t, d)


NETWORKS = {"cnn": (cnn, "cross-entropy"), "residual": (residual, "mse"), "unet": (unet, "mse"),
            "transformer": (transformer, "mse")}


def feeds(model: onnx.ModelProto, input_shape: tuple[int, ...], loss: str) -> dict[str, np.ndarray]:
    """Seeded input and label."""
    rng = np.random.default_rng(42)
    out = {"input": rng.standard_normal(input_shape).astype(np.float32)}
    label = next((i for i in model.graph.input if i.name == "label"), None)
    if label is not None:
        shape = [d.dim_value for d in label.type.tensor_type.shape.dim]
        out["label"] = (rng.integers(0, 10, shape) if loss == "cross-entropy"
                        else rng.standard_normal(shape).astype(np.float32))
    return out


def torch_reference(model: onnx.ModelProto, twin: Callable, data: dict, loss: str) -> dict[str, np.ndarray]:
    """Loss and parameter gradients of the torch twin, in float64."""
    params = {i.name: torch.tensor(numpy_helper.to_array(i).astype(np.float64), requires_grad=True)
              for i in model.graph.initializer}
    out = twin(params, torch.tensor(data["input"].astype(np.float64)))
    if loss == "cross-entropy":
        value = F.cross_entropy(out, torch.tensor(data["label"]))
    else:
        value = F.mse_loss(out, torch.tensor(data["label"].astype(np.float64)))
    value.backward()
    grads = {f"grad.{k}": t.grad.numpy() for k, t in params.items() if t.grad is not None}
    return {"loss": value.detach().numpy(), **grads}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_network_gradients_match_torch_in_both_runtimes(name: str) -> None:
    builder, loss = NETWORKS[name]
    model, twin, input_shape = builder()
    training = step_as_proto(model, loss=loss)
    onnx.checker.check_model(training.model, full_check=True)
    assert training.model.ir_version == 10
    data = feeds(training.model, input_shape, loss)
    expected = torch_reference(model, twin, data, loss)
    assert set(training.gradients) == set(expected) - {"loss"}
    # Some parameters have an exactly zero gradient (a conv bias before InstanceNorm, the attention key
    # bias): compare those against the largest gradient instead of their own float noise.
    floor = 1e-3 * max(np.abs(v).max() for v in expected.values())
    for runtime in (run_ort, run_openvino):
        got = runtime(training.model, data)
        errors = {k: float(np.abs(got[k] - v).max() / max(np.abs(v).max(), floor)) for k, v in expected.items()}
        worst = max(errors, key=errors.get)
        assert errors[worst] < TOLERANCE, f"{runtime.__name__}: {worst} off by {errors[worst]:.2e}"


def test_groups_cover_every_backward_node_once() -> None:
    model, _, _ = residual()
    training = step_as_proto(model, loss="mse")
    copies = {n.name for n in training.model.graph.node if n.name.endswith((".running_mean_in", ".running_var_in"))}
    forward = {n.name for n in model.graph.node} | copies  # BatchNorm reads copies of its running statistics
    grouped = [n for names in training.backward_groups.values() for n in names]
    assert len(grouped) == len(set(grouped))
    backward = {n.name for n in training.model.graph.node} - forward - {n.name for n in training.model.graph.node
                                                                        if n.name.startswith("loss/")
                                                                        and ".grad/" not in n.name}
    assert set(grouped) == backward
    for owner, names in training.backward_groups.items():
        assert all(n.startswith(f"{owner}.grad/") for n in names)
    assert set(training.backward_groups) - {"loss/diff", "loss/square", "loss/mean"} <= forward


def test_training_outputs() -> None:
    model, _, _ = cnn()
    training = step_as_proto(model, loss="cross-entropy", freeze=["fc.b"])
    outputs = [o.name for o in training.model.graph.output]
    assert outputs[:2] == ["fc", "b1.bn.running_mean_out"]
    assert "loss" in outputs and "grad.fc.b" not in outputs
    assert "b1.m" not in training.parameters  # running statistics are not trained
    assert training.gradients == tuple(f"grad.{p}" for p in training.parameters)
    assert [o for o in outputs if o.startswith("grad.")] == list(training.gradients)
    assert not any(n.domain for n in training.model.graph.node)


def tiny(op_type: str = "Relu", out_type: int = TensorProto.FLOAT, **kwargs) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    node = helper.make_node(op_type, ["w"], ["y"], name="n", **kwargs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", out_type, [2, 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_errors() -> None:
    with pytest.raises(ModelError, match="no trainable parameters"):
        step_as_proto(tiny(), loss="sum", freeze=["w"])
    with pytest.raises(ModelError, match="cross-entropy needs an output of shape"):
        step_as_proto(unet()[0], loss="cross-entropy")
    with pytest.raises(ModelError, match="integer-only path"):
        step_as_proto(tiny("Cast", TensorProto.INT64, to=TensorProto.INT64), loss="sum")
    with pytest.raises(UsageError, match="cannot freeze"):
        step_as_proto(tiny(), loss="sum", freeze=["nope"])
    with pytest.raises(UsageError, match="unknown loss"):
        step_as_proto(tiny(), loss="hinge")
    trained = step_as_proto(tiny(), loss="sum").model
    with pytest.raises(ModelError, match="already contains training parts"):
        step_as_proto(trained, loss="sum")
    foreign = tiny()
    foreign.graph.node.append(helper.make_node("ReluGrad", ["y", "w"], ["z"], name="rg", domain="com.microsoft"))
    with pytest.raises(ModelError, match=r"ReluGrad \(rg\)"):
        step_as_proto(foreign, loss="sum")


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["resnet18_small", "transformer_small", "unet_small"])
def test_exported_fixtures_train_alike_in_both_runtimes(fixture: str) -> None:
    """PyTorch-exported models: the training graph builds and both runtimes agree on every gradient."""
    model = onnx.load(str(Path(__file__).parent.parent / "models" / "fixtures" / f"{fixture}.onnx"))
    training = step_as_proto(model, loss="mse")
    rng = np.random.default_rng(0)
    data = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in training.model.graph.input}
    ours, theirs = run_ort(training.model, data), run_openvino(training.model, data)
    scale = max(np.abs(ours[g]).max() for g in training.gradients)  # key biases have a zero gradient
    worst = max(float(np.abs(theirs[g] - ours[g]).max()) / scale for g in training.gradients)
    assert worst < TOLERANCE
