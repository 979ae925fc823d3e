"""Measure a model's operators on each device and print the costs the solver would use.

One row per operator (a node in inference, a layer with its gradient nodes in train mode): measured
microseconds on every device and which device is faster by how much; then the copy costs between
devices (fixed part and bandwidth). Measurements are cached (see onnx_remat.passes.cost_profiled).

    python tools/profile_model.py models/fixtures/resnet18_small.onnx --devices devices/ort-cpu+ov-cpu.toml
    python tools/profile_model.py model.onnx --devices cpu+cuda --mode train
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx_ir as ir
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from onnx_remat.core.devices import get_devices
from onnx_remat.passes.build_problem import build_problem
from onnx_remat.passes.cost_profiled import ProfiledCosts, profile_costs
from onnx_remat.passes.sizes import TensorInfo, tensor_infos
from onnx_remat.pipeline import prepare

SIGNIFICANT = 1.5


def operators(path: Path, mode: str) -> tuple[ir.Model, dict[str, TensorInfo], list[tuple[str, ...]]]:
    """The shape-inferred model on onnx-ir, its tensors and its operators as the solver would see them."""
    prepared = prepare(path, mode)
    free = {"cost": lambda node, infos: 0.0}
    model, infos = prepared.model, tensor_infos(prepared.model)
    graph = build_problem(model, infos, free, lambda n, i: 0, prepared.groups)
    return model, infos, [tuple(group) for group in graph.opmap.node_names]


def cost_table(groups: list[tuple[str, ...]], costs: ProfiledCosts) -> Table:
    """Microseconds per operator on each device, the faster device and by what factor."""
    table = Table(title="operator costs (µs, per-call overhead taken out)")
    table.add_column("operator")
    for name in costs.devices:
        table.add_column(name, justify="right")
    table.add_column("faster", justify="right")
    for k, group in enumerate(groups):
        values = [costs.cost[name][k] for name in costs.devices]
        table.add_row(_label(group), *(f"{v * 1e6:.1f}" for v in values), _faster(costs.devices, values))
    totals = [sum(costs.cost[name]) for name in costs.devices]
    table.add_row("[b]total", *(f"[b]{v * 1e6:.1f}" for v in totals), _faster(costs.devices, totals))
    return table


def copy_table(costs: ProfiledCosts) -> Table:
    """Fixed seconds and bandwidth of each hand-off between two devices."""
    table = Table(title="copy costs: seconds = fixed + bytes / bandwidth")
    for column in ("from", "to", "fixed (µs)", "bandwidth (GB/s)", "1 MiB (µs)"):
        table.add_column(column, justify="left" if column in ("from", "to") else "right")
    for i, source in enumerate(costs.devices):
        for j, target in enumerate(costs.devices):
            if i != j:
                fixed, per_byte = costs.copy_fixed_seconds[i][j], costs.copy_seconds_per_byte[i][j]
                bandwidth = f"{1e-9 / per_byte:.1f}" if per_byte else "∞"
                one_mib = (fixed + per_byte * 2**20) * 1e6
                table.add_row(source, target, f"{fixed * 1e6:.1f}", bandwidth, f"{one_mib:.1f}")
    return table


def summary(costs: ProfiledCosts) -> str:
    """How many operators each device wins, and by at least SIGNIFICANT times."""
    columns = [costs.cost[name] for name in costs.devices]
    lines = []
    for d, name in enumerate(costs.devices):
        others = [min(c[k] for e, c in enumerate(columns) if e != d) for k in range(len(columns[d]))]
        wins = sum(mine < other for mine, other in zip(columns[d], others, strict=True))
        clear = sum(mine * SIGNIFICANT <= other for mine, other in zip(columns[d], others, strict=True))
        lines.append(f"{name} is fastest on {wins} of {len(others)} operators ({clear} by {SIGNIFICANT}x or more)")
    return "\n".join(lines)


def _label(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else f"{group[0]} (+{len(group) - 1})"


def _faster(devices: tuple[str, ...], values: list[float]) -> str:
    """The fastest device and its speed-up over the next one."""
    if len(values) < 2:
        return ""
    order = sorted(range(len(values)), key=values.__getitem__)
    ratio = values[order[1]] / values[order[0]]
    return "tie" if ratio < 1.05 else f"{devices[order[0]]} {ratio:.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--devices", default="ort-cpu+ov-cpu", help="a device .toml file or a preset name")
    parser.add_argument("--mode", choices=("infer", "train"), default="infer")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per operator (the median is used)")
    parser.add_argument("--cache-dir", type=Path, help="where measurements are cached (~/.cache/onnx-remat)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    devices = get_devices(args.devices)
    model, infos, groups = operators(args.model, args.mode)
    with Progress(console=Console(stderr=True, quiet=args.quiet), transient=True) as bar:
        task = bar.add_task("profiling", total=None)
        costs = profile_costs(
            model, infos, groups, devices, args.repeats, args.cache_dir,
            lambda done, total, label: bar.update(task, completed=done, total=total, description=label),
        )
    console = Console()
    console.print(cost_table(groups, costs))
    console.print(copy_table(costs))
    console.print(summary(costs) + ("  (from cache)" if costs.from_cache else ""))


if __name__ == "__main__":
    main()
