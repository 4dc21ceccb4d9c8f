"""Searches over points (docs/design.md §5): linear batch scan, and model-guided searches for the largest that
fits (fit how the peak grows, jump to the predicted limit, confirm around it; bisection when the fit is poor).

Configs are frozen dataclasses built by the CLI; execution goes through a ``run`` callable (normally
``PointRunner.run``) so searches neither know nor care whether a point was measured now or resumed.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from actbench.devices import profile
from actbench.schema import (DEFAULT_PRECISION, DEFAULT_TIMEOUT_S, DIMENSIONS, GROWABLE_MODEL, MEMORY_FAILURES,
                             PLAN_DIMENSIONS, ModelSpec, PointConfig, ResultRow)

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
    precision: str = DEFAULT_PRECISION
    #: GPU profile planned for (actbench/gpus.py; budget_bytes is then its usable memory), None: none
    gpu: str | None = None
    host_budget_bytes: int | None = None

    def point(self, model: ModelSpec, strategy: str, batch: int, image_size: int) -> PointConfig:
        return PointConfig(model=model, strategy=strategy, batch_size=batch, image_size=image_size,
                           device=self.device, budget_bytes=self.budget_bytes, warmup_steps=self.warmup_steps,
                           timed_steps=self.timed_steps, checkpoint_segments=self.checkpoint_segments,
                           precision=self.precision, gpu=self.gpu, host_budget_bytes=self.host_budget_bytes)

    def identity(self) -> dict[str, Any]:
        """What makes results differ (the timeout does not). fp32, and a GPU profile or host budget not
        given, are left out, so the run directories named before they existed keep their names."""
        data = asdict(self)
        data.pop("timeout_s")
        if data["precision"] == DEFAULT_PRECISION:
            data.pop("precision")
        for name in ("gpu", "host_budget_bytes"):
            if data[name] is None:
                data.pop(name)
        return data

    @classmethod
    def resolve(cls, device: str, command: str, budget_bytes: int | None = None, warmup_steps: int | None = None,
                timed_steps: int | None = None, checkpoint_segments: int | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S, precision: str = DEFAULT_PRECISION, gpu: str | None = None,
                host_budget_bytes: int | None = None) -> "MeasureSettings":
        """Settings with each step count left as None filled with the device's default.

        The defaults are the device profile's (cuda warms up 3 steps and times 10: kernels autotune
        and the allocator settles; cpu 1 and 3: a step costs seconds; meta one untimed step: no
        compute); ``memory`` times nothing. The CLI and experiment files both come through here, so
        the same options name the same run.
        """
        warmup_steps, timed_steps = profile(device).resolve_steps(command, warmup_steps, timed_steps)
        return cls(device=device, budget_bytes=budget_bytes, warmup_steps=warmup_steps, timed_steps=timed_steps,
                   checkpoint_segments=checkpoint_segments, timeout_s=timeout_s, precision=precision, gpu=gpu,
                   host_budget_bytes=host_budget_bytes)


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
        check_search_range("batch", cfg.low, cfg.high, cfg.step)
        return
    validate_max_scale(cfg.as_max_scale())


class _SearchFailed(Exception):
    """A probe neither fitted nor exceeded the budget (error, timeout): the search cannot go on."""


def run_plan(cfg: PlanConfig, run: RunPoint) -> SearchOutcome:
    """Per strategy, :func:`guided_search_largest` over the candidates (each probe a point).

    A probe that errs (a model that cannot run on fake tensors) ends that strategy's search with no
    maximum; its row says why.
    """
    outcome = SearchOutcome(dim=cfg.dim)
    for strategy in cfg.strategies:
        _search_strategy(outcome, strategy, cfg.candidates(), lambda v, s=strategy: cfg.point(s, v), run,
                         cfg.settings.budget_bytes, first=cfg.first_guess(), stop_on_error=True)
    return outcome


def validate_max_scale(cfg: MaxScaleConfig) -> None:
    if cfg.dim not in DIMENSIONS:
        raise ValueError(f"unknown dimension '{cfg.dim}': choose depth, width or resolution")
    if cfg.dim in ("depth", "width") and cfg.model_name != GROWABLE_MODEL:
        raise ValueError(f"--dim {cfg.dim} grows {GROWABLE_MODEL} only, got model '{cfg.model_name}'")
    check_search_range(cfg.dim, cfg.low, cfg.high, cfg.step)


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


# --- model-guided search (docs/design.md §5) ------------------------------------------------------

#: A guided search that has not certified its answer after this many probes bisects what is left.
MAX_GUIDED_PROBES = 8
#: A probe whose peak misses the fitted curve's prediction by more than this fraction of the budget,
#: twice, means the curve does not describe the peak (a step change): the rest is bisected.
POOR_FIT_TOLERANCE = 0.05
#: Layers one extra bottleneck block adds to ResNet-152 (rows report the real depth, §5).
LAYERS_PER_EXTRA_BLOCK = 3

#: A probe's outcome for the searches: (fits, peak bytes or None). A peak comes with rows that fit
#: and with over-budget rows (cpu, meta); a cuda out-of-memory row has none.
Probe = Callable[[int], tuple[bool, "int | None"]]


@dataclass(frozen=True)
class SearchTrace:
    """How one search reached its answer, for ``summary.json``.

    ``method``: ``model-guided`` (the answer was certified by probes a fitted curve chose),
    ``bisection`` (the curve was given up, ``fallback`` says why; or there was no budget to aim at)
    or ``scan`` (sweep-batch's list, in order). ``probes``: the points the search asked for
    (measured now or resumed; each is a row). ``fit``: the curve fitted to the peaks (``a +
    b·batch``, ...), None when nothing was fitted.
    """

    method: str
    probes: int
    fit: str | None = None
    fallback: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "probes": self.probes, "fit": self.fit, "fallback": self.fallback}


@dataclass(frozen=True)
class _Fit:
    """peak = c0 + c1·x (+ c2·x²), through ``probes`` probes (1: one probe and the anchor)."""

    coef: tuple[float, ...]
    probes: int

    def at(self, x: float) -> float:
        return sum(c * x**k for k, c in enumerate(self.coef))

    def crossing(self, budget: int, near: float) -> float | None:
        """Where the peak reaches ``budget`` while rising (the root nearest ``near``); None if nowhere."""
        c0, c1, *rest = self.coef
        c2 = rest[0] if rest else 0.0
        if abs(c2) * max(abs(near), 1.0) <= 1e-12 * abs(c1):
            return (budget - c0) / c1 if c1 > 0 else None
        disc = c1 * c1 - 4 * c2 * (c0 - budget)
        if disc < 0:
            return None
        q = -0.5 * (c1 + math.copysign(math.sqrt(disc), c1))  # the two roots without cancellation
        roots = [q / c2] + ([(c0 - budget) / q] if q else [])
        rising = [r for r in roots if c1 + 2 * c2 * r > 0]
        return min(rising, key=lambda r: abs(r - near)) if rising else None


def guided_search_largest(candidates: Sequence[int], probe: Probe, budget: int | None, *,
                          feature: Callable[[int], float] = float, degree: int = 1, first: int | None = None,
                          anchor: Callable[[], "tuple[float, float] | None"] = lambda: None, fit: str | None = None,
                          scout: float = 1.0, max_probes: int = MAX_GUIDED_PROBES,
                          tolerance: float = POOR_FIT_TOLERANCE,
                          together: "Callable[[Sequence[int]], list[tuple[bool, int | None]] | None] | None" = None,
                          ) -> tuple[int | None, SearchTrace]:
    """Largest candidate whose probe fits, from a curve fitted to the peaks seen -> (answer, trace).

    ``probe(value)`` -> (fits, peak bytes or None); each value is probed at most once. Peak memory
    grows along a known curve in ``feature(value)`` (degree 1: a line in the batch, the depth or the
    side²; degree 2: a parabola in the width), so (docs/design.md §5): probe ``first`` (default:
    the smallest candidate); jump to where a line through it and ``anchor()`` (an (x, bytes)
    point, such as (0, parameter + gradient bytes)) crosses ``budget`` (or only ``scout`` of the way
    there, where a probe costs more the larger the value); refit through the probes
    whose peaks are nearest the budget and probe the predicted answer, then its neighbour, until a
    candidate fits and the next fails (or it is the last). The answer is that certified
    candidate: under monotone fitting, exactly the one :func:`binary_search_largest` returns.

    Guard rails (``trace.method`` becomes ``bisection``, ``trace.fallback`` says why): peaks that
    fall as the value grows, or a fitting value above a failing one (non-monotone) -> plain
    bisection over all candidates (probes already made are reused), so the answer is bisection's
    whatever the function; twice a peak off the prediction by more than ``tolerance`` x budget (a
    step change), or no certified answer after ``max_probes`` probes -> bisection of the open
    bracket left. Without a budget there is nothing to aim at: plain bisection.

    ``together(values)``: probes several values side by side, or None when no slot is spare. Then
    the first curve fitted through probes alone (two for a line, three for a parabola) has its
    predicted answer probed with the neighbour that would certify it (the one below when the
    crossing lies in the lower half of the step, where the answer may well be one less; else the
    one above), so certifying costs one probe's time instead of two. Once per search: when the side
    is guessed wrong, the extra probe is a row like any other and the search goes on one probe at a
    time; the answer is the same.
    """
    search = _GuidedSearch(tuple(candidates), probe, feature, degree, anchor, fit, scout, max_probes, tolerance,
                           together)
    return search.largest(budget, first)


@dataclass
class _GuidedSearch:
    """One model-guided search's state: what each probed candidate (by index) gave, and its guesses."""

    candidates: tuple[int, ...]
    probe: Probe
    feature: Callable[[int], float]
    degree: int
    anchor: Callable[[], "tuple[float, float] | None"]
    fit: str | None
    scout: float
    max_probes: int
    tolerance: float
    together: "Callable[[Sequence[int]], list[tuple[bool, int | None]] | None] | None"
    fits_at: dict[int, bool] = field(default_factory=dict)
    peaks: dict[int, int] = field(default_factory=dict)
    paired: bool = False  #: once per search: a wrong guess of side costs one probe, not one per refit
    misses: int = 0  #: probes whose peak the curve missed by more than tolerance x budget
    #: a fitted curve's guesses that failed without a peak (cuda's out of memory)
    near_misses: set[int] = field(default_factory=set)

    def largest(self, budget: int | None, first: int | None) -> tuple[int | None, SearchTrace]:
        n = len(self.candidates)
        if n == 0:
            return None, self._trace("model-guided")
        if budget is None:
            return self._answer(self._bisected()), SearchTrace("bisection", len(self.fits_at), None,
                                                               "no budget to aim at")
        xs = [self.feature(v) for v in self.candidates]
        start = 0 if first is None else min(range(n), key=lambda i: abs(self.candidates[i] - first))
        self._run(start)
        while True:
            fallback = _non_monotone(self.candidates, self.fits_at, self.peaks)
            lo, hi = self._bracket()
            if fallback is not None or hi - lo <= 1:
                break
            if len(self.fits_at) >= self.max_probes:
                fallback = f"no certified answer after {len(self.fits_at)} model-guided probes"
                break
            fallback = self._step(xs, start, budget, lo, hi)
            if fallback is not None:
                break
        return self._finish(fallback)

    def _step(self, xs: list[float], start: int, budget: int, lo: int, hi: int) -> str | None:
        """Fit, probe the curve's answer (or bisect the bracket); why to give the curve up, or None."""
        line = _fit(xs, self.peaks, budget, self.anchor, self.degree)
        crossing = None if line is None else line.crossing(budget, xs[_nearest(self.peaks, budget)])
        if crossing is not None and line.probes == 1 and self.scout < 1:
            crossing = xs[start] + self.scout * (crossing - xs[start])  # probe small first where probes cost more
        a = None if crossing is None else _largest_below(xs, crossing)
        if a is not None and a >= hi and hi not in self.peaks and hi not in self.near_misses:
            a = None  # the line puts the answer past a failure it cannot see and did not predict: bisect
        expect: bool | None = None
        predicted: float | None = None
        if a is None:
            i = (lo + hi) // 2
        else:
            # The predicted answer, or the neighbour that certifies it, always inside the open bracket.
            i, expect = (a, True) if lo < a < hi else ((lo + 1, False) if a <= lo else (hi - 1, True))
            predicted = line.at(xs[i]) if line.probes >= 2 else None
            if i == a and line.probes > self.degree:  # a curve through probes only (degree 2's first ones fall short)
                self._run_with_neighbour(xs, i, crossing, lo, hi)
        ok = self._run(i)
        if expect and not ok and i not in self.peaks and line is not None and line.probes >= 2 and a == i:
            self.near_misses.add(i)  # most likely one past the answer: the next guess steps just below it
        if predicted is not None and i in self.peaks and abs(self.peaks[i] - predicted) > self.tolerance * budget:
            self.misses += 1  # once: the nearest probes (past a step, say) make the next line; twice: give up
            if self.misses >= 2:
                return (f"poor fit: peak at {self.candidates[i]} is {self.peaks[i]} B, the line predicted "
                        f"{predicted:.0f} B (off by more than {self.tolerance:.0%} of the budget, twice)")
        return None

    def _finish(self, fallback: str | None) -> tuple[int | None, SearchTrace]:
        """The certified answer; or, when the curve was given up, bisection's over what is left."""
        if fallback is None:
            return self._answer(self._bracket()[0]), self._trace("model-guided")
        if not fallback.startswith("non-monotone"):
            lo, hi = self._bracket()
            best = self._bisected(lo, hi)
            later = _non_monotone(self.candidates, self.fits_at, self.peaks)
            if later is None:
                return self._answer(best), self._trace("bisection", fallback)
            fallback = f"{fallback}; then {later}"
        return self._answer(self._bisected()), self._trace("bisection", fallback)

    def _note(self, i: int, ok: bool, peak: int | None) -> None:
        self.fits_at[i] = ok
        if peak is not None:
            self.peaks[i] = peak

    def _run(self, i: int) -> bool:
        if i not in self.fits_at:
            self._note(i, *self.probe(self.candidates[i]))
        return self.fits_at[i]

    def _run_with_neighbour(self, xs: list[float], i: int, crossing: float, lo: int, hi: int) -> None:
        """Probe ``i`` and the neighbour that would certify it at once, if a slot is spare."""
        n = len(self.candidates)
        upper = i + 1 < n and (crossing - xs[i]) >= 0.5 * (xs[i + 1] - xs[i])
        j = i + 1 if upper else i - 1
        if self.together is None or self.paired or not lo < j < hi or j in self.fits_at or i in self.fits_at:
            return
        pair = sorted((i, j))
        outcomes = self.together([self.candidates[k] for k in pair])
        if outcomes is not None:
            self.paired = True
            for k, outcome in zip(pair, outcomes):
                self._note(k, *outcome)

    def _bracket(self) -> tuple[int, int]:
        lo = max((i for i, ok in self.fits_at.items() if ok), default=-1)
        hi = min((i for i, ok in self.fits_at.items() if not ok), default=len(self.candidates))
        return lo, hi

    def _trace(self, method: str, fallback: str | None = None) -> SearchTrace:
        return SearchTrace(method, len(self.fits_at), self.fit, fallback)

    def _bisected(self, lo: int = -1, hi: int | None = None) -> int:
        hi = len(self.candidates) if hi is None else hi
        inner = binary_search_largest(range(lo + 1, hi), self._run)
        return lo if inner is None else inner

    def _answer(self, i: int) -> int | None:
        return self.candidates[i] if i >= 0 else None


def _non_monotone(candidates: Sequence[int], fits_at: dict[int, bool], peaks: dict[int, int]) -> str | None:
    """Why the probes so far contradict monotone growth (None: they do not)."""
    fitting = [i for i, ok in fits_at.items() if ok]
    failing = [i for i, ok in fits_at.items() if not ok]
    if fitting and failing and max(fitting) > min(failing):
        return f"non-monotone: {candidates[max(fitting)]} fits but the smaller {candidates[min(failing)]} does not"
    ordered = sorted(peaks.items())
    for (i, p), (j, q) in zip(ordered, ordered[1:]):
        if q < p:
            return f"non-monotone: peak at {candidates[j]} ({q} B) is below the peak at {candidates[i]} ({p} B)"
    return None


def _nearest(peaks: dict[int, int], budget: int) -> int:
    return min(peaks, key=lambda k: (abs(peaks[k] - budget), k))


def _fit(xs: Sequence[float], peaks: dict[int, int], budget: int, anchor: Callable[[], "tuple[float, float] | None"],
         degree: int = 1) -> _Fit | None:
    """The curve through the probes whose peaks are nearest the budget (None: nothing rising to fit).

    Degree 1: a line through the nearest two (a secant, not a fixed bracket end, so it follows the
    peak where it crosses the budget: after a step change both points soon lie past the step); a
    pair that does not rise gives way to the nearest probe below and above the budget. One probe:
    the line through it and ``anchor()``.

    Degree 2 (width: activations grow with it, parameters with its square, a + b·x + c·x²): the
    parabola through the nearest three once there are three, if it rises there. Before that, curves
    that grow faster than the truth beyond the probes, so that a jump falls short (fits) rather than
    runs out of memory: a + c·x² through two probes; through one, the parabola with its vertex at
    the anchor.
    """
    if not peaks:
        return None
    if len(peaks) == 1:
        ((i, peak),) = peaks.items()
        point = anchor()
        if point is None:
            return None
        x, p = point
        if not (x < xs[i] and p < peak):
            return None
        if degree == 2:  # as if everything grew with the square (it grows slower): a jump that falls short
            k = (peak - p) / (xs[i] - x) ** 2
            return _Fit((p + k * x * x, -2 * k * x, k), probes=1)
        slope = (peak - p) / (xs[i] - x)
        return _Fit((peak - slope * xs[i], slope), probes=1)
    nearest = sorted(peaks, key=lambda k: (abs(peaks[k] - budget), k))
    if degree == 2 and len(nearest) >= 3:
        parabola = _parabola([(xs[k], peaks[k]) for k in nearest[:3]])
        if parabola is not None and parabola.crossing(budget, xs[nearest[0]]) is not None:
            return parabola
    below = [k for k in nearest if peaks[k] <= budget]
    above = [k for k in nearest if peaks[k] > budget]
    for pair in (nearest[:2], below[:1] + above[:1]):
        if len(pair) < 2:
            continue
        i, j = sorted(pair)
        if degree == 2:  # a + c·x² through the two: it outgrows a + b·x + c·x² beyond them, so it falls short
            c = (peaks[j] - peaks[i]) / (xs[j] ** 2 - xs[i] ** 2)
            if c > 0:
                return _Fit((peaks[i] - c * xs[i] ** 2, 0.0, c), probes=2)
            continue
        slope = (peaks[j] - peaks[i]) / (xs[j] - xs[i])
        if slope > 0:
            return _Fit((peaks[i] - slope * xs[i], slope), probes=2)
    return None


def _parabola(points: Sequence[tuple[float, float]]) -> _Fit | None:
    """c0 + c1·x + c2·x² through three points (None if two share an x)."""
    (x0, y0), (x1, y1), (x2, y2) = points
    if len({x0, x1, x2}) < 3:
        return None
    # Newton's divided differences, then expanded.
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c2 = (d12 - d01) / (x2 - x0)
    c1 = d01 - c2 * (x0 + x1)
    c0 = y0 - c1 * x0 - c2 * x0 * x0
    return _Fit((c0, c1, c2), probes=3)


def _largest_below(xs: Sequence[float], x: float) -> int:
    """Index of the largest ``xs`` (increasing) not above ``x``; -1 if none."""
    return bisect.bisect_right(xs, x + 1e-9 * abs(x)) - 1


def predictive_search_largest(candidates: Sequence[int], probe: Probe, budget: int, first: int | None = None,
                              intercept: Callable[[], int] = lambda: 0, **options: Any) -> int | None:
    """The largest candidate that fits, by :func:`guided_search_largest` with a line in the value itself
    and, for the first jump, the anchor (0, ``intercept()``). Kept for callers of the earlier API."""
    best, _ = guided_search_largest(candidates, probe, budget, first=first,
                                    anchor=lambda: (0.0, float(intercept())), **options)
    return best


@dataclass(frozen=True)
class Growth:
    """How the peak grows with one dimension: the variable it is fitted in (``feature``), the
    degree of the fit in it, and the anchor of the first jump, read from the first probe's row:
    (value, row) -> (x in the fitted variable, bytes), or None. ``fit`` names the model
    (``summary.json``). ``scout``: how far towards the anchor's predicted limit the first jump goes
    (below 1 where a probe's cost grows with the value on every device, even meta)."""

    fit: str
    feature: Callable[[int], float]
    anchor: Callable[[int, ResultRow], "tuple[float, float] | None"]
    degree: int = 1
    scout: float = 1.0


def _fixed_bytes_anchor(value: int, row: ResultRow) -> tuple[float, float] | None:
    """(0, parameters + gradients): at batch 0 (or 0 pixels, or width 0) the step holds about the model."""
    if row.param_bytes is None or row.grad_bytes is None:
        return None
    return 0.0, float(row.param_bytes + row.grad_bytes)


def _no_layers_anchor(value: int, row: ResultRow) -> tuple[float, float] | None:
    """The (negative) number of extra blocks at which the network would have no layers, and 0 bytes."""
    if row.depth is None:
        return None
    return value - row.depth / LAYERS_PER_EXTRA_BLOCK, 0.0


def _squared(value: int) -> float:
    return float(value) ** 2


#: Per dimension: activations grow with the batch, the depth and the pixels (side²) of the input;
#: width_per_group grows the bottlenecks' inner activations with it and the 3x3 convolutions'
#: parameters (and their gradients and optimizer state) with its square.
GROWTH: dict[str, Growth] = {
    "batch": Growth("a + b·batch", float, _fixed_bytes_anchor),
    "depth": Growth("a + b·depth", float, _no_layers_anchor, scout=0.25),  # a probe costs as its layers
    "width": Growth("a + b·width + c·width²", float, _fixed_bytes_anchor, degree=2),
    "resolution": Growth("a + b·side²", _squared, _fixed_bytes_anchor),
}


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
    traces: dict[str, SearchTrace] = field(default_factory=dict)  # how each maximum was reached

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
        """Per strategy: the maximum, whether it is bounded, its row's key and how it was reached
        (method, probes, fit, fallback: :class:`SearchTrace`) -> ``summary.json``."""
        return {s: {"max": v, "bounded": self.bounded(s),
                    "key": (self.best_rows[s].key if self.best_rows.get(s) else None),
                    **(self.traces[s].as_dict() if s in self.traces else {})}
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
            _search_strategy(outcome, strategy, cfg.candidates(), point_for, run, cfg.settings.budget_bytes)
            continue
        rows = linear_scan([point_for(b) for b in cfg.batches], run, cfg.stop_after)
        outcome.rows.extend(rows)
        ok = [r for r in rows if r.ok]
        best = max(ok, key=lambda r: r.batch_size) if ok else None
        outcome.best_rows[strategy] = best
        outcome.maxima[strategy] = best.batch_size if best else None
        outcome.traces[strategy] = SearchTrace("scan", len(rows))
    return outcome


def run_max_scale(cfg: MaxScaleConfig, run: RunPoint) -> SearchOutcome:
    outcome = SearchOutcome(dim=cfg.dim)
    for strategy in cfg.strategies:
        _search_strategy(outcome, strategy, cfg.candidates(), lambda v, s=strategy: cfg.point(s, v), run,
                         cfg.settings.budget_bytes)
    return outcome


def run_grid(cfg: GridConfig, run: RunPoint) -> SearchOutcome:
    return SearchOutcome(rows=[run(p) for p in cfg.points()])


def _search_strategy(outcome: SearchOutcome, strategy: str, candidates: Sequence[int],
                     point_for: Callable[[int], PointConfig], run: RunPoint, budget: int | None,
                     first: int | None = None, stop_on_error: bool = False) -> None:
    """One strategy's largest fitting value into ``outcome`` (maximum, best row, trace; every probe a row).

    A probe counts as fitting when its row is ``ok``; a peak comes with ``ok`` and memory-failure
    rows. ``stop_on_error``: a probe that errs or times out ends the search with no maximum (plan);
    otherwise it counts as not fitting (max-scale, sweep-batch --find-max), as in bisection.
    """
    growth = GROWTH[outcome.dim]
    found: dict[int, ResultRow] = {}
    first_probe: list[tuple[int, ResultRow]] = []

    def record(value: int, row: ResultRow) -> None:
        outcome.rows.append(row)
        found[value] = row
        if not first_probe:
            first_probe.append((value, row))

    def result(row: ResultRow) -> tuple[bool, int | None]:
        if stop_on_error and not row.ok and row.status not in MEMORY_FAILURES:
            raise _SearchFailed(row.message)
        return row.ok, (deciding_bytes(row) if row.ok or row.status in MEMORY_FAILURES else None)

    def probe(value: int) -> tuple[bool, int | None]:
        row = run(point_for(value))
        record(value, row)
        return result(row)

    side_by_side = getattr(run, "together", None)  # scale-out's run: points at once while slots are spare

    def together(values: Sequence[int]) -> list[tuple[bool, int | None]] | None:
        rows = side_by_side([point_for(v) for v in values])
        if rows is None:
            return None
        for value, row in zip(values, rows):
            record(value, row)
        return [result(row) for row in rows]

    def anchor() -> tuple[float, float] | None:
        return growth.anchor(*first_probe[0]) if first_probe else None

    try:
        best, trace = guided_search_largest(candidates, probe, budget, feature=growth.feature, degree=growth.degree,
                                            first=first, anchor=anchor, fit=growth.fit, scout=growth.scout,
                                            together=together if side_by_side is not None else None)
    except _SearchFailed:
        best, trace = None, SearchTrace("model-guided", len(found), growth.fit)
    row = found.get(best) if best is not None else None
    outcome.best_rows[strategy] = row
    outcome.maxima[strategy] = None if row is None else outcome.value_of(row)
    outcome.traces[strategy] = trace


def deciding_bytes(row: ResultRow) -> int | None:
    """The bytes a row's fit was decided on, for the searches' curves: the predicted reserved bytes when
    planned for a GPU profile (docs/design.md §10), else the peak; None for a row that failed on host
    memory (its device bytes say nothing about where host memory runs out)."""
    if row.status == "host_over_budget":
        return None
    if getattr(row, "gpu", None) is not None and row.reserved_bytes is not None:
        return row.reserved_bytes
    return row.peak_alloc_bytes


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
    "MeasureSettings", "SweepConfig", "GridConfig", "MaxScaleConfig", "SearchOutcome", "SearchTrace", "Growth",
    "GROWTH", "binary_search_largest", "guided_search_largest", "linear_scan", "run_sweep", "run_max_scale",
    "run_grid", "multiples_of", "search_probes", "predictive_search_largest", "PlanConfig", "run_plan",
]
