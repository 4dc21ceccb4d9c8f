"""What ActNN costs in speed: ``actbench bench-actnn``.

Runs ``actbench throughput`` as a user does (a fresh ``python -m actbench`` process per model, a
fresh run directory) for fp32, ActNN L0, L1, L3 and checkpointing, and puts each strategy's images/s
beside fp32's from the same run: the ratio is what a change to the ActNN hot path is judged by.
Targets: L0 >= 0.95x fp32 (it compresses only masks and the pool's window index), L3 >= 0.80x.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
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
    images_per_s: float | None
    images_per_s_iqr: float | None
    ratio_to_fp32: float | None
    target: str
    met: bool | None
    command: str


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
            None if need is None or ratio is None else ratio >= need, "actbench " + " ".join(args)))
    return result


def run(device: str, quick: bool, log: Callable[[str], None] = lambda _: None) -> list[ActnnBenchRow]:
    """Every case's rows, in order, measured in a scratch folder (removed afterwards)."""
    cases, size, strategies = (QUICK_CASES, QUICK_IMAGE_SIZE, QUICK_STRATEGIES) if quick else (CASES, IMAGE_SIZE, STRATEGIES)
    rows: list[ActnnBenchRow] = []
    with tempfile.TemporaryDirectory(prefix="actbench-bench-actnn-") as tmp:
        for model, batch_size in cases:
            args = throughput_args(model, batch_size, size, device, strategies, quick)
            rows.extend(bench_model(args, Path(tmp) / f"{model}_{batch_size}", log))
    return rows
