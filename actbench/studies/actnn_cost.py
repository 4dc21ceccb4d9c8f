"""What ActNN costs in speed: ``actbench bench-actnn``.

Runs ``actbench throughput`` as a user does (a fresh ``python -m actbench`` process per model, a
fresh run directory) for fp32, ActNN L0, L1, L3 and checkpointing, and puts each strategy's images/s
beside fp32's from the same run: the ratio is what a change to the ActNN hot path is judged by.
Targets: L0 >= 0.95x fp32 (it compresses only masks and the pool's window index), L3 >= 0.80x.
The table runs several rounds and reports each ratio's median and range: on a shared machine the
load drifts between one point and the next, which moves one round's ratio by up to 0.15.

``--in-turn`` measures the same table another way: every strategy's training step is built in this
one process, then the steps are timed in turn, one step of each per round, so the load of any
moment reaches every strategy alike; each ratio is the median over rounds of the round's own fp32
step over the strategy's. Steps of one process share its allocator and caches, which separate
processes do not: it is the way to compare two builds of the same code, not what a user's run gets.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

from actbench.studies.harness_cost import _run
from actbench.store.results import RunStore

STRATEGIES = "fp32,L0,L1,L3,checkpoint"
#: (model, batch) at 112 px on cpu: the table ActNN's speed is measured by
CASES: tuple[tuple[str, int], ...] = (("resnet18", 16), ("resnet50", 8))
IMAGE_SIZE = 112
#: a first look in seconds (tests): one small model, tiny images, one timed step
QUICK_CASES: tuple[tuple[str, int], ...] = (("resnet18", 2),)
QUICK_IMAGE_SIZE = 32
QUICK_STRATEGIES = "fp32,L0,L3"
TARGETS = {"L0": 0.95, "L3": 0.80}
#: rounds of ``--in-turn`` unless asked (one step of each strategy a round)
IN_TURN_ROUNDS = 10


@dataclass(frozen=True)
class ActnnBenchRow:
    """One strategy of one model: images/s and its ratio to fp32 measured in the same run."""

    model: str
    batch_size: int
    image_size: int
    device: str
    strategy: str
    images_per_s: float | None  # median over rounds
    images_per_s_iqr: float | None  # of the round whose rate is the median (one round: its own)
    ratio_to_fp32: float | None  # median over rounds of the round's ratio
    target: str
    met: bool | None  # the median ratio against the target
    command: str
    rounds: int = 1
    ratio_min: float | None = None  # the lowest and highest round's ratio
    ratio_max: float | None = None


def throughput_args(model: str, batch_size: int, image_size: int, device: str, strategies: str, quick: bool) -> tuple[str, ...]:
    """The ``actbench throughput`` arguments of one model (serial points: timings must not overlap)."""
    args = ("throughput", model, "--strategies", strategies, "--batch", str(batch_size), "--image-size", str(image_size),
            "--device", device, "--jobs", "1")
    return args + (("--warmup-steps", "1", "--timed-steps", "1") if quick else ())


def bench_model(args: tuple[str, ...], out: Path, log: Callable[[str], None]) -> list[ActnnBenchRow]:
    """Run one throughput command; its rows as ratios to its fp32 row."""
    _run(args, out, log)
    rows = [r for d in sorted(p.parent for p in out.glob("*/rows.jsonl")) for r in RunStore(d).rows]
    if not rows:
        raise RuntimeError(f"bench-actnn: actbench {' '.join(args)} wrote no rows")
    fp32 = next((r.samples_per_s_median for r in rows if r.strategy == "fp32" and r.ok), None)
    result = []
    for r in rows:
        rate = r.samples_per_s_median if r.ok else None
        ratio = rate / fp32 if rate and fp32 else None
        need = TARGETS.get(r.strategy)
        result.append(ActnnBenchRow(
            r.model, r.batch_size, r.image_size, r.device, r.strategy, rate, r.samples_per_s_iqr if r.ok else None,
            None if ratio is None else round(ratio, 3), f">= {need}" if need else "",
            None if need is None or ratio is None else ratio >= need, "actbench " + " ".join(args), 1, ratio, ratio))
    return result


def combine_rounds(rounds: list[list[ActnnBenchRow]]) -> list[ActnnBenchRow]:
    """One row per (model, strategy): the median rate and ratio over the rounds and the ratio's range."""
    combined = []
    for same in zip(*rounds):
        ratios = [r.ratio_to_fp32 for r in same if r.ratio_to_fp32 is not None]
        measured = sorted((r for r in same if r.images_per_s is not None), key=lambda r: r.images_per_s)
        ratio = round(statistics.median(ratios), 3) if ratios else None
        need = TARGETS.get(same[0].strategy)
        combined.append(replace(
            same[0], images_per_s=statistics.median(r.images_per_s for r in measured) if measured else None,
            images_per_s_iqr=measured[len(measured) // 2].images_per_s_iqr if measured else None,
            ratio_to_fp32=ratio, met=None if need is None or ratio is None else ratio >= need, rounds=len(same),
            ratio_min=min(ratios) if ratios else None, ratio_max=max(ratios) if ratios else None))
    return combined


def run(device: str, quick: bool, rounds: int = 1, log: Callable[[str], None] = lambda _: None,
        in_turn: bool = False) -> list[ActnnBenchRow]:
    """Every case's rows, in order, over ``rounds`` rounds (each case once per round, models taking
    turns), measured in a scratch folder (removed afterwards); ``in_turn``: each case's steps timed in
    turn in this process instead (:func:`in_turn_rows`), ``rounds`` steps of each."""
    if rounds < 1:
        raise ValueError(f"bench-actnn: rounds must be at least 1, got {rounds}")
    cases, size, strategies = (QUICK_CASES, QUICK_IMAGE_SIZE, QUICK_STRATEGIES) if quick else (CASES, IMAGE_SIZE, STRATEGIES)
    if in_turn:
        return [row for model, batch_size in cases
                for row in in_turn_rows(model, batch_size, size, device, strategies, rounds, log)]
    measured: list[list[ActnnBenchRow]] = []
    with tempfile.TemporaryDirectory(prefix="actbench-bench-actnn-") as tmp:
        for k in range(rounds):
            rows: list[ActnnBenchRow] = []
            for model, batch_size in cases:
                args = throughput_args(model, batch_size, size, device, strategies, quick)
                if rounds > 1:
                    log(f"round {k + 1} of {rounds}: {model}")
                rows.extend(bench_model(args, Path(tmp) / f"{model}_{batch_size}_{k}", log))
            measured.append(rows)
    return combine_rounds(measured)


def in_turn_rows(model: str, batch_size: int, image_size: int, device: str, strategies: str, rounds: int,
                 log: Callable[[str], None] = lambda _: None) -> list[ActnnBenchRow]:
    """One model's strategies built side by side in this process, then ``rounds`` steps of each timed
    in turn after two warm-up steps (``kernels.bench.samples_in_turn``): the rows of :func:`ratio_rows`."""
    import torch

    from actbench import strategies as registry
    from actbench.kernels.bench import samples_in_turn
    from actbench.schema import ModelSpec
    from actbench.training.models import build_model
    from actbench.training.step import build_training_step, synthetic_batch

    dev, spec = torch.device(device), ModelSpec(model)
    images, targets = synthetic_batch(batch_size, image_size, spec.num_classes, dev, 0)
    steps = {}
    for name in strategies.split(","):
        torch.manual_seed(0)
        steps[name], _ = build_training_step(registry.get(name), build_model(spec, image_size).to(dev), dev)
    log(f"{model}: {rounds} steps of each of {strategies}, in turn")
    samples = samples_in_turn({name: partial(step, images, targets) for name, step in steps.items()},
                              device, rounds, warmup=2)
    command = (f"actbench bench-actnn --in-turn --device {device} --rounds {rounds}: "
               f"{model}, batch {batch_size}, {image_size} px, {strategies}")
    return ratio_rows(samples, model, batch_size, image_size, device, command)


def ratio_rows(samples: dict[str, list[float]], model: str, batch_size: int, image_size: int, device: str,
               command: str) -> list[ActnnBenchRow]:
    """Rows from step seconds taken in turn (sample r of every strategy in round r, fp32 among them):
    images/s from the median step, the ratio the median of each round's fp32 step over the
    strategy's, with the lowest and highest round's."""
    fp32 = samples["fp32"]
    rows = []
    for name, times in samples.items():
        rates = sorted(batch_size / t for t in times)
        quartiles = statistics.quantiles(rates, n=4) if len(rates) > 1 else [rates[0]] * 3
        ratios = [f / t for f, t in zip(fp32, times)]
        ratio = round(statistics.median(ratios), 3)  # judged as printed, as combine_rounds judges it
        need = TARGETS.get(name)
        rows.append(ActnnBenchRow(
            model, batch_size, image_size, device, name, batch_size / statistics.median(times),
            quartiles[2] - quartiles[0], ratio, f">= {need}" if need else "",
            None if need is None else ratio >= need, command, len(times),
            round(min(ratios), 3), round(max(ratios), 3)))  # rounded alike, so the median lies between
    return rows
