"""Device files, presets and per-device budgets: what loads, and the message for each mistake."""

from pathlib import Path

import onnxruntime
import pytest

from onnx_remat.core.budget import Budget, parse_budget
from onnx_remat.core.devices import (
    PRESETS,
    Device,
    budgets_by_name,
    device_budgets,
    get_devices,
    load_devices,
    parse_device_budgets,
    preset,
)
from onnx_remat.core.errors import UsageError

SHIPPED = Path(__file__).resolve().parent.parent / "devices"
TWO_CPUS = """
[[device]]
name = "ort"
runtime = "onnxruntime"
threads = 2
budget = "64MiB"

[[device]]
name = "ov"
runtime = "openvino"
provider = "CPU"
"""
HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "devices.toml"
    path.write_text(text)
    return path


def test_loads_devices_in_file_order_with_defaults(tmp_path):
    devices = load_devices(write(tmp_path, TWO_CPUS))
    assert devices == (
        Device("ort", "onnxruntime", "CPUExecutionProvider", threads=2, budget="64MiB"),
        Device("ov", "openvino", "CPU"),
    )
    assert devices[0].parsed_budget == parse_budget("64MiB")
    assert devices[1].parsed_budget is None


def test_shipped_two_engine_file_loads():
    devices = load_devices(SHIPPED / "ort-cpu+ov-cpu.toml")
    assert [(d.runtime, d.provider, d.threads) for d in devices] == [
        ("onnxruntime", "CPUExecutionProvider", 1),
        ("openvino", "CPU", 1),
    ]
    assert devices == preset("ort-cpu+ov-cpu") == get_devices("ort-cpu+ov-cpu")


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is present")
def test_shipped_cuda_file_names_the_missing_provider():
    with pytest.raises(UsageError, match="CUDAExecutionProvider.*available: .*CPUExecutionProvider"):
        load_devices(SHIPPED / "cpu+cuda.toml")
    with pytest.raises(UsageError, match="preset 'cpu\\+cuda'"):
        preset("cpu+cuda")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[device]\nname=", "not valid TOML"),
        ("[other]\nx = 1\n", "lists no devices"),
        ('[[device]]\nname = "a"\nruntime = "tensorrt"\n', "unknown runtime 'tensorrt'"),
        ('[[device]]\nruntime = "openvino"\n', "give a name"),
        ('[[device]]\nname = "a=b"\nruntime = "openvino"\n', "give a name"),
        ('[[device]]\nname = "a"\nruntime = "openvino"\ncolour = 1\n', "unknown key 'colour'"),
        ('[[device]]\nname = "a"\nruntime = "openvino"\nthreads = 0\n', "threads must be a positive integer"),
        ('[[device]]\nname = "a"\nruntime = "openvino"\nbudget = "lots"\n',
         r"devices.toml, device 1 \(a\): cannot read budget 'lots'"),
        ('[[device]]\nname = "a"\nruntime = "openvino"\nbudget = "-5%"\n',
         r"devices.toml, device 1 \(a\): budget '-5%' is negative"),
        (TWO_CPUS.replace('"ov"', '"ort"'), "device name 'ort' appears twice"),
        ('[[device]]\nname = "npu"\nruntime = "openvino"\nprovider = "NPU"\n', "needs openvino NPU"),
    ],
)
def test_device_file_errors(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        load_devices(write(tmp_path, text))


def test_missing_file_and_unknown_preset(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_devices(tmp_path / "nope.toml")
    with pytest.raises(UsageError, match="unknown device preset 'tpu'"):
        preset("tpu")
    with pytest.raises(UsageError, match="does not exist.*cpu, cpu\\+cuda"):
        get_devices("tpu")


def test_presets_use_known_runtimes():
    for devices in PRESETS.values():
        assert len({d.name for d in devices}) == len(devices)
        assert all(d.runtime in ("onnxruntime", "openvino") for d in devices)


def test_parse_device_budgets():
    assert parse_device_budgets("cpu=2GiB, gpu=512MiB") == {
        "cpu": Budget(absolute_bytes=2 * 2**30),
        "gpu": Budget(absolute_bytes=512 * 2**20),
    }
    assert parse_device_budgets("ort=25%,ov=min", ["ort", "ov"]) == {
        "ort": Budget(fraction=0.25),
        "ov": Budget(minimum=True),
    }
    assert parse_device_budgets("40%", ["a", "b"]) == {"a": Budget(fraction=0.4), "b": Budget(fraction=0.4)}


@pytest.mark.parametrize(
    ("text", "names", "message"),
    [
        ("cpu", None, "write name=budget"),
        ("=1GiB", None, "write name=budget"),
        ("cpu=1GiB,cpu=2GiB", None, "two budgets"),
        ("tpu=1GiB", ["cpu", "gpu"], "names device 'tpu', but the devices are cpu, gpu"),
        ("cpu=lots", None, "cannot read budget 'lots'"),
    ],
)
def test_parse_device_budgets_errors(text, names, message):
    with pytest.raises(UsageError, match=message):
        parse_device_budgets(text, names)


def test_command_line_budgets_override_the_device_file(tmp_path):
    devices = load_devices(write(tmp_path, TWO_CPUS))
    assert budgets_by_name(devices) == {"ort": parse_budget("64MiB")}
    override = parse_device_budgets("ov=1GiB", [d.name for d in devices])
    assert budgets_by_name(devices, override) == {"ort": parse_budget("64MiB"), "ov": parse_budget("1GiB")}


def test_device_budgets_merge_the_command_line_with_the_file(tmp_path):
    devices = load_devices(write(tmp_path, TWO_CPUS))
    assert device_budgets(devices, "ov=25%") == {"ort": parse_budget("64MiB"), "ov": parse_budget("25%")}
    assert device_budgets(devices, "50%") == {"ort": parse_budget("50%"), "ov": parse_budget("50%")}
    assert device_budgets(devices, {"ov": 1024}) == {"ort": parse_budget("64MiB"), "ov": Budget(absolute_bytes=1024)}
    with pytest.raises(UsageError, match="device 'ov' has no budget: give --budget ov="):
        device_budgets(devices, None)
    with pytest.raises(UsageError, match="the budgets name device 'gpu'"):
        device_budgets(devices, {"gpu": "1GiB"})


def test_get_devices_default_and_given():
    assert get_devices() == PRESETS["cpu"]
    assert get_devices(PRESETS["ort-cpu+ov-cpu"]) == PRESETS["ort-cpu+ov-cpu"]
    twice = (Device("a", "onnxruntime", "CPUExecutionProvider"),) * 2
    with pytest.raises(UsageError, match="appears twice"):
        get_devices(twice)
