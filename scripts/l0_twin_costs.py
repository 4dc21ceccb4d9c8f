"""What L0's twins cost a step: fp32 and L0 timed in turn beside L0 with its ReLU twins run as torch's layers.

Why: at L0 a ReLU twin keeps a 1-bit mask beside a new output, where torch's layer applies ReLU in
place and keeps nothing of its own. The variant here puts torch's own forward back on every ReLU
twin, so a step's gap to fp32 splits into the ReLU twins' share and the rest (docs/design.md §2,
"What is left at L0"). BatchNorm, conv and linear twins already run as torch's layers at L0
(``ActNNModule._runs_as_torch``). The variant keeps other bytes than L0 does: it is a measurement,
not a strategy.

Each variant is built in this process and one step of each is timed per round, in turn
(``samples_in_turn``), and its row is bench-actnn's (``studies.actnn_cost.ratio_rows``): the ratio is
the median over rounds of that round's fp32 step over the variant's, with the lowest and highest round's.

Usage: python scripts/l0_twin_costs.py MODEL IMAGE_SIZE BATCH ROUNDS [--threads N] [--device cpu|cuda]
Prints one JSON object per variant. On cuda a step waits for the device before its clock stops, so a
twin's host cost shows where the host, not the device, bounds the step (docs/design.md §11).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import types

import torch

from actbench import strategies
from actbench.actnn.layers import QReLU
from actbench.kernels.bench import samples_in_turn
from actbench.schema import ModelSpec
from actbench.studies.actnn_cost import ratio_rows
from actbench.training.models import build_model
from actbench.training.step import build_training_step, synthetic_batch

#: variant -> (strategy, ReLU twins run as torch's)
VARIANTS = {
    "fp32": ("fp32", False),
    "L0": ("L0", False),
    "L0, torch's ReLU": ("L0", True),
}


def run_as_torch(model: torch.nn.Module, relu: bool) -> int:
    """Give every ReLU twin (when ``relu``) its torch class's own forward (the class after the twin's
    in the MRO); returns how many modules changed."""
    changed = 0
    for module in model.modules():
        if relu and isinstance(module, QReLU):
            torch_class = next(c for c in type(module).__mro__ if c.__module__.startswith("torch.nn"))
            module.forward = types.MethodType(torch_class.forward, module)
            changed += 1
    return changed


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="L0's gap to fp32 and its ReLU twins' share of it.")
    parser.add_argument("model")
    parser.add_argument("image_size", type=int)
    parser.add_argument("batch", type=int)
    parser.add_argument("rounds", type=int)
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device, spec = torch.device(args.device), ModelSpec(args.model)
    images, targets = synthetic_batch(args.batch, args.image_size, spec.num_classes, device, 1)
    steps, changed = {}, {}
    for name, (strategy, relu) in VARIANTS.items():
        torch.manual_seed(0)
        step, _ = build_training_step(strategies.get(strategy), build_model(spec, args.image_size).to(device), device)
        changed[name] = run_as_torch(step.model, relu)
        steps[name] = functools.partial(step, images, targets)
    times = samples_in_turn(steps, args.device, args.rounds, warmup=2)
    command = "python scripts/l0_twin_costs.py " + " ".join(argv)
    for row in ratio_rows(times, args.model, args.batch, args.image_size, args.device, command):
        # a row's strategy is the variant's name
        print(json.dumps({**dataclasses.asdict(row), "threads": torch.get_num_threads(),
                          "modules_run_as_torch": changed[row.strategy]}))


if __name__ == "__main__":
    main(sys.argv[1:])
