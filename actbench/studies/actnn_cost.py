"""What ActNN costs in speed: ``actbench bench-actnn``.

Runs ``actbench throughput`` as a user does (a fresh ``python -m actbench`` process per model, a
fresh run directory) for fp32, ActNN L0, L1, L3 and checkpointing, and puts each strategy's images/s
beside fp32's from the same run: the ratio is what a change to the ActNN hot path is judged by.
Targets: L0 >= 0.95x fp32 (it compresses only masks and the pool's window index), L3 >= 0.80x.
The table runs several rounds and reports each ratio's median and range: on a shared machine the
load drifts between one point and the next, which moves one round's ratio by up to 0.15.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, replace
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


def run(device: str, quick: bool, rounds: int = 1, log: Callable[[str], None] = lambda _: None) -> list[ActnnBenchRow]:
    """Every case's rows, in order, over ``rounds`` rounds (each case once per round, models taking
    turns), measured in a scratch folder (removed afterwards)."""
    if rounds < 1:
        raise ValueError(f"bench-actnn: rounds must be at least 1, got {rounds}")
    cases, size, strategies = (QUICK_CASES, QUICK_IMAGE_SIZE, QUICK_STRATEGIES) if quick else (CASES, IMAGE_SIZE, STRATEGIES)
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
