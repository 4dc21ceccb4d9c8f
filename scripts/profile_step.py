"""Per-op profile of one training step per strategy (fp32, ActNN L0, L3 by default), on cpu or cuda.

Builds the step exactly as ``actbench throughput`` does (``build_training_step``), runs warm-up
steps, then profiles one step with ``torch.profiler`` and prints the ops with the largest self
time, with call counts, so a change to the ActNN hot path is measured the same way each time. On
cuda each op also gets its self time on the device, and the step's wall time beside the device's
busy time says how much of the step the host left the device idle:

    python scripts/profile_step.py --model resnet50 --batch 8 --image-size 112 --strategies fp32,L0,L3
    python scripts/profile_step.py --device cuda --batch 64 --image-size 224
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from actbench import strategies
from actbench.training.models import build_model
from actbench.schema import ModelSpec
from actbench.training.step import build_training_step, synthetic_batch


@dataclass(frozen=True)
class OpRow:
    """One op of the profiled step: self time on the host and on the device (ms), and calls."""

    name: str
    self_ms: float
    device_ms: float
    calls: int


def profile_strategy(model_name: str, strategy: str, batch: int, image_size: int, warmup: int,
                     device: torch.device) -> tuple[float, list[OpRow]]:
    """Wall time (ms) of one profiled step and its ops, sorted by the larger of host and device self time."""
    torch.manual_seed(0)
    spec = ModelSpec(model_name)
    step, _ = build_training_step(strategies.get(strategy), build_model(spec, image_size).to(device), device)
    images, targets = synthetic_batch(batch, image_size, spec.num_classes, device, 1)
    for _ in range(warmup):
        step(images, targets)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step(images, targets)
        sync()
        wall = (time.perf_counter() - start) * 1e3
    rows = [OpRow(e.key, e.self_cpu_time_total / 1e3, getattr(e, "self_device_time_total", 0) / 1e3, e.count)
            for e in prof.key_averages()]
    return wall, sorted(rows, key=lambda r: -max(r.self_ms, r.device_ms))


def print_table(strategy: str, wall_ms: float, rows: list[OpRow], top: int, device: torch.device) -> None:
    if device.type == "cuda":
        busy = sum(r.device_ms for r in rows)
        print(f"\n{strategy}: one step {wall_ms:.1f} ms (profiled), device busy {busy:.1f} ms")
        print("| op | host self ms | device self ms | calls |\n|---|---|---|---|")
        for r in rows[:top]:
            print(f"| `{r.name}` | {r.self_ms:.1f} | {r.device_ms:.1f} | {r.calls} |")
        return
    print(f"\n{strategy}: one step {wall_ms:.1f} ms (profiled)")
    print("| op | self ms | calls |\n|---|---|---|")
    for r in rows[:top]:
        print(f"| `{r.name}` | {r.self_ms:.1f} | {r.calls} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--strategies", default="fp32,L0,L3")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    for strategy in args.strategies.split(","):
        wall, rows = profile_strategy(args.model, strategy, args.batch, args.image_size, args.warmup, device)
        print_table(strategy, wall, rows, args.top, device)


if __name__ == "__main__":
    main()
