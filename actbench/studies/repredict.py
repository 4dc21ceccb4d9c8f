"""Re-predict measured speed rows: the step times a ``speed_vs_<device>.csv`` measured, priced anew on meta.

A device model changes (a new term, a new calibration) after a point was measured, perhaps on a GPU no
longer at hand; the measured columns are kept as they were, the prediction is made again on meta with
the given model, and the earlier prediction stays beside it in its own predicted column.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from actbench.core.devices import MEASURING_DEVICES
from actbench.schema import (DEFAULT_PRECISION, LIMITS, MAX_NAME_CHARS, PRECISIONS, STATUSES, ModelSpec, PointConfig,
                             one_line)
from actbench.studies.trust import PREDICTING_DEVICE, SpeedComparison, predict_point

if TYPE_CHECKING:
    from actbench.planning.device_models import DeviceModel

log = logging.getLogger(__name__)

#: Columns a speed CSV must have for its rows to be re-predicted.
REQUIRED = ("model", "strategy", "batch_size", "image_size", "device", "device_model", "measured_status",
            "predicted_step_s", "measured_step_s")


def read_speed_csv(path: Path) -> list[SpeedComparison]:
    """The rows of a ``speed_vs_<device>.csv`` written by ``actbench trust --device-model``. A line that
    is not a measured point (unknown names, sizes out of range, times not finite) is skipped with one
    warning ``PATH:LINE: skipped: WHY``, as rows.jsonl's are; ValueError (one line naming the file) when
    the file is not such a table or holds no row to re-predict."""
    from actbench.store.reading import read_csv

    found = read_csv(path, REQUIRED)
    if found is None:
        raise ValueError(f"'{path}' does not exist; expected a speed_vs_<device>.csv from "
                         "`actbench trust --device-model`")
    lines, problems = found
    rows = []
    for lineno, cells in lines:
        try:
            rows.append(speed_row(cells))
        except ValueError as exc:
            problems.append((lineno, str(exc)))
    for lineno, why in sorted(problems):
        log.warning("%s:%d: skipped: %s", path, lineno, why)
    if not rows:
        why = (f"each of its {len(problems)} line(s) after the header was skipped (see the warnings above)"
               if problems else "it holds a header and no rows")
        raise ValueError(f"'{path}': no row to re-predict: {why}")
    return rows


def speed_row(cells: dict[str, str]) -> SpeedComparison:
    """One measured point of a speed CSV; ValueError naming the field, its value and what is allowed."""
    from actbench.training.model_names import validate_model_spec

    model = _name(cells, "model")
    try:
        validate_model_spec(ModelSpec(model))
    except ValueError as exc:
        raise ValueError(f"field 'model': {one_line(exc)}") from None
    precision = cells.get("precision") or DEFAULT_PRECISION
    _choice("precision", precision, PRECISIONS)
    _choice("device", cells["device"].partition(":")[0], MEASURING_DEVICES)
    _choice("measured_status", cells["measured_status"], STATUSES)
    if cells.get("predicted_status"):
        _choice("predicted_status", cells["predicted_status"], STATUSES)
    return SpeedComparison(model, _strategy(_name(cells, "strategy")), _count(cells, "batch_size", 2, LIMITS["batch"]),
                           _image_size(model, cells), cells["device"], _name(cells, "device_model"),
                           cells.get("predicted_status") or "", cells["measured_status"],
                           _seconds(cells, "predicted_step_s"), _seconds(cells, "measured_step_s"),
                           _seconds(cells, "measured_spread", low=0.0), one_line(cells.get("message") or ""),
                           precision)


def _name(cells: dict[str, str], field: str) -> str:
    """A name cell, refused past :data:`MAX_NAME_CHARS` characters before any lookup compares it with
    the known ones."""
    if len(cells[field]) > MAX_NAME_CHARS:
        raise ValueError(f"field '{field}' is {len(cells[field])} characters long (a name has at most {MAX_NAME_CHARS})")
    return cells[field]


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"field '{field}' is {one_line(value, 40)!r} (expected one of {', '.join(allowed)})")


def _strategy(value: str) -> str:
    """The strategy's one spelling (what trust wrote); ValueError naming the field."""
    from actbench.execution.parsing import parse_strategies

    try:
        chosen = parse_strategies(value)
    except ValueError as exc:
        raise ValueError(f"field 'strategy': {one_line(exc)}") from None
    if len(chosen) != 1:
        raise ValueError(f"field 'strategy' is {one_line(value, 40)!r} (expected one strategy or level, "
                         "e.g. fp32 or L3)")
    return chosen[0]


def _count(cells: dict[str, str], field: str, low: int, high: int) -> int:
    """A count cell from ``low`` to ``high``, sized before it is converted; ValueError naming the field."""
    from actbench.execution.parsing import whole_number

    text = cells[field].strip()
    try:
        value = whole_number(text, signed=False) if len(text) <= len(str(high)) else None
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ValueError(f"field '{field}' is {one_line(text, 40)!r} (expected a whole number from {low} to {high})")
    return value


def _image_size(model: str, cells: dict[str, str]) -> int:
    """The input side, one ``model`` can be built for; ValueError naming the field and the range."""
    from actbench.schema import MIN_IMAGE_SIZE, SizeError
    from actbench.training.tasks import input_size_for

    side = _count(cells, "image_size", MIN_IMAGE_SIZE, LIMITS["resolution"])
    try:
        input_size_for(model, side)
    except SizeError as exc:
        raise ValueError(f"field 'image_size' is {side}: {exc.problem}") from None
    return side


def _seconds(cells: dict[str, str], field: str, low: float | None = None) -> float | None:
    """A time (or share) cell: empty (not measured), or a finite number above 0 (at least ``low``)."""
    text = (cells.get(field) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (value < low if low is not None else value <= 0):
        expected = f"at least {low:g}" if low is not None else "above 0"
        raise ValueError(f"field '{field}' is {one_line(text, 40)!r} (expected a finite number {expected}, or empty)")
    return value


def repredict_speed(rows: list[SpeedComparison], speed_model: "DeviceModel") -> list[SpeedComparison]:
    """Each row predicted again on meta, priced on ``speed_model``; measured columns as they were, the
    row's own prediction moved to ``predicted_step_s_earlier``."""
    from actbench.measure.meta import MetaSessions

    sessions = MetaSessions(speed_model=speed_model)
    out = []
    for row in rows:
        predicted = predict_point(sessions, PointConfig(
            ModelSpec(row.model), row.strategy, row.batch_size, row.image_size, PREDICTING_DEVICE, timed_steps=0,
            precision=row.precision))
        out.append(SpeedComparison(row.model, row.strategy, row.batch_size, row.image_size, row.device,
                                   speed_model.name, predicted.status, row.measured_status, predicted.predicted_step_s,
                                   row.measured_step_s, row.measured_spread,
                                   one_line(predicted.message or row.message, 120), row.precision,
                                   row.predicted_step_s, row.device_model))
    return out
