"""Re-predict measured speed rows: the step times a ``speed_vs_<device>.csv`` measured, priced anew on meta.

A device model changes (a new term, a new calibration) after a point was measured, perhaps on a GPU no
longer at hand; the measured columns are kept as they were, the prediction is made again on meta with
the given model, and the earlier prediction stays beside it in its own predicted column.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from actbench.schema import DEFAULT_PRECISION, ModelSpec, PointConfig
from actbench.studies.trust import PREDICTING_DEVICE, SpeedComparison

if TYPE_CHECKING:
    from actbench.planning.device_models import DeviceModel

#: Columns a speed CSV must have for its rows to be re-predicted.
REQUIRED = ("model", "strategy", "batch_size", "image_size", "device", "device_model", "measured_status",
            "predicted_step_s", "measured_step_s")


def _number(text: str | None) -> float | None:
    return None if text in (None, "") else float(text)


def read_speed_csv(path: Path) -> list[SpeedComparison]:
    """The rows of a ``speed_vs_<device>.csv`` written by ``actbench trust --device-model``; ValueError
    naming the file and the missing columns or the bad cell."""
    if not path.is_file():
        raise ValueError(f"{path}: not a file; expected a speed_vs_<device>.csv from `actbench trust --device-model`")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        try:
            return [SpeedComparison(r["model"], r["strategy"], int(r["batch_size"]), int(r["image_size"]), r["device"],
                                    r["device_model"], r.get("predicted_status") or "", r["measured_status"],
                                    _number(r["predicted_step_s"]), _number(r["measured_step_s"]),
                                    _number(r.get("measured_spread")), r.get("message") or "",
                                    r.get("precision") or DEFAULT_PRECISION)
                    for r in reader]
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def repredict_speed(rows: list[SpeedComparison], speed_model: "DeviceModel") -> list[SpeedComparison]:
    """Each row predicted again on meta, priced on ``speed_model``; measured columns as they were, the
    row's own prediction moved to ``predicted_step_s_earlier``."""
    from actbench.measure.meta import MetaSessions
    from actbench.planning.point import Point

    sessions = MetaSessions(speed_model=speed_model)
    out = []
    for row in rows:
        predicted = sessions.measure_point(Point.resolve(PointConfig(
            ModelSpec(row.model), row.strategy, row.batch_size, row.image_size, PREDICTING_DEVICE, timed_steps=0,
            precision=row.precision)))
        out.append(SpeedComparison(row.model, row.strategy, row.batch_size, row.image_size, row.device,
                                   speed_model.name, predicted.status, row.measured_status, predicted.predicted_step_s,
                                   row.measured_step_s, row.measured_spread, row.message, row.precision,
                                   row.predicted_step_s, row.device_model))
    return out
