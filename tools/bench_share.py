"""Measuring costs against its share of a short time limit: real training steps, quiet and beside CPU hogs.

Exports each model of tools/real_model_zoo.py (legacy exporter, training mode) once, then for each time limit runs
the command's first two stages (`prepare`, `costed`) in a fresh process with an empty cost cache, as a new user's
first run, once quiet and once beside `--hogs` busy loops. A row gives the load average, the slowdown preparing
measured, the share of the limit measuring got (`_costs`' argument: 0 when the limit is spent, and then the roofline
serves), the wall and CPU seconds measuring took (the roofline problem's build excluded), how far past its share it
ended, and where the costs came from.

Run: python tools/bench_share.py [--models gpt,moe,resnet18,mobilenet_v2] [--limits 2,5,20] [--hogs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
"""Where a child's limit counts from, as the command's from its entry: before the package's imports."""


def child(path: str, limit: float, freeze: list[str]) -> dict:
    """Prepare and cost `path`'s training step under `limit` counted from this process's start: the share measuring
    got, its wall and CPU seconds, the slowdown and where the costs came from."""
    import onnx_remat.pipeline as pipeline
    from onnx_remat.core.options import RematOptions, TrainingOptions

    recorded: dict = {}
    costs = pipeline._costs

    def timed(*arguments: Any) -> Any:
        """`_costs` as it is, timed, with the share it was given (its last argument)."""
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return costs(*arguments)
        finally:
            recorded.update(share=arguments[-1], wall=time.perf_counter() - wall, cpu=time.process_time() - cpu)

    pipeline._costs = timed
    training = TrainingOptions(loss="mse", freeze=tuple(freeze))
    options = RematOptions(mode="train", training=training, time_limit=limit, cache_dir=os.environ["CACHE"])
    prepared = pipeline.prepare(path, "train", None, training)
    costed = pipeline.costed(prepared, options, None, STARTED)
    return {**recorded, "slowdown": prepared.slowdown, "source": costed.cost_source.split(":")[0]}


def run(path: Path, limit: float, freeze: tuple[str, ...], hogs: int) -> dict:
    """One child run beside `hogs` busy loops (each stopped by its own id), with the load average at its start."""
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
    try:
        time.sleep(0.5 if loops else 0.0)
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as cache:
            done = subprocess.run([sys.executable, __file__, "--child", str(path), str(limit), *freeze],
                                  env={**os.environ, "CACHE": cache}, capture_output=True, text=True, check=True)
        return {"load": load, **json.loads(done.stdout.strip().splitlines()[-1])}
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], float(sys.argv[3]), sys.argv[4:])), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,moe,resnet18,mobilenet_v2")
    parser.add_argument("--limits", default="2,5,20")
    parser.add_argument("--hogs", type=int, default=2)
    args = parser.parse_args()
    from real_models import export, frozen_constants

    print("| model | limit s | hogs | load avg | slowdown | share s | measuring wall s | CPU s | past its share s | "
          "costs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            path = export(name, "legacy", Path(folder) / f"{name}.train.onnx", training=True)
            freeze = frozen_constants(name, path)
            for limit in (float(text) for text in args.limits.split(",")):
                for hogs in (0, args.hogs):
                    r = run(path, limit, freeze, hogs)
                    print(f"| {name} | {limit:g} | {hogs} | {r['load']:.1f} | {r['slowdown']:.1f} | {r['share']:.2f} | "
                          f"{r['wall']:.2f} | {r['cpu']:.2f} | {r['wall'] - r['share']:+.2f} | {r['source']} |",
                          flush=True)


if __name__ == "__main__":
    main()
