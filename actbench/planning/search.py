"""Running the searches (docs/design.md §5) through a ``run`` callable (normally ``PointRunner.run``),
so a search neither knows nor cares whether a point was measured now or resumed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from actbench.planning.configs import GridConfig, ScaleConfig, SweepConfig
from actbench.planning.guided import GROWTH, SearchTrace, guided_search_largest
from actbench.planning.point import Point
from actbench.schema import MEMORY_FAILURES, ResultRow
from actbench.strategies import Strategy

RunPoint = Callable[[Point], ResultRow]


class _SearchFailed(Exception):
    """A probe neither fitted nor exceeded the budget (error, timeout): the search cannot go on."""


def run_plan(cfg: ScaleConfig, run: RunPoint) -> SearchOutcome:
    """Per strategy, :func:`guided_search_largest` over the candidates (each probe a point).

    A probe that errs (a model that cannot run on fake tensors) ends that strategy's search with no
    maximum; its row says why.
    """
    outcome = SearchOutcome(dim=cfg.dim)
    for strategy in cfg.strategies:
        _search_strategy(outcome, strategy, cfg.candidates(), lambda v, s=strategy: cfg.point(s, v), run,
                         cfg.settings.budget_bytes, first=cfg.first_guess(), stop_on_error=True)
    return outcome


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


def linear_scan(points: Sequence[Point], run: RunPoint, stop_after: int) -> list[ResultRow]:
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
        def point_for(batch_size: int, s: Strategy = strategy) -> Point:
            return cfg.settings.point(cfg.model, s, batch_size, cfg.size)

        if cfg.find_max:
            _search_strategy(outcome, strategy, cfg.candidates(), point_for, run, cfg.settings.budget_bytes)
            continue
        rows = linear_scan([point_for(b) for b in cfg.batch_sizes], run, cfg.stop_after)
        outcome.rows.extend(rows)
        ok = [r for r in rows if r.ok]
        best = max(ok, key=lambda r: r.batch_size) if ok else None
        outcome.best_rows[strategy.name] = best
        outcome.maxima[strategy.name] = best.batch_size if best else None
        outcome.traces[strategy.name] = SearchTrace("scan", len(rows))
    return outcome


def run_max_scale(cfg: ScaleConfig, run: RunPoint) -> SearchOutcome:
    outcome = SearchOutcome(dim=cfg.dim)
    for strategy in cfg.strategies:
        _search_strategy(outcome, strategy, cfg.candidates(), lambda v, s=strategy: cfg.point(s, v), run,
                         cfg.settings.budget_bytes)
    return outcome


def run_grid(cfg: GridConfig, run: RunPoint) -> SearchOutcome:
    return SearchOutcome(rows=[run(p) for p in cfg.points()])


def _search_strategy(outcome: SearchOutcome, strategy: Strategy, candidates: Sequence[int],
                     point_for: Callable[[int], Point], run: RunPoint, budget: int | None,
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
    outcome.best_rows[strategy.name] = row
    outcome.maxima[strategy.name] = None if row is None else outcome.value_of(row)
    outcome.traces[strategy.name] = trace


def deciding_bytes(row: ResultRow) -> int | None:
    """The bytes a row's fit was decided on, for the searches' curves: the predicted reserved bytes when
    planned for a GPU spec (docs/design.md §10), else the peak; None for a row that failed on host
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
