"""How far ``meta`` predictions are from measurements: the same points on meta and on cpu or cuda.

``actbench trust --device cuda`` writes ``meta_vs_<device>.csv`` (one row per point: both byte
counts and their ratio meta / measured; ``meta_vs_<device>_<precision>.csv`` at bf16 or fp16, where
both sides run under the same autocast); ``tests/test_meta.py`` holds the cpu ratios within 5%. On
cuda the peak ratio includes what cuDNN workspaces add, which meta does not see; ``reserved_ratio``
compares meta's caching-allocator model (docs/design.md §10, no GPU profile: no cuBLAS workspaces)
with the allocator's measured reserved peak. Points are measured in this process (the in-process
executor, no child per point).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from actbench.devices import PROFILES
from actbench.executors import InProcessExecutor
from actbench.schema import DEFAULT_PRECISION, Measurement, ModelSpec, PointConfig

TRUST_MODELS = ("resnet18", "resnet50", "densenet121", "mobilenet_v2")
TRUST_STRATEGIES = ("fp32", "checkpoint", "L2", "L3")


@dataclass(frozen=True)
class Comparison:
    """One point on meta and on ``device``; ratios are meta / measured (None when not measured)."""

    model: str
    strategy: str
    batch_size: int
    image_size: int
    device: str
    meta_status: str
    measured_status: str
    meta_activation_bytes: int | None
    measured_activation_bytes: int | None
    meta_peak_alloc_bytes: int | None
    measured_peak_alloc_bytes: int | None
    measured_reserved_bytes: int | None
    message: str
    precision: str = DEFAULT_PRECISION
    meta_reserved_bytes: int | None = None

    @property
    def activation_ratio(self) -> float | None:
        return _ratio(self.meta_activation_bytes, self.measured_activation_bytes)

    @property
    def peak_ratio(self) -> float | None:
        return _ratio(self.meta_peak_alloc_bytes, self.measured_peak_alloc_bytes)

    @property
    def reserved_ratio(self) -> float | None:
        """meta's modelled reserved peak / the caching allocator's (None off cuda: nothing reserves there)."""
        return _ratio(self.meta_reserved_bytes, self.measured_reserved_bytes)


def _ratio(a: int | None, b: int | None) -> float | None:
    return None if a is None or not b else a / b


#: The device whose points are predictions (meta).
PREDICTING_DEVICE = next(name for name, p in PROFILES.items() if p.predicts)


def compare(device: str, models=TRUST_MODELS, strategies=TRUST_STRATEGIES, batch_size: int = 2,
            image_size: int = 32, on_point: Callable[[Comparison], None] | None = None,
            precision: str = DEFAULT_PRECISION) -> list[Comparison]:
    """Measure every (model, strategy) on meta and on ``device`` (memory only, no timed steps), both
    at ``precision``."""
    executor = InProcessExecutor()  # an exception becomes an ``error`` measurement: one bad point ends nothing
    out = []
    for model in models:
        for strategy in strategies:
            predicted = PointConfig(ModelSpec(model), strategy, batch_size, image_size, PREDICTING_DEVICE,
                                    timed_steps=0, precision=precision)
            measured = PointConfig(ModelSpec(model), strategy, batch_size, image_size, device, warmup_steps=1,
                                   timed_steps=0, precision=precision)
            meta, real = executor.measure([predicted, measured])
            out.append(Comparison(model, strategy, batch_size, image_size, device, meta.status, real.status,
                                  meta.activation_bytes, real.activation_bytes, meta.peak_alloc_bytes,
                                  real.peak_alloc_bytes, real.reserved_bytes, (meta.message or real.message)[:120],
                                  precision, meta.reserved_bytes))
            if on_point is not None:
                on_point(out[-1])
    return out


def csv_name(device: str, precision: str = DEFAULT_PRECISION) -> str:
    """``meta_vs_<device>.csv``; another precision than fp32 gets its own file (fp32's name as before)."""
    return f"meta_vs_{device}.csv" if precision == DEFAULT_PRECISION else f"meta_vs_{device}_{precision}.csv"


def write_csv(rows: list[Comparison], path: Path) -> None:
    """Columns as before precision existed, then ``precision``, then the reserved-bytes comparison (readers by
    position keep working)."""
    later = ("precision", "meta_reserved_bytes")
    fields = [n for n in Comparison.__dataclass_fields__ if n not in later]
    names = fields + ["activation_ratio", "peak_ratio", *later, "reserved_ratio"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for r in rows:
            writer.writerow(["" if (v := getattr(r, n)) is None else (f"{v:.4f}" if isinstance(v, float) else v)
                             for n in names])
