"""Max-scale tables: the largest depth, width or input size per strategy at a fixed batch.

A max-scale run (or a ``plan`` over a dimension) varies the model or its input on purpose, so it is
grouped by its dimension, one group per run; "× fp32" is :data:`MULTIPLE_DEFINITIONS`'s, the same as
the CLI's tables and the figures print.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from actbench.reporting.analysis import (MULTIPLE_DEFINITIONS, Series, bound_ratio, devices_text, format_budget,
                                         max_text, scale_value, series_of, slug)
from actbench.reporting.runs import Run
from actbench.schema import MEMORY_FAILURES, ResultRow


@dataclass(frozen=True)
class ScaleEntry:
    series: Series
    label: str
    max_value: int | None
    max_label: str
    depth: int | None
    samples_per_s: float | None
    flops_per_sample: float | None
    multiple_of_fp32: float | None
    #: a larger value was seen failing (oom, over budget): the maximum, not a lower bound
    bounded: bool = True
    #: the multiple as printed (see :func:`bound_ratio`), or None
    multiple_text: str | None = None
    #: the step-time model's samples/s at the maximum and its device model (a prediction, never measured)
    predicted_samples_per_s: float | None = None
    device_model: str | None = None


@dataclass(frozen=True)
class ScaleGroup:
    """One max-scale run: one dimension grown per strategy at a fixed batch."""

    dim: str
    run_name: str
    rows: tuple[ResultRow, ...]

    @property
    def model(self) -> str:
        return self.rows[0].model

    @property
    def batch_size(self) -> int:
        return self.rows[0].batch_size

    @property
    def budget_bytes(self) -> int | None:
        return self.rows[0].budget_bytes

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(sorted({r.device for r in self.rows}))

    def title(self, what: str) -> str:
        size = "" if self.dim == "resolution" else f", {self.rows[0].size.height}×{self.rows[0].size.width} px"
        return f"{what}: {self.model}, batch {self.batch_size}, {devices_text(self.devices)}, " \
               f"{format_budget(self.budget_bytes)}{size}"

    def slug(self) -> str:
        return slug(self.dim, self.run_name)

    def value(self, row: ResultRow) -> int:
        """The grown quantity: real depth in layers, width_per_group in channels, or input side in pixels."""
        return scale_value(self.dim, row)

    def definition(self) -> str:
        """What "× fp32" means in this group's tables and figures."""
        return MULTIPLE_DEFINITIONS[self.dim]

    def _size(self, row: ResultRow) -> int:
        """What the search varied, comparable between ok and failed rows (a failed row may have no depth)."""
        return row.extra_blocks if self.dim == "depth" else self.value(row)

    def unit(self) -> str:
        return {"depth": "layers", "width": "channels per group", "resolution": "pixels"}[self.dim]

    def table(self) -> tuple[ScaleEntry, ...]:
        best: dict[Series, ResultRow | None] = {}
        bounded: dict[Series, bool] = {}
        for s in series_of(self.rows):
            mine = [r for r in self.rows if s.has(r)]
            ok = [r for r in mine if r.ok]
            best[s] = max(ok, key=self.value) if ok else None
            bounded[s] = any(r.status in MEMORY_FAILURES and (best[s] is None or self._size(r) > self._size(best[s]))
                             for r in mine)
        entries = []
        for s, row in best.items():
            fp32 = best.get(Series("fp32", s.device))
            value = self.value(row) if row is not None else None
            base = self.value(fp32) if fp32 is not None else None
            multiple = value / base if value and base else None
            text = bound_ratio(value, bounded[s], base, bounded.get(Series("fp32", s.device), False))
            label = f"{s.name} (predicted)" if s.predicted else s.name
            extra = f" (+{row.extra_blocks} blocks)" if row is not None and self.dim == "depth" else ""
            entries.append(ScaleEntry(series=s, label=label, max_value=value,
                                      max_label="none fits" if value is None else f"{max_text(value, bounded[s])}{extra}",
                                      depth=row.depth if row else None,
                                      samples_per_s=row.samples_per_s_median if row else None,
                                      flops_per_sample=row.flops_per_sample if row else None,
                                      multiple_of_fp32=multiple, bounded=bounded[s], multiple_text=text,
                                      predicted_samples_per_s=row.predicted_samples_per_s if row else None,
                                      device_model=row.device_model if row else None))
        return tuple(entries)


def scale_groups(runs: Iterable[Run]) -> tuple[ScaleGroup, ...]:
    groups = []
    for run in runs:
        dim = run.scale_dimension()
        if dim is not None:
            groups.append(ScaleGroup(dim=dim, run_name=run.name, rows=run.rows))
    return tuple(groups)
