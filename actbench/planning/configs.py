"""The configs of the searches (sweep, grid, max-scale, plan): their candidates, points and checks."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from actbench.planning.point import Point
from actbench.planning.settings import MeasureSettings
from actbench.schema import DIMENSIONS, GROWABLE_MODEL, MIN_IMAGE_SIZE, PLAN_DIMENSIONS, InputSize, ModelSpec
from actbench.strategies import Strategy


#: (low, high, step) per dimension: depth = extra bottleneck blocks, width = width_per_group, resolution = pixels
DEFAULT_RANGES: dict[str, tuple[int, int, int]] = {
    "depth": (0, 4096, 1),
    "width": (64, 512, 8),
    "resolution": (224, 768, 32),
}


def names(strategies: tuple[Strategy, ...]) -> tuple[str, ...]:
    """The strategies' names: what a config's identity (and so its run directory's name) records."""
    return tuple(s.name for s in strategies)


def size_identity(size: InputSize) -> dict[str, int]:
    """The size as a config's identity records it: ``image_size`` (the height), and the width and frames
    only when they add something, so square still-image runs keep the names they had."""
    return {k: v for k, v in size.point_fields().items() if v is not None}


@dataclass(frozen=True)
class SweepConfig:
    model: ModelSpec
    strategies: tuple[Strategy, ...]
    batch_sizes: tuple[int, ...]
    size: InputSize
    settings: MeasureSettings
    stop_after: int = 2
    find_max: bool = False

    def identity(self) -> dict[str, Any]:
        return {"command": "sweep-batch", "model": asdict(self.model), "strategies": names(self.strategies),
                "batches": self.batch_sizes, **size_identity(self.size), "stop_after": self.stop_after,
                "find_max": self.find_max, **self.settings.identity()}

    def candidates(self) -> tuple[int, ...]:
        if not self.find_max:
            return self.batch_sizes
        return multiples_of(4, min(self.batch_sizes), max(self.batch_sizes))


@dataclass(frozen=True)
class GridConfig:
    """Every strategy x batch, no early stop: ``throughput`` and ``memory``."""

    command: str
    model: ModelSpec
    strategies: tuple[Strategy, ...]
    batch_sizes: tuple[int, ...]
    size: InputSize
    settings: MeasureSettings

    def identity(self) -> dict[str, Any]:
        return {"command": self.command, "model": asdict(self.model), "strategies": names(self.strategies),
                "batches": self.batch_sizes, **size_identity(self.size), **self.settings.identity()}

    def points(self) -> list[Point]:
        return [self.settings.point(self.model, s, b, self.size) for s in self.strategies for b in self.batch_sizes]


#: plan's batch range (multiples of 4, as in upstream's max-batch search, up to a size no GPU holds)
PLAN_BATCH_RANGE = (4, 16384, 4)
#: The commands that search a range of one dimension for its largest value that fits.
SCALE_COMMANDS = ("max-scale", "plan")


@dataclass(frozen=True)
class ScaleConfig:
    """``max-scale`` (depth, width, resolution, measured or predicted) and ``plan`` (those and the batch,
    predicted under a budget): the largest value of ``dim`` in ``low..high`` per strategy."""

    dim: str
    model_name: str
    strategies: tuple[Strategy, ...]
    batch_size: int
    size: InputSize
    low: int
    high: int
    step: int
    settings: MeasureSettings
    command: str = "max-scale"

    def __post_init__(self) -> None:
        if self.command not in SCALE_COMMANDS:
            raise ValueError(f"a scale search is one of {', '.join(SCALE_COMMANDS)}, got '{self.command}'")
        if self.command == "plan" and self.settings.budget_bytes is None:
            raise ValueError("plan needs a memory budget (--budget, e.g. 16GiB)")
        if self.dim == "resolution" and not self.size.square:
            raise ValueError(f"--dim resolution grows square images; got --image-size {self.size.text()}")

    def identity(self) -> dict[str, Any]:
        return {"command": self.command, "dim": self.dim, "model_name": self.model_name,
                "strategies": names(self.strategies), "batch": self.batch_size, **size_identity(self.size),
                "low": self.low, "high": self.high, "step": self.step, **self.settings.identity()}

    def candidates(self) -> tuple[int, ...]:
        if self.dim != "resolution":
            return tuple(range(self.low, self.high + 1, self.step))
        task, frames = self.point(self.strategies[0], self.low).task, self.size.frames
        sides, side = [], task.next_side(self.model_name, self.low, frames, self.high)
        while side is not None:  # each the next side the model trains at, at least --step past the last
            sides.append(side)
            side = task.next_side(self.model_name, side + self.step, frames, self.high)
        return tuple(sides)

    def side_rule(self) -> str:
        """Why a resolution search's range holds no side the model trains at: its task's rule, at --low."""
        task = self.point(self.strategies[0], self.low).task
        side = max(self.low, MIN_IMAGE_SIZE)
        problem = task.size_problem(self.model_name, InputSize(side, side, self.size.frames))
        return problem or f"sides are at least {MIN_IMAGE_SIZE} px"

    def point(self, strategy: Strategy, value: int) -> Point:
        if self.dim == "batch":
            return self.settings.point(ModelSpec(self.model_name), strategy, value, self.size)
        if self.dim == "depth":
            return self.settings.point(ModelSpec(self.model_name, extra_blocks=value), strategy, self.batch_size,
                                       self.size)
        if self.dim == "width":
            return self.settings.point(ModelSpec(self.model_name, width_per_group=value), strategy, self.batch_size,
                                       self.size)
        return self.settings.point(ModelSpec(self.model_name), strategy, self.batch_size,
                                   InputSize(value, value, self.size.frames))

    def first_guess(self) -> int:
        """Where plan's search starts: the given batch size (dim batch) or the low end of the range."""
        return self.batch_size if self.dim == "batch" else self.low


def plan_defaults(dim: str, low: int | None, high: int | None, step: int | None) -> tuple[int, int, int]:
    if dim == "batch":
        d_low, d_high, d_step = PLAN_BATCH_RANGE
        return (d_low if low is None else low, d_high if high is None else high, d_step if step is None else step)
    return with_defaults(dim, low, high, step)


def validate_plan(cfg: ScaleConfig) -> None:
    if cfg.dim not in PLAN_DIMENSIONS:
        raise ValueError(f"unknown dimension '{cfg.dim}': choose batch, depth, width or resolution")
    if cfg.dim == "batch":
        check_search_range("batch", cfg.low, cfg.high, cfg.step)
        return
    validate_max_scale(cfg)


def validate_max_scale(cfg: ScaleConfig) -> None:
    if cfg.dim not in DIMENSIONS:
        raise ValueError(f"unknown dimension '{cfg.dim}': choose depth, width or resolution")
    if cfg.dim in ("depth", "width") and cfg.model_name != GROWABLE_MODEL:
        raise ValueError(f"--dim {cfg.dim} grows {GROWABLE_MODEL} only, got model '{cfg.model_name}'")
    check_search_range(cfg.dim, cfg.low, cfg.high, cfg.step)
    if cfg.dim == "resolution" and not cfg.candidates():
        raise ValueError(f"--dim resolution: --low {cfg.low} .. --high {cfg.high} holds no side {cfg.model_name} "
                         f"trains at: {cfg.side_rule()}")


def check_search_range(dim: str, low: int, high: int, step: int) -> None:
    """A ValueError naming the bad end or step and what is allowed: ``smallest <= low <= high``, ``step >= 1``
    (depth counts extra blocks, so it starts at 0; the other dimensions at 1)."""
    smallest = 0 if dim == "depth" else 1
    bad = f"bad search range for --dim {dim}:"
    allowed = f"allowed: {smallest} <= --low <= --high, --step >= 1"
    if low < smallest:
        raise ValueError(f"{bad} --low must be at least {smallest}, got {low} ({allowed})")
    if low > high:
        raise ValueError(f"{bad} --low must be at most --high, got --low {low} --high {high} ({allowed})")
    if step < 1:
        raise ValueError(f"{bad} --step must be at least 1, got {step} ({allowed})")


def multiples_of(k: int, lo: int, hi: int) -> tuple[int, ...]:
    """Multiples of ``k`` in [lo, hi]; if none, the nearest one above lo (so a search has a candidate)."""
    first = max(k, math.ceil(lo / k) * k)
    values = tuple(range(first, hi + 1, k))
    return values or (first,)


def with_defaults(dim: str, low: int | None, high: int | None, step: int | None) -> tuple[int, int, int]:
    d_low, d_high, d_step = DEFAULT_RANGES[dim]
    return (d_low if low is None else low, d_high if high is None else high, d_step if step is None else step)
