"""Searches over points (docs/design.md §5): linear batch scan, binary searches for the largest that fits.

Configs are frozen dataclasses built by the CLI; execution goes through a ``run`` callable (normally
``PointRunner.run``) so searches neither know nor care whether a point was measured now or resumed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from actbench.devices import profile
from actbench.schema import (DEFAULT_TIMEOUT_S, DIMENSIONS, GROWABLE_MODEL, MEMORY_FAILURES, PLAN_DIMENSIONS,
                             ModelSpec, PointConfig, ResultRow)

RunPoint = Callable[[PointConfig], ResultRow]

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
    timeout_s: float = DEFAULT_TIMEOUT_S

    def point(self, model: ModelSpec, strategy: str, batch: int, image_size: int) -> PointConfig:
        return PointConfig(model=model, strategy=strategy, batch_size=batch, image_size=image_size,
                           device=self.device, budget_bytes=self.budget_bytes, warmup_steps=self.warmup_steps,
                           timed_steps=self.timed_steps, checkpoint_segments=self.checkpoint_segments)

    def identity(self) -> dict[str, Any]:
        """What makes results differ (the timeout does not)."""
        data = asdict(self)
        data.pop("timeout_s")
        return data

    @classmethod
    def resolve(cls, device: str, command: str, budget_bytes: int | None = None, warmup_steps: int | None = None,
                timed_steps: int | None = None, checkpoint_segments: int | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> "MeasureSettings":
        """Settings with each step count left as None filled with the device's default.

        The defaults are the device profile's (cuda warms up 3 steps and times 10: kernels autotune
        and the allocator settles; cpu 1 and 3: a step costs seconds; meta one untimed step: no
        compute); ``memory`` times nothing. The CLI and experiment files both come through here, so
        the same options name the same run.
        """
        warmup_steps, timed_steps = profile(device).resolve_steps(command, warmup_steps, timed_steps)
        return cls(device=device, budget_bytes=budget_bytes, warmup_steps=warmup_steps, timed_steps=timed_steps,
                   checkpoint_segments=checkpoint_segments, timeout_s=timeout_s)


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


#: plan's batch range (multiples of 4, as in upstream's max-batch search, up to a size no GPU holds)
PLAN_BATCH_RANGE = (4, 16384, 4)


@dataclass(frozen=True)
class PlanConfig:
    """``actbench plan``: the predicted largest batch/depth/width/resolution per strategy, on meta."""

    dim: str
    model_name: str
    strategies: tuple[str, ...]
    batch: int
    image_size: int
    low: int
    high: int
    step: int
    settings: MeasureSettings

    def __post_init__(self) -> None:
        if self.settings.budget_bytes is None:
            raise ValueError("plan needs a memory budget (--budget, e.g. 16GiB)")

    def identity(self) -> dict[str, Any]:
        return {"command": "plan", **{k: v for k, v in asdict(self).items() if k != "settings"},
                **self.settings.identity()}

    def candidates(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))

    def as_max_scale(self) -> MaxScaleConfig:
        """The same search as a max-scale config (dims depth, width, resolution share its points and checks)."""
        return MaxScaleConfig(self.dim, self.model_name, self.strategies, self.batch, self.image_size, self.low,
                              self.high, self.step, self.settings)

    def point(self, strategy: str, value: int) -> PointConfig:
        if self.dim == "batch":
            return self.settings.point(ModelSpec(self.model_name), strategy, value, self.image_size)
        return self.as_max_scale().point(strategy, value)

    def first_guess(self) -> int:
        """Where each search starts: the given batch (dim batch) or the low end of the range."""
        return self.batch if self.dim == "batch" else self.low


def plan_defaults(dim: str, low: int | None, high: int | None, step: int | None) -> tuple[int, int, int]:
    if dim == "batch":
        d_low, d_high, d_step = PLAN_BATCH_RANGE
        return (d_low if low is None else low, d_high if high is None else high, d_step if step is None else step)
    return with_defaults(dim, low, high, step)


def validate_plan(cfg: PlanConfig) -> None:
    if cfg.dim not in PLAN_DIMENSIONS:
        raise ValueError(f"unknown dimension '{cfg.dim}': choose batch, depth, width or resolution")
    if cfg.dim == "batch":
        if cfg.step <= 0 or cfg.low <= 0 or cfg.low > cfg.high:
            raise ValueError(f"bad search range low={cfg.low} high={cfg.high} step={cfg.step} for --dim batch")
        return
    validate_max_scale(cfg.as_max_scale())


class _SearchFailed(Exception):
    """A probe neither fitted nor exceeded the budget (error, timeout): the search cannot go on."""


def run_plan(cfg: PlanConfig, run: RunPoint) -> SearchOutcome:
    """Per strategy, :func:`predictive_search_largest` over the candidates (each probe a point).

    A probe that errs (a model that cannot run on fake tensors) ends that strategy's search with no
    maximum; its row says why.
    """
    outcome = SearchOutcome(dim=cfg.dim)
    budget = cfg.settings.budget_bytes
    for strategy in cfg.strategies:
        found: dict[int, ResultRow] = {}

        def probe(value: int, s: str = strategy) -> tuple[bool, int | None]:
            row = run(cfg.point(s, value))
            outcome.rows.append(row)
            found[value] = row
            if not row.ok and row.status not in MEMORY_FAILURES:
                raise _SearchFailed(row.message)
            return row.ok, row.peak_alloc_bytes

        def model_bytes() -> int:  # batch 0 would still hold the model (parameters, gradients, state)
            rows = [r for r in found.values() if r.model_bytes is not None]
            return rows[0].model_bytes if rows and cfg.dim == "batch" else 0

        try:
            best = predictive_search_largest(cfg.candidates(), probe, budget, first=cfg.first_guess(),
                                             intercept=model_bytes)
        except _SearchFailed:
            best = None
        row = found.get(best) if best is not None else None
        outcome.best_rows[strategy] = row
        outcome.maxima[strategy] = None if row is None else outcome.value_of(row)
    return outcome


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


def predictive_search_largest(candidates: Sequence[int], probe: Callable[[int], tuple[bool, int | None]],
                              budget: int, first: int | None = None, max_guesses: int = 4,
                              intercept: Callable[[], int] = lambda: 0) -> int | None:
    """Largest candidate that fits, guessing where peak bytes cross ``budget`` before bisecting.

    ``probe(value)`` -> (fits, peak bytes or None). Peak memory is close to affine in batch size and
    depth (and smooth in width and resolution), so a secant through the two probes nearest the
    budget lands on, or next to, the answer: a search usually costs 3-4 probes instead of
    log2(len(candidates)). After ``max_guesses`` guesses (or without peaks to interpolate) the
    remaining bracket goes to :func:`binary_search_largest`. The answer is always certified by
    probes: it fits and the next candidate fails (or it is the last candidate). ``intercept()``: the
    bytes a value of 0 would take (the model's bytes for a batch search), for the one-probe guess.
    """
    fits_at: dict[int, bool] = {}
    peaks: dict[int, int] = {}

    def run(i: int) -> bool:
        if i not in fits_at:
            ok, peak = probe(candidates[i])
            fits_at[i] = ok
            if peak is not None:
                peaks[i] = peak
        return fits_at[i]

    def bracket() -> tuple[int, int]:
        lo = max((i for i, ok in fits_at.items() if ok), default=-1)
        hi = min((i for i, ok in fits_at.items() if not ok), default=len(candidates))
        return lo, hi

    start = 0 if first is None else min(range(len(candidates)), key=lambda i: abs(candidates[i] - first))
    run(start)
    for _ in range(max_guesses):
        lo, hi = bracket()
        if hi - lo <= 1:
            break
        guess = _secant_guess(candidates, peaks, budget, intercept())
        if guess is None:
            break
        # Probe the guess, kept strictly inside the open bracket so every probe narrows it.
        run(min(max(guess, lo + 1), hi - 1))
    lo, hi = bracket()
    if hi - lo > 1:
        inner = binary_search_largest(range(lo + 1, hi), run)
        lo = inner if inner is not None else lo
    return candidates[lo] if lo >= 0 else None


def _secant_guess(candidates: Sequence[int], peaks: dict[int, int], budget: int, base: int = 0) -> int | None:
    """Index of the largest candidate whose interpolated peak stays within budget (None: no line)."""
    if not peaks:
        return None
    # The two probes nearest the budget (one below and one above when there are).
    ordered = sorted(peaks, key=lambda i: abs(peaks[i] - budget))
    below = [i for i in ordered if peaks[i] <= budget]
    above = [i for i in ordered if peaks[i] > budget]
    pair = [below[0], above[0]] if below and above else ordered[:2]
    if len(pair) < 2:
        # One probe: a line through (0, base) for a first guess.
        (i,) = pair
        if candidates[i] <= 0 or peaks[i] <= base:
            return None
        target = candidates[i] * (budget - base) / (peaks[i] - base)
    else:
        (i, j) = sorted(pair)
        dv, dp = candidates[j] - candidates[i], peaks[j] - peaks[i]
        if dv == 0 or dp <= 0:
            return None
        target = candidates[i] + (budget - peaks[i]) * dv / dp
    index = max((k for k, v in enumerate(candidates) if v <= target), default=0)
    return index


def search_probes(n_candidates: int) -> int:
    """Upper bound of points a binary search over ``n_candidates`` measures."""
    return max(1, math.ceil(math.log2(n_candidates + 1)))


@dataclass
class SearchOutcome:
    """Rows measured (or resumed) and, for searches, the largest fitting value per strategy."""

    rows: list[ResultRow] = field(default_factory=list)
    maxima: dict[str, int | None] = field(default_factory=dict)
    best_rows: dict[str, ResultRow | None] = field(default_factory=dict)
    dim: str = "batch"  # what the maxima count: batch, or max-scale's depth/width/resolution

    def value_of(self, row: ResultRow) -> int:
        return row.batch_size if self.dim == "batch" else _dim_value(self.dim, row)

    def bounded(self, strategy: str) -> bool:
        """Whether a larger value of ``strategy`` was seen not fitting (oom, over budget).

        If not, the maximum is only a lower bound: everything tried up to it fit (or failed for
        another reason), and the memory limit lies beyond the range searched.
        """
        best = self.maxima.get(strategy)
        return any(r.strategy == strategy and r.status in MEMORY_FAILURES and (best is None or self.value_of(r) > best)
                   for r in self.rows)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per strategy: the maximum, whether it is bounded, and its row's key (``summary.json``)."""
        return {s: {"max": v, "bounded": self.bounded(s),
                    "key": (self.best_rows[s].key if self.best_rows.get(s) else None)}
                for s, v in self.maxima.items()}


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
    outcome = SearchOutcome(dim=cfg.dim)
    for strategy in cfg.strategies:
        best = _binary(cfg.candidates(), lambda v, s=strategy: cfg.point(s, v), run, outcome.rows)
        outcome.best_rows[strategy] = best
        outcome.maxima[strategy] = outcome.value_of(best) if best else None
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
    "predictive_search_largest", "PlanConfig", "run_plan",
]
