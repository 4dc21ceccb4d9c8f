"""The model-guided search for the largest value that fits (docs/design.md §5): fit how the peak
grows, probe the predicted limit and its neighbour, bisect when the fit is poor."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from actbench.schema import ResultRow


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
