"""Derived views of finished runs: which rows belong together, and the tables plots and reports share.

Plots and the Markdown report must agree on every number (the largest batch, the memory at a batch,
the maximum depth), so both read them from here; nothing in this module writes anything. Reading runs
is :mod:`actbench.reporting.runs`, max-scale tables :mod:`actbench.reporting.scale`, predicted speed
:mod:`actbench.reporting.speed`.

Grouping: batch-type runs (sweep-batch, throughput, memory) are pooled by *setting* — model, input
size and budget — so a cuda measurement and a meta prediction of the same setting share a figure.
Within a group a *series* is one (strategy, device); a predicting device (meta) marks a prediction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from actbench.core.devices import is_prediction
from actbench.reporting.runs import Run
from actbench.schema import DEFAULT_PRECISION, MEMORY_FAILURES, PRECISIONS, InputSize, ModelSpec, ResultRow, format_bytes
from actbench.strategies import rank as strategy_rank


def model_label(row: ResultRow) -> str:
    """The model as built for this row (grown ResNet-152s included), the same label runs are named by."""
    return ModelSpec(row.model, extra_blocks=row.extra_blocks, width_per_group=row.width_per_group).label()


def format_budget(budget_bytes: int | None) -> str:
    return "no budget" if budget_bytes is None else f"budget {format_bytes(budget_bytes, decimals=None)}"


def slug(*parts: object) -> str:
    """Deterministic, filesystem-safe name part."""
    text = "_".join(str(p) for p in parts if p is not None and p != "")
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-")


@dataclass(frozen=True)
class Series:
    """One line/bar family: a strategy at a precision on a device (meta = predicted).

    ``Series("fp32", device)`` is the baseline: strategy fp32 at precision fp32. Only fp32-precision
    series are compared with the paper's numbers (the paper trained in fp32).
    """

    strategy: str
    device: str
    precision: str = DEFAULT_PRECISION

    @property
    def predicted(self) -> bool:
        return is_prediction(self.device)

    @property
    def name(self) -> str:
        """``L3``, or ``L3 bf16`` away from fp32: what legends and tables call the series."""
        return self.strategy if self.precision == DEFAULT_PRECISION else f"{self.strategy} {self.precision}"

    @property
    def paper_comparable(self) -> bool:
        return self.precision == DEFAULT_PRECISION

    def has(self, row: ResultRow) -> bool:
        return row.strategy == self.strategy and row.device == self.device and row.precision == self.precision


def _precision_rank(precision: str) -> int:
    return PRECISIONS.index(precision) if precision in PRECISIONS else len(PRECISIONS)


def series_of(rows: Iterable[ResultRow]) -> tuple[Series, ...]:
    found = {Series(r.strategy, r.device, r.precision) for r in rows}
    return tuple(sorted(found, key=lambda s: (strategy_rank(s.strategy), _precision_rank(s.precision), s.predicted,
                                              s.device)))


def devices_text(devices: Iterable[str]) -> str:
    return ", ".join(f"{d} (predicted)" if is_prediction(d) else d for d in sorted(set(devices)))


@dataclass(frozen=True)
class BatchGroup:
    """Rows of one setting (model, input size, budget) over batch sizes, from any number of runs."""

    model: str
    size: InputSize
    budget_bytes: int | None
    rows: tuple[ResultRow, ...]
    run_names: tuple[str, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(sorted({r.device for r in self.rows}))

    @property
    def gpu(self) -> str | None:
        """The GPU spec the rows were planned for (docs/design.md §10), when they share one."""
        names = {getattr(r, "gpu", None) for r in self.rows}
        return names.pop() if len(names) == 1 else None

    @property
    def base_model(self) -> str:
        return self.rows[0].model

    @property
    def measured_devices(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if not is_prediction(d))

    def title(self, what: str) -> str:
        budget = format_budget(self.budget_bytes) + ("" if self.gpu is None else f" ({self.gpu} spec)")
        return f"{what}: {self.model}, {devices_text(self.devices)}, {budget}, " \
               f"{self.size.height}×{self.size.width} px" + ("" if self.size.frames is None else
                                                            f", {self.size.frames} frames")

    def slug(self) -> str:
        budget = "nobudget" if self.budget_bytes is None else format_bytes(self.budget_bytes, decimals=None, sep="")
        return slug(self.model, self.size.label(), budget, self.gpu)

    def series(self) -> tuple[Series, ...]:
        return series_of(self.rows)

    def label(self, series: Series) -> str:
        """Strategy name, plus the device when several measured devices share the figure."""
        if series.predicted:
            return f"{series.name} (predicted)"
        if len(self.measured_devices) > 1:
            return f"{series.name} ({series.device})"
        return series.name

    def rows_of(self, series: Series) -> list[ResultRow]:
        return sorted((r for r in self.rows if series.has(r)), key=lambda r: r.batch_size)

    def ok_points(self, series: Series) -> list[ResultRow]:
        """One ok row per batch size (the first in run order; one carrying a prediction before one that
        does not, so a predicted throughput is never hidden), sorted by batch."""
        chosen: dict[int, ResultRow] = {}
        for row in self.rows_of(series):
            kept = chosen.get(row.batch_size)
            if row.ok and (kept is None or (kept.predicted_samples_per_s is None
                                            and row.predicted_samples_per_s is not None)):
                chosen[row.batch_size] = row
        return [chosen[b] for b in sorted(chosen)]

    def first_failure(self, series: Series) -> ResultRow | None:
        """Smallest batch whose status is oom/over_budget and at which no row is ok."""
        ok_batches = {r.batch_size for r in self.ok_points(series)}
        fails = [r for r in self.rows_of(series) if r.status in MEMORY_FAILURES and r.batch_size not in ok_batches]
        return fails[0] if fails else None

    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({r.batch_size for r in self.rows}))


def bound_ratio(value: float | None, exact: bool, base: float | None, base_exact: bool) -> str | None:
    """``value ÷ base`` as text, honest about lower bounds; None when nothing can be said.

    A maximum that nothing larger was seen failing is only a lower bound ("≥"). Its ratio to an
    exact fp32 maximum is then a lower bound too ("≥1.75"); an exact maximum over a bounded fp32
    gives an upper bound ("≤1.75"); two lower bounds give no ratio at all. The CLI's tables, the
    figures and the report all print ratios through here, so they agree.
    """
    if value is None or not base:
        return None
    if not exact and not base_exact:
        return None
    text = f"{value / base:.2f}"
    if exact and base_exact:
        return text
    return f"≥{text}" if base_exact else f"≤{text}"


def max_text(value: int | None, exact: bool) -> str:
    """``608``, or ``≥608`` for a lower bound, or ``none fits``."""
    if value is None:
        return "none fits"
    return str(value) if exact else f"≥{value}"


#: What "× fp32" means beside a maximum, per searched quantity (one definition, stated wherever printed).
MULTIPLE_DEFINITIONS: Mapping[str, str] = MappingProxyType({
    "batch": "× fp32 = this maximum batch ÷ fp32's maximum batch (same device)",
    "depth": "× fp32 = this maximum depth ÷ fp32's maximum depth, both in layers (ResNet-152: 152 layers; "
             "each extra bottleneck adds 3)",
    "width": "× fp32 = this maximum width_per_group ÷ fp32's",
    "resolution": "× fp32 = this maximum input side (pixels) ÷ fp32's",
})


def scale_value(dim: str, row: ResultRow) -> int:
    """The searched quantity of a row: batch, real depth in layers, width_per_group, or input side in pixels."""
    if dim == "batch":
        return row.batch_size
    if dim == "depth":
        return row.depth if row.depth is not None else row.extra_blocks
    if dim == "width":
        return row.width_per_group if row.width_per_group is not None else 64
    return row.image_size


@dataclass(frozen=True)
class MaxBatchEntry:
    series: Series
    label: str
    max_batch: int | None
    #: a larger batch was tried and failed, so max_batch is the maximum, not just the largest tried
    bounded: bool
    samples_per_s: float | None
    multiple_of_fp32: float | None
    #: the multiple as printed: "1.75", "≥1.75" (this maximum is a lower bound), "≤1.75" (fp32's is), or None
    multiple_text: str | None = None
    #: the step-time model's samples/s at the maximum and the device model it used (a prediction, never measured)
    predicted_samples_per_s: float | None = None
    device_model: str | None = None

    @property
    def max_text(self) -> str:
        return max_text(self.max_batch, self.bounded)


def max_batch_table(group: BatchGroup) -> tuple[MaxBatchEntry, ...]:
    """Largest ok batch per series, and its multiple of fp32 on the same device."""
    raw = {}
    for s in group.series():
        ok = group.ok_points(s)
        best = ok[-1] if ok else None
        fail = any(r.status in MEMORY_FAILURES and (best is None or r.batch_size > best.batch_size)
                   for r in group.rows_of(s))
        raw[s] = (best, fail)
    entries = []
    for s, (best, fail) in raw.items():
        fp32, fp32_bounded = raw.get(Series("fp32", s.device), (None, False))
        multiple = (best.batch_size / fp32.batch_size) if best is not None and fp32 is not None else None
        text = bound_ratio(best.batch_size if best else None, fail, fp32.batch_size if fp32 else None, fp32_bounded)
        entries.append(MaxBatchEntry(series=s, label=group.label(s), max_batch=best.batch_size if best else None,
                                     bounded=fail, samples_per_s=best.samples_per_s_median if best else None,
                                     multiple_of_fp32=multiple, multiple_text=text,
                                     predicted_samples_per_s=best.predicted_samples_per_s if best else None,
                                     device_model=best.device_model if best else None))
    return tuple(entries)


@dataclass(frozen=True)
class MemoryEntry:
    series: Series
    label: str
    activation_bytes: int | None
    peak_alloc_bytes: int | None
    model_bytes: int | None
    host_bytes: int | None = None  # swap's and L4/L5's copies in CPU memory, outside the device columns


def memory_batch(group: BatchGroup) -> int | None:
    """The batch at which the most series have an ok row with memory columns (ties: the largest batch)."""
    counts: dict[int, int] = {}
    for s in group.series():
        for r in group.ok_points(s):
            if r.activation_bytes is not None or r.peak_alloc_bytes is not None:
                counts[r.batch_size] = counts.get(r.batch_size, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda b: (counts[b], b))


def memory_table(group: BatchGroup, batch_size: int | None = None) -> tuple[int | None, tuple[MemoryEntry, ...]]:
    """Activation, peak and model bytes per series at one batch size (default: :func:`memory_batch`)."""
    batch_size = memory_batch(group) if batch_size is None else batch_size
    if batch_size is None:
        return None, ()
    entries = []
    for s in group.series():
        row = next((r for r in group.ok_points(s) if r.batch_size == batch_size), None)
        if row is not None:
            entries.append(MemoryEntry(s, group.label(s), row.activation_bytes, row.peak_alloc_bytes, row.model_bytes,
                                       row.host_bytes))
    return batch_size, tuple(entries)


def _unique_rows(runs: Iterable[Run]) -> list[tuple[str, ResultRow]]:
    """(run name, row) of runs that are not max-scale searches, each key once.

    A point recorded twice (a plan's probe and a sweep's point of the same configuration) is one
    point: its latest row, as within a run (the answer of the newer code, which may carry a
    prediction the older row lacks); rows finished at the same time keep the first in run order."""
    chosen: dict[str, tuple[str, ResultRow]] = {}
    for run in runs:
        if run.scale_dimension() is not None:
            continue
        for row in run.rows:
            kept = chosen.get(row.key)
            if kept is None or (row.finished_at or "") > (kept[1].finished_at or ""):
                chosen[row.key] = (run.name, row)
    return list(chosen.values())


def batch_groups(runs: Iterable[Run]) -> tuple[BatchGroup, ...]:
    """Rows of runs that are not max-scale searches, pooled by setting; duplicate keys counted once."""
    pooled: dict[tuple, list[ResultRow]] = {}
    names: dict[tuple, list[str]] = {}
    for run_name, row in _unique_rows(runs):
        k = (model_label(row), row.size, row.budget_bytes, getattr(row, "gpu", None))
        pooled.setdefault(k, []).append(row)
        if run_name not in names.setdefault(k, []):
            names[k].append(run_name)
    return tuple(BatchGroup(model=k[0], size=k[1], budget_bytes=k[2], rows=tuple(pooled[k]),
                            run_names=tuple(names[k]))
                 for k in sorted(pooled, key=lambda k: (k[0], k[1].height, k[1].width, k[1].frames or 0, -1 if k[2] is None else k[2], k[3] or "")))
