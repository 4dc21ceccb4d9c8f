"""Predicted speed in figures and reports, kept apart from measured speed.

A row's ``predicted_samples_per_s`` is the step-time model's price of its traced step on a device
model (docs/design.md §11), never a measurement: figures draw it as its own dashed series labelled
"(predicted, MODEL)", tables give it its own column, and reports say how far each device model has
been checked (:data:`DEVICE_MODEL_TRUST`). The paper's "ActNN" curve is derived here too: at each
batch, the fastest ActNN level that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from actbench.core.devices import is_prediction
from actbench.reporting.analysis import BatchGroup, Series
from actbench.schema import DEFAULT_PRECISION, LEVEL_NAMES, ResultRow

#: What the derived series of the paper is called in legends and tables.
ACTNN_SERIES = "ActNN"


@dataclass(frozen=True)
class RatePoint:
    """Samples/s at one batch, and the strategy that gave it (a level, for the derived ActNN series)."""

    batch_size: int
    samples_per_s: float
    strategy: str


@dataclass(frozen=True)
class RateSeries:
    """One line of a throughput figure: measured (``device_model`` None) or predicted on a device model."""

    name: str
    device: str
    device_model: str | None
    points: tuple[RatePoint, ...]
    label: str

    @property
    def predicted(self) -> bool:
        return self.device_model is not None


def predicted_label(name: str, device_model: str) -> str:
    """``L3 (predicted, t4)``: how every predicted series and column is named."""
    return f"{name} (predicted, {device_model})"


#: Under a table with a predicted column: what the column is (and is not).
PREDICTED_COLUMN_NOTE = ("predicted samples/s: the step-time model's price of the step on the device model named in "
                         "brackets (docs/design.md §11), not a measurement")


def predicted_text(row: ResultRow | None) -> str:
    """``103.3 (t4)`` for a row carrying a prediction, ``-`` otherwise: a prediction names its device model."""
    found = None if row is None else predicted_rate(row)
    return "-" if found is None else f"{found[0]:.1f} ({found[1]})"


def measured_rate(row: ResultRow) -> float | None:
    """A row's measured samples/s; None on a predicting device (meta has no measured throughput)."""
    return None if is_prediction(row.device) else row.samples_per_s_median


def predicted_rate(row: ResultRow) -> tuple[float, str] | None:
    """(predicted samples/s, device model) of a row that carries a prediction, else None."""
    if row.predicted_samples_per_s is None or row.device_model is None:
        return None
    return row.predicted_samples_per_s, row.device_model


def predicted_series(group: BatchGroup) -> tuple[RateSeries, ...]:
    """Per series and device model, the ok rows' predicted samples/s by batch (first row per batch)."""
    out = []
    devices = {r.device for r in group.rows if predicted_rate(r) is not None}
    for s in group.series():
        by_model: dict[str, dict[int, RatePoint]] = {}
        for row in group.rows_of(s):
            found = predicted_rate(row) if row.ok else None
            if found is not None:
                by_model.setdefault(found[1], {}).setdefault(
                    row.batch_size, RatePoint(row.batch_size, found[0], row.strategy))
        for model, points in by_model.items():
            label = predicted_label(s.name, model) + (f" [{s.device} rows]" if len(devices) > 1 else "")
            out.append(RateSeries(s.name, s.device, model, tuple(points[b] for b in sorted(points)), label))
    return tuple(out)


def _fastest_levels(rows: Iterable[ResultRow]) -> dict[tuple[str, str | None], dict[int, RatePoint]]:
    """(device, device model or None for measured) -> batch -> the fastest fitting level's point; only
    where at least two levels had a rate (with one there is nothing to choose, and the curve is that level)."""
    best: dict[tuple[str, str | None], dict[int, RatePoint]] = {}
    levels: dict[tuple[str, str | None], set[str]] = {}
    for row in rows:
        if not row.ok or row.strategy not in LEVEL_NAMES or row.precision != DEFAULT_PRECISION:
            continue
        found = predicted_rate(row)
        rates = [((row.device, None), measured_rate(row))] + ([((row.device, found[1]), found[0])] if found else [])
        for key, rate in rates:
            if rate is None:
                continue
            levels.setdefault(key, set()).add(row.strategy)
            kept = best.setdefault(key, {}).get(row.batch_size)
            if kept is None or rate > kept.samples_per_s:
                best[key][row.batch_size] = RatePoint(row.batch_size, rate, row.strategy)
    return {key: points for key, points in best.items() if len(levels[key]) >= 2}


def actnn_series(group: BatchGroup) -> tuple[RateSeries, ...]:
    """The paper's derived "ActNN" curve: at each batch, the fastest ActNN level (L0..L5) that fits.

    Measured rates give a measured curve per device; predicted rates a predicted curve per device
    model; the two never mix. Levels that do not fit a batch (oom, over budget) are not candidates."""
    best = _fastest_levels(group.rows)
    measured_devices = {device for device, model in best if model is None}
    out = []
    for (device, model), points in sorted(best.items(), key=lambda kv: (kv[0][1] is not None, kv[0][0],
                                                                        kv[0][1] or "")):
        if model is None:
            suffix = f" ({device})" if len(measured_devices) > 1 else ""
            label = f"{ACTNN_SERIES}: fastest fitting level{suffix}"
        else:
            label = predicted_label(ACTNN_SERIES, model)
        out.append(RateSeries(ACTNN_SERIES, device, model, tuple(points[b] for b in sorted(points)), label))
    return tuple(out)


def has_rate(group: BatchGroup, series: Series) -> bool:
    """Whether a series has any ok row with a measured or a predicted throughput."""
    return any(measured_rate(r) is not None or predicted_rate(r) is not None for r in group.ok_points(series))


@dataclass(frozen=True)
class TrustFigure:
    """One check of a device model: what was compared, predicted ÷ reference, and where it is written."""

    check: str
    ratio: str
    source: str


_DESIGN = "docs/design.md §11"
_H200 = "results/gpu/h200_2026-12-04/second"
_H200_AGAIN = "results/gpu/h200_2026-12-04/repredicted"

#: How far each device model's predictions have been checked. Ratios are predicted ÷ reference: above 1
#: the model is slower than the reference (throughput under-predicted), below 1 faster.
DEVICE_MODEL_TRUST: Mapping[str, tuple[TrustFigure, ...]] = MappingProxyType({
    "t4": (TrustFigure("ResNet-50, batch 64, fp32 images/s ÷ the paper's 120", "1.14", _DESIGN),
           TrustFigure("throughput ÷ fp32's, ours ÷ the paper's: L1, L2, L3, L4, L5, swap",
                       "0.94, 1.00, 0.99, 1.09, 1.54 (L5: no defragmenting allocator here), 1.22", _DESIGN)),
    "v100": (TrustFigure("ResNet-50 v1.5 FP32, batch 112, images/s ÷ DeepLearningExamples' 367", "0.80", _DESIGN),),
    "a100-80gb": (TrustFigure("ResNet-50 v1.5 TF32, batch 256, images/s ÷ DeepLearningExamples' 938", "1.08", _DESIGN),
                  TrustFigure("AMP, batch 256, images/s ÷ 2470 (bf16 for fp16; beside, not a target)", "0.80",
                              _DESIGN)),
    "h200": (TrustFigure("ResNet-50, batch 64, predicted ÷ measured step time on an H200: fp32, L0, L3, L4, "
                         "checkpoint, swap (ActNN's and checkpoint's Python per call fitted on these rows)",
                         "0.81, 1.00, 1.00, 1.00, 1.00, 1.12", f"{_H200_AGAIN}/speed_vs_cuda_h200.csv"),
             TrustFigure("outside the rows fitted on, ResNet-18 b16 / ResNet-50 b8, 112 px: fp32, L0, L1, L3, "
                         "checkpoint", "1.19, 1.18, 0.92, 1.32, 1.48 / 1.61, 1.56, 1.09, 1.23, 1.36",
                         f"{_H200_AGAIN}/actnn_cuda_h200.csv")),
    "calibrated-cuda": (TrustFigure("calibrated on an H200; ResNet-50, batch 64, predicted ÷ measured step time: "
                                    "fp32, L0, L3, L4, checkpoint, swap", "0.67, 0.40, 0.30, 0.26, 0.47, 0.97",
                                    f"{_H200}/speed_vs_cuda.csv"),),
    "calibrated-cpu": (TrustFigure("calibrated on a shared 2-core CPU; ResNet-18, 64 px, batch 4, predicted ÷ "
                                   "measured step time: fp32, L0, L3, checkpoint, swap",
                                   "0.90, 0.66, 0.60, 0.82, 0.90", _DESIGN),
                       TrustFigure("with a strategy's Python priced, 64 px, batch 4, predicted ÷ fastest of steps "
                                   "timed in turn: fp32, L0, L3, checkpoint, sac, swap; ResNet-18 / ResNet-50",
                                   "0.96, 0.96, 0.95, 0.95, 0.92, 0.94 / 0.64, 0.69, 0.70, 0.66, 0.65, 0.65",
                                   _DESIGN)),
})


def trust_text(device_model: str) -> str:
    """What is known of a device model's accuracy, as one line for a report."""
    figures = DEVICE_MODEL_TRUST.get(device_model)
    if not figures:
        return "not yet checked against a measurement or a published number"
    return "; ".join(f"{f.check}: {f.ratio} ({f.source})" for f in figures)


def device_models(rows: Iterable[ResultRow]) -> tuple[str, ...]:
    """The device models the rows' predictions were priced on, sorted."""
    return tuple(sorted({r.device_model for r in rows if r.device_model is not None
                         and r.predicted_samples_per_s is not None}))
