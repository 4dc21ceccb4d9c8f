"""How far ``meta`` predictions are from measurements: the same points on meta and on cpu or cuda.

``actbench trust --device cuda`` writes ``meta_vs_<device>.csv`` (one row per point, kept across runs: a
point measured again replaces its row; both byte counts and their ratio meta / measured;
``meta_vs_<device>_<precision>.csv`` at bf16 or fp16, where both sides run under the same autocast);
``tests/test_meta.py`` holds the cpu ratios within 5%. On
cuda the peak ratio includes what cuDNN workspaces add, which meta does not see; ``reserved_ratio``
compares meta's caching-allocator model (docs/design.md §10, no GPU spec: no cuBLAS workspaces)
with the allocator's measured reserved peak. Points are measured in this process (the in-process
executor, no child per point).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from actbench.core.devices import PROFILES
from actbench.execution.executors import InProcessExecutor
from actbench.planning.point import Point
from actbench.schema import DEFAULT_PRECISION, Measurement, ModelSpec, PointConfig, one_line
from actbench.store.outputs import atomic_write_csv

if TYPE_CHECKING:
    from actbench.measure.meta import MetaSessions
    from actbench.planning.device_models import DeviceModel

TRUST_MODELS = ("resnet18", "resnet50", "densenet121", "mobilenet_v2")
TRUST_STRATEGIES = ("fp32", "checkpoint", "L2", "L3")


@dataclass(frozen=True)
class Comparison:
    """One point on meta and on ``device``; ratios are meta / measured (None when not measured)."""

    model: str
    strategy: str
    batch_size: int
    image_size: int
    device: str
    meta_status: str
    measured_status: str
    meta_activation_bytes: int | None
    measured_activation_bytes: int | None
    meta_peak_alloc_bytes: int | None
    measured_peak_alloc_bytes: int | None
    measured_reserved_bytes: int | None
    message: str
    precision: str = DEFAULT_PRECISION
    meta_reserved_bytes: int | None = None
    #: the input's width where it is not ``image_size`` (the height), and a clip's frames
    image_width: int | None = None
    frames: int | None = None

    @property
    def activation_ratio(self) -> float | None:
        return _ratio(self.meta_activation_bytes, self.measured_activation_bytes)

    @property
    def peak_ratio(self) -> float | None:
        return _ratio(self.meta_peak_alloc_bytes, self.measured_peak_alloc_bytes)

    @property
    def reserved_ratio(self) -> float | None:
        """meta's modelled reserved peak / the caching allocator's (None off cuda: nothing reserves there)."""
        return _ratio(self.meta_reserved_bytes, self.measured_reserved_bytes)


def _ratio(a: int | None, b: int | None) -> float | None:
    return None if a is None or not b else a / b


#: The device whose points are predictions (meta).
PREDICTING_DEVICE = next(name for name, p in PROFILES.items() if p.predicts)


def compare(device: str, models=TRUST_MODELS, strategies=TRUST_STRATEGIES, batch_size: int = 2,
            image_size: str | int = 32, on_point: Callable[[Comparison], None] | None = None,
            precision: str = DEFAULT_PRECISION) -> list[Comparison]:
    """Measure every (model, strategy) on meta and on ``device`` (memory only, no timed steps), both
    at ``precision``; ``image_size`` is N or HxW, a clip's frames its task's default."""
    from actbench.training.tasks import input_size_for

    executor = InProcessExecutor()  # an exception becomes an ``error`` measurement: one bad point ends nothing
    out = []
    for model in models:
        size = input_size_for(model, image_size)
        for strategy in strategies:
            predicted = PointConfig(ModelSpec(model), strategy, batch_size, **size.point_fields(),
                                    device=PREDICTING_DEVICE, timed_steps=0, precision=precision)
            measured = PointConfig(ModelSpec(model), strategy, batch_size, **size.point_fields(), device=device,
                                   warmup_steps=1, timed_steps=0, precision=precision)
            meta, real = executor.measure([Point.resolve(predicted), Point.resolve(measured)])
            out.append(Comparison(model, strategy, batch_size, size.height, device, meta.status, real.status,
                                  meta.activation_bytes, real.activation_bytes, meta.peak_alloc_bytes,
                                  real.peak_alloc_bytes, real.reserved_bytes, one_line(meta.message or real.message, 120),
                                  precision, meta.reserved_bytes, predicted.image_width, size.frames))
            if on_point is not None:
                on_point(out[-1])
    return out


def csv_name(device: str, precision: str = DEFAULT_PRECISION) -> str:
    """``meta_vs_<device>.csv``; another precision than fp32 gets its own file (fp32's name as before)."""
    return f"meta_vs_{device}.csv" if precision == DEFAULT_PRECISION else f"meta_vs_{device}_{precision}.csv"


def write_csv(rows: list[Comparison], path: Path, kept: Sequence[Mapping[str, str]] = ()) -> None:
    """Columns as before precision existed, then ``precision``, then the reserved-bytes comparison (readers by
    position keep working); ``kept``: the table's earlier rows (:func:`read_table`), which ``rows`` join."""
    later = ("precision", "meta_reserved_bytes")
    sizes = ("image_width", "frames")
    fields = [n for n in Comparison.__dataclass_fields__ if n not in later + sizes]
    names = fields + ["activation_ratio", "peak_ratio", *later, "reserved_ratio", *sizes]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(path, names, _merged(names, kept, rows, ".4f"), "CSV")


#: What names a point in a trust table: a point measured again replaces its row, every other row stays.
POINT_COLUMNS = ("model", "strategy", "batch_size", "image_size", "image_width", "frames", "device", "precision")


def read_table(path: Path) -> list[dict[str, str]]:
    """The rows a trust table (``meta_vs_*`` or ``speed_vs_*``) already holds, to keep when a run adds its
    own; none when it is absent. ValueError (one line naming the file and line) when a line is not a row:
    rewriting the table would lose it, so nothing is measured until it is moved aside."""
    from actbench.store.reading import read_csv

    found = read_csv(path, POINT_COLUMNS[:4])
    if found is None:
        return []
    rows, problems = found
    if problems:
        lineno, why = problems[0]
        raise ValueError(f"{path}:{lineno}: {why}: this table's rows are kept when points are added to it; "
                         "repair or move it aside, or choose another --out")
    return [cells for _, cells in rows]


def add_to_table(path: Path, rows: Sequence[object], write: Callable[..., None]) -> None:
    """``write(rows, path, kept)`` with ``kept`` the rows the table at ``path`` holds at this moment, read
    again under an exclusive lock on its folder: two runs adding to one table keep each other's rows
    (the lock is the folder's own, so the folder gains no file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        write(list(rows), path, read_table(path))
    finally:
        os.close(folder)  # and with it the lock


def _point(cells: Mapping[str, object]) -> tuple[str, ...]:
    """A row's point as text, whether read back from the table or about to be written to it."""
    values = ["" if cells.get(n) is None else str(cells.get(n)) for n in POINT_COLUMNS]
    return (*values[:-1], values[-1] or DEFAULT_PRECISION)  # tables from before precision existed: fp32


def _merged(names: Sequence[str], kept: Sequence[Mapping[str, str]], rows: Sequence[object],
            spec: str) -> list[list[object]]:
    """``kept`` rows of the points ``rows`` did not measure again, in their order, then ``rows``: a table
    several runs add to, where a point's latest measurement replaces its earlier row."""
    new = [{n: _cell(getattr(r, n), spec) for n in names} for r in rows]
    measured = {_point(cells) for cells in new}
    table = [old for old in kept if _point(old) not in measured] + new
    return [[cells.get(n, "") for n in names] for cells in table]


# --- speed: the step-time model against measured step times ----------------------------------------
SPEED_STRATEGIES = ("fp32", "L0", "L3", "checkpoint", "swap")


@dataclass(frozen=True)
class SpeedComparison:
    """One point's step time predicted on meta (priced on ``device_model``) and measured on ``device``."""

    model: str
    strategy: str
    batch_size: int
    image_size: int
    device: str
    device_model: str
    predicted_status: str
    measured_status: str
    predicted_step_s: float | None
    measured_step_s: float | None
    #: the measured steps' spread: IQR of samples/s over their median (None: too few steps)
    measured_spread: float | None
    message: str
    precision: str = DEFAULT_PRECISION
    #: a re-prediction's earlier prediction of the same measured point, and the model it was priced on
    predicted_step_s_earlier: float | None = None
    device_model_earlier: str | None = None

    @property
    def step_ratio(self) -> float | None:
        """predicted ÷ measured step seconds (1.0 = exact)."""
        return _ratio(self.predicted_step_s, self.measured_step_s)


def compare_speed(device: str, speed_model: "DeviceModel", models=("resnet18",), strategies=SPEED_STRATEGIES,
                  batch_size: int = 4, image_size: str | int = 64, timed_steps: int = 3,
                  on_point: Callable[[SpeedComparison], None] | None = None,
                  precision: str = DEFAULT_PRECISION) -> list[SpeedComparison]:
    """Predict every (model, strategy) on meta priced on ``speed_model`` and time it on ``device``."""
    from actbench.measure.meta import MetaSessions
    from actbench.measure.point import measure_point
    from actbench.worker import error_measurement

    from actbench.training.tasks import input_size_for

    sessions = MetaSessions(speed_model=speed_model)
    out = []
    for model in models:
        size = input_size_for(model, image_size)
        for strategy in strategies:
            predicted = predict_point(sessions, PointConfig(
                ModelSpec(model), strategy, batch_size, **size.point_fields(), device=PREDICTING_DEVICE,
                timed_steps=0, precision=precision))
            point = Point.resolve(PointConfig(ModelSpec(model), strategy, batch_size, **size.point_fields(),
                                              device=device, warmup_steps=1, timed_steps=timed_steps,
                                              precision=precision))
            try:
                real = measure_point(point)
            except Exception as exc:  # one bad point is a row, not the end of the comparison
                real = error_measurement(exc)
            spread = (real.samples_per_s_iqr / real.samples_per_s_median
                      if real.samples_per_s_iqr is not None and real.samples_per_s_median else None)
            out.append(SpeedComparison(model, strategy, batch_size, size.height, device, speed_model.name,
                                       predicted.status, real.status, predicted.predicted_step_s,
                                       real.step_time_s_median, spread, one_line(predicted.message or real.message, 120),
                                       precision))
            if on_point is not None:
                on_point(out[-1])
    return out


def predict_point(sessions: "MetaSessions", config: PointConfig) -> Measurement:
    """``config`` predicted on meta; an exception (a model its size cannot be built at) is an ``error``
    row with its one-line message, not the end of the comparison."""
    from actbench.worker import error_measurement

    try:
        return sessions.measure_point(Point.resolve(config))
    except Exception as exc:
        return error_measurement(exc)


@dataclass(frozen=True)
class OrderMiss:
    """Two strategies of one point (model, batch, size) that the prediction orders one way and the
    measurement the other.

    ``measured_gap``: how much slower the measured slower one ran, over the faster one's step;
    ``spread``: the larger of the two measured spreads (None when either is unknown). A gap within
    the spread is an order the measurement itself does not settle: steps of one strategy vary by
    that much from one to the next.
    """

    model: str
    batch_size: int
    image_size: int
    measured_faster: str
    measured_slower: str
    measured_gap: float
    spread: float | None

    @property
    def beyond_spread(self) -> bool:
        return self.spread is None or self.measured_gap > self.spread


def speed_order_misses(rows: list[SpeedComparison]) -> list[OrderMiss]:
    """Every pair of strategies, per model, batch and size, whose predicted order is not the measured one."""
    groups: dict[tuple, list[SpeedComparison]] = {}
    for r in rows:
        if r.predicted_step_s is not None and r.measured_step_s:
            groups.setdefault((r.model, r.batch_size, r.image_size), []).append(r)
    misses = []
    for (model, batch, size), group in groups.items():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if (a.predicted_step_s - b.predicted_step_s) * (a.measured_step_s - b.measured_step_s) >= 0:
                    continue
                fast, slow = (a, b) if a.measured_step_s < b.measured_step_s else (b, a)
                spreads = (fast.measured_spread, slow.measured_spread)
                misses.append(OrderMiss(model, batch, size, fast.strategy, slow.strategy,
                                        slow.measured_step_s / fast.measured_step_s - 1.0,
                                        None if None in spreads else max(spreads)))
    return misses


def describe_speed_order(misses: list[OrderMiss]) -> str:
    """One line: the order as measured, or each pair out of it with its measured gap and spread."""
    if not misses:
        return "order of strategies by speed: as measured"
    beyond = sum(m.beyond_spread for m in misses)
    pairs = "; ".join(
        f"{m.model} b{m.batch_size} {m.image_size}px {m.measured_faster} < {m.measured_slower} measured by "
        f"{m.measured_gap:.1%} (spread {'-' if m.spread is None else format(m.spread, '.1%')})" for m in misses)
    return (f"order of strategies by speed: NOT as measured in {len(misses)} pair(s), {beyond} by more than the "
            f"measured spread: {pairs}")


def speed_csv_name(device: str, precision: str = DEFAULT_PRECISION) -> str:
    """``speed_vs_<device>.csv`` (``speed_vs_<device>_<precision>.csv`` at bf16 or fp16)."""
    return f"speed_vs_{device}.csv" if precision == DEFAULT_PRECISION else f"speed_vs_{device}_{precision}.csv"


def write_speed_csv(rows: list[SpeedComparison], path: Path, kept: Sequence[Mapping[str, str]] = ()) -> None:
    """One row per point: both step times, the measured spread and the ratio predicted ÷ measured;
    ``kept``: the table's earlier rows (:func:`read_table`), which ``rows`` join."""
    names = [*SpeedComparison.__dataclass_fields__, "step_ratio"]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(path, names, _merged(names, kept, rows, ".6g"), "CSV")


def _cell(value: object, spec: str) -> object:
    """A CSV cell: empty for None, floats in ``spec``."""
    return "" if value is None else (format(value, spec) if isinstance(value, float) else value)
