"""Searches over points (DESIGN.md §5): linear batch scan, binary searches for the largest that fits.

Configs are frozen dataclasses built by the CLI; execution goes through a ``run`` callable (normally
``PointRunner.run``) so searches neither know nor care whether a point was measured now or resumed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from actbench.measure.point import PointConfig
from actbench.models import GROWABLE_MODEL, ModelSpec
from actbench.results import ResultRow

RunPoint = Callable[[PointConfig], ResultRow]

DIMENSIONS = ("depth", "width", "resolution")
#: (low, high, step) per dimension: depth = extra bottleneck blocks, width = width_per_group, resolution = pixels
DEFAULT_RANGES: dict[str, tuple[int, int, int]] = {
    "depth": (0, 4096, 1),
    "width": (64, 512, 8),
    "resolution": (224, 768, 32),
}


@dataclass(frozen=True)
class MeasureSettings:
    """How each point is measured (shared by every command)."""

    device: str = "cpu"
    budget_bytes: int | None = None
    warmup_steps: int = 1
    timed_steps: int = 3
    checkpoint_segments: int | None = None
    timeout_s: float = 1800.0

    def point(self, model: ModelSpec, strategy: str, batch: int, image_size: int) -> PointConfig:
        return PointConfig(model=model, strategy=strategy, batch_size=batch, image_size=image_size,
                           device=self.device, budget_bytes=self.budget_bytes, warmup_steps=self.warmup_steps,
                           timed_steps=self.timed_steps, checkpoint_segments=self.checkpoint_segments)

    def identity(self) -> dict[str, Any]:
        """What makes results differ (the timeout does not)."""
        data = asdict(self)
        data.pop("timeout_s")
        return data


@dataclass(frozen=True)
class SweepConfig:
    model: ModelSpec
    strategies: tuple[str, ...]
    batches: tuple[int, ...]
    image_size: int
    settings: MeasureSettings
    stop_after: int = 2
    find_max: bool = False

    def identity(self) -> dict[str, Any]:
        return {"command": "sweep-batch", "model": asdict(self.model), "strategies": self.strategies,
                "batches": self.batches, "image_size": self.image_size, "stop_after": self.stop_after,
                "find_max": self.find_max, **self.settings.identity()}

    def candidates(self) -> tuple[int, ...]:
        if not self.find_max:
            return self.batches
        return multiples_of(4, min(self.batches), max(self.batches))


@dataclass(frozen=True)
class GridConfig:
    """Every strategy x batch, no early stop: ``throughput`` and ``memory``."""

    command: str
    model: ModelSpec
    strategies: tuple[str, ...]
    batches: tuple[int, ...]
    image_size: int
    settings: MeasureSettings

    def identity(self) -> dict[str, Any]:
        return {"command": self.command, "model": asdict(self.model), "strategies": self.strategies,
                "batches": self.batches, "image_size": self.image_size, **self.settings.identity()}

    def points(self) -> list[PointConfig]:
        return [self.settings.point(self.model, s, b, self.image_size) for s in self.strategies for b in self.batches]


@dataclass(frozen=True)
class MaxScaleConfig:
    dim: str
    model_name: str
    strategies: tuple[str, ...]
    batch: int
    image_size: int
    low: int
    high: int
    step: int
    settings: MeasureSettings

    def identity(self) -> dict[str, Any]:
        return {"command": "max-scale", **{k: v for k, v in asdict(self).items() if k != "settings"},
                **self.settings.identity()}

    def candidates(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))

    def point(self, strategy: str, value: int) -> PointConfig:
        if self.dim == "depth":
            return self.settings.point(ModelSpec(self.model_name, extra_blocks=value), strategy, self.batch, self.image_size)
        if self.dim == "width":
            return self.settings.point(ModelSpec(self.model_name, width_per_group=value), strategy, self.batch,
                                       self.image_size)
        return self.settings.point(ModelSpec(self.model_name), strategy, self.batch, value)


def validate_max_scale(cfg: MaxScaleConfig) -> None:
    if cfg.dim not in DIMENSIONS:
        raise ValueError(f"unknown dimension '{cfg.dim}': choose depth, width or resolution")
    if cfg.dim in ("depth", "width") and cfg.model_name != GROWABLE_MODEL:
        raise ValueError(f"--dim {cfg.dim} grows {GROWABLE_MODEL} only, got model '{cfg.model_name}'")
    if cfg.step <= 0 or cfg.low > cfg.high or (cfg.dim != "depth" and cfg.low <= 0) or cfg.low < 0:
        raise ValueError(f"bad search range low={cfg.low} high={cfg.high} step={cfg.step} for --dim {cfg.dim}")


def multiples_of(k: int, lo: int, hi: int) -> tuple[int, ...]:
    """Multiples of ``k`` in [lo, hi]; if none, the nearest one above lo (so a search has a candidate)."""
    first = max(k, math.ceil(lo / k) * k)
    values = tuple(range(first, hi + 1, k))
    return values or (first,)


def binary_search_largest(candidates: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """Largest candidate that fits, assuming fitting is monotone (all fit up to some point); None if none."""
    lo, hi = -1, len(candidates)  # candidates[lo] fits (or lo = -1), candidates[hi] fails (or hi = len)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            lo = mid
        else:
            hi = mid
    return candidates[lo] if lo >= 0 else None


def search_probes(n_candidates: int) -> int:
    """Upper bound of points a binary search over ``n_candidates`` measures."""
    return max(1, math.ceil(math.log2(n_candidates + 1)))


@dataclass
class SearchOutcome:
    """Rows measured (or resumed) and, for searches, the largest fitting value per strategy."""

    rows: list[ResultRow] = field(default_factory=list)
    maxima: dict[str, int | None] = field(default_factory=dict)
    best_rows: dict[str, ResultRow | None] = field(default_factory=dict)


def linear_scan(points: Sequence[PointConfig], run: RunPoint, stop_after: int) -> list[ResultRow]:
    """Measure points in order, stopping after ``stop_after`` consecutive failures."""
    rows: list[ResultRow] = []
    failures = 0
    for point in points:
        row = run(point)
        rows.append(row)
        failures = 0 if row.ok else failures + 1
        if failures >= stop_after:
            break
    return rows


def run_sweep(cfg: SweepConfig, run: RunPoint) -> SearchOutcome:
    outcome = SearchOutcome()
    for strategy in cfg.strategies:
        def point_for(batch: int, s: str = strategy) -> PointConfig:
            return cfg.settings.point(cfg.model, s, batch, cfg.image_size)

        if cfg.find_max:
            best = _binary(cfg.candidates(), point_for, run, outcome.rows)
        else:
            rows = linear_scan([point_for(b) for b in cfg.batches], run, cfg.stop_after)
            outcome.rows.extend(rows)
            ok = [r for r in rows if r.ok]
            best = max(ok, key=lambda r: r.batch_size) if ok else None
        outcome.best_rows[strategy] = best
        outcome.maxima[strategy] = best.batch_size if best else None
    return outcome


def run_max_scale(cfg: MaxScaleConfig, run: RunPoint) -> SearchOutcome:
    outcome = SearchOutcome()
    for strategy in cfg.strategies:
        best = _binary(cfg.candidates(), lambda v, s=strategy: cfg.point(s, v), run, outcome.rows)
        outcome.best_rows[strategy] = best
        outcome.maxima[strategy] = _dim_value(cfg.dim, best) if best else None
    return outcome


def run_grid(cfg: GridConfig, run: RunPoint) -> SearchOutcome:
    return SearchOutcome(rows=[run(p) for p in cfg.points()])


def _binary(candidates: Sequence[int], point_for: Callable[[int], PointConfig], run: RunPoint,
            sink: list[ResultRow]) -> ResultRow | None:
    found: dict[int, ResultRow] = {}

    def fits(value: int) -> bool:
        row = run(point_for(value))
        sink.append(row)
        found[value] = row
        return row.ok

    best = binary_search_largest(candidates, fits)
    return found[best] if best is not None else None


def _dim_value(dim: str, row: ResultRow) -> int:
    if dim == "depth":
        return row.extra_blocks
    if dim == "width":
        return row.width_per_group or 64
    return row.image_size


def with_defaults(dim: str, low: int | None, high: int | None, step: int | None) -> tuple[int, int, int]:
    d_low, d_high, d_step = DEFAULT_RANGES[dim]
    return (d_low if low is None else low, d_high if high is None else high, d_step if step is None else step)


__all__ = [
    "MeasureSettings", "SweepConfig", "GridConfig", "MaxScaleConfig", "SearchOutcome", "binary_search_largest",
    "linear_scan", "run_sweep", "run_max_scale", "run_grid", "multiples_of", "search_probes",
]
