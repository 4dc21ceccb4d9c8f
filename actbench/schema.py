"""What a point is and what a row says: the result schema, without torch (docs/design.md §4, §7).

Everything that reads, analyses or plots results imports this module and nothing heavier, so
``actbench report`` starts without loading torch. The measuring side (``actbench.measure``) fills
the same dataclasses. A row is composed from the point that was measured and the measurement made
of it (:func:`ResultRow.build`); its columns are not typed a second time.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

# --- constants spelled once ----------------------------------------------------------------------
#: ActNN's compression levels (docs/design.md §3), in order of increasing compression.
LEVEL_NAMES: tuple[str, ...] = ("L0", "L1", "L2", "L3", "L4", "L5")
#: The strategy every comparison is made against.
BASELINE = "fp32"
#: What max-scale grows (ResNet-152 only for depth and width) and what plan can also search.
DIMENSIONS: tuple[str, ...] = ("depth", "width", "resolution")
PLAN_DIMENSIONS: tuple[str, ...] = ("batch",) + DIMENSIONS
#: Seconds before a point's child is killed (status ``timeout``), unless the user says otherwise.
DEFAULT_TIMEOUT_S = 1800.0
#: The smallest input side any point trains at; a model that needs more says so (its task's ``size_problem``:
#: AlexNet, Inception, VGG, ... in ``actbench/training/tasks/classification.py``).
MIN_IMAGE_SIZE = 16
#: The model that max-scale grows in depth and width (docs/design.md §5).
GROWABLE_MODEL = "resnet152"
#: Numeric precision of the training step (docs/design.md §1): fp32, or autocast to bf16/fp16 (fp16 with a
#: gradient scaler). Orthogonal to the strategy: every strategy runs at every precision.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: The precision every existing run used; points at it keep the key they had before precision existed.
DEFAULT_PRECISION = "fp32"
#: Largest values accepted for each searchable quantity: far beyond any device (a batch of 2^20
#: images, 65,536 extra blocks, width_per_group 8,192, 16,384-pixel inputs), yet small enough that
#: a typo like 1:100000000000 is refused instead of expanding into billions of points.
LIMITS: dict[str, int] = {"batch": 2**20, "depth": 65536, "width": 8192, "resolution": 16384, "frames": 4096}
#: Most values a batch list may expand to (a scan measures each one; --find-max searches a range).
MAX_LIST_VALUES = 10_000
#: Most compressed draws one verify-grads takes: hundreds of times the 8 to 16 a bias check needs, yet a
#: typo like 100000000 is refused instead of training for months (each draw is a training step).
MAX_SEEDS = 10_000
#: Longest name read from a file (a model, a strategy, a device model's name or label): far past any real
#: one (``checkpoint+L3``, ``fasterrcnn_..._fpn``), short enough for every row, table and figure it reaches.
MAX_NAME_CHARS = 100

STATUSES: tuple[str, ...] = ("ok", "oom", "over_budget", "host_over_budget", "error", "timeout")
#: Statuses that mean "does not fit": what bounds a search (error and timeout say nothing about memory).
#: ``host_over_budget``: the device memory fits, the pinned host memory (swap, save_on_cpu, L4/L5) does not.
MEMORY_FAILURES: tuple[str, ...] = ("oom", "over_budget", "host_over_budget")
#: Failures to measure, not results: a rerun measures these points again (unless told not to retry).
RETRIED_STATUSES: tuple[str, ...] = ("error", "timeout")


# --- the point -----------------------------------------------------------------------------------
class SizeError(ValueError):
    """A size a point cannot train at. ``field`` is ``image_size`` or ``frames``; ``problem`` completes
    the option's name (``--image-size height must be ...``) unless ``whole`` (a sentence of its own)."""

    def __init__(self, field: str, problem: str, whole: bool = False) -> None:
        super().__init__(problem if whole else f"{field}: {problem}")
        self.field = field
        self.problem = problem
        self.whole = whole

    def as_option(self) -> str:
        """The message in the CLI's words: ``--image-size height must be in 16..16384 pixels, got 8``."""
        return self.problem if self.whole else f"--{self.field.replace('_', '-')} {self.problem}"


@dataclass(frozen=True)
class InputSize:
    """What one sample's input measures: ``height`` × ``width`` pixels and, for a clip, its ``frames``
    (None: a still image). Written ``224`` (square), ``512x1024`` (H×W); frames come separately."""

    height: int
    width: int
    frames: int | None = None

    @classmethod
    def parse(cls, text: str | int, frames: int | None = None) -> "InputSize":
        """``"224"``/``224`` (square) or ``"512x1024"`` (height × width); SizeError (one line) otherwise."""
        sides = str(text).strip().lower().replace("×", "x").split("x")
        if len(sides) not in (1, 2) or not all(side.strip().isascii() and side.strip().isdigit() for side in sides):
            raise SizeError("image_size", f"must be N or HxW (e.g. 224 or 512x1024), got '{text}'")
        height, width = int(sides[0]), int(sides[-1])
        return cls(height, width, frames)

    @classmethod
    def of(cls, size: "InputSize | int") -> "InputSize":
        """``size`` itself, or an int as a square still image of that side."""
        return size if isinstance(size, InputSize) else cls(size, size)

    @classmethod
    def from_fields(cls, image_size: int, image_width: int | None, frames: int | None) -> "InputSize":
        """The size a point's (or a row's) ``image_size``, ``image_width`` and ``frames`` hold."""
        return cls(image_size, image_size if image_width is None else image_width, frames)

    def point_fields(self) -> dict[str, int | None]:
        """The PointConfig fields that hold this size (width and frames only when they add something)."""
        return {"image_size": self.height, "image_width": None if self.square else self.width,
                "frames": self.frames}

    @property
    def square(self) -> bool:
        return self.height == self.width

    def text(self) -> str:
        """``224`` or ``512x1024``: what ``--image-size`` takes back."""
        return str(self.height) if self.square else f"{self.height}x{self.width}"

    def label(self) -> str:
        """``224px``, ``512x1024px``, or ``16x112px`` for 16 frames of 112² pixels."""
        clip = "" if self.frames is None else f"{self.frames}x"
        return f"{clip}{self.text()}px"

    def check(self, low: int, high: int) -> None:
        """SizeError unless each side is in ``low..high`` pixels and the frames (if any) in 1..LIMITS."""
        for name, value in (("height", self.height), ("width", self.width)):
            if not low <= value <= high:
                raise SizeError("image_size", f"{name} must be in {low}..{high} pixels, got {value}")
        if self.frames is not None and not 1 <= self.frames <= LIMITS["frames"]:
            raise SizeError("frames", f"must be in 1..{LIMITS['frames']}, got {self.frames}")


@dataclass(frozen=True)
class ModelSpec:
    """What to build. ``extra_blocks``/``width_per_group`` apply to resnet152 only (the grown ResNet)."""

    name: str
    extra_blocks: int = 0
    width_per_group: int | None = None
    num_classes: int = 1000

    def label(self) -> str:
        parts = [self.name]
        if self.extra_blocks:
            parts.append(f"+{self.extra_blocks}blk")
        if self.width_per_group is not None:
            parts.append(f"w{self.width_per_group}")
        return "-".join(parts)


@dataclass(frozen=True)
class PointConfig:
    """Everything that determines one measurement; its hash is the row's ``key``."""

    model: ModelSpec
    strategy: str
    batch_size: int
    image_size: int
    device: str
    budget_bytes: int | None = None
    warmup_steps: int = 1
    timed_steps: int = 3
    checkpoint_segments: int | None = None
    seed: int = 0
    precision: str = DEFAULT_PRECISION
    #: GPU spec the point is planned for (actbench/core/gpus.py; meta only), None: an idealised device
    gpu: str | None = None
    #: pinned host memory allowed (swap, save_on_cpu, L4/L5), None: unlimited
    host_budget_bytes: int | None = None
    #: input width when it differs from ``image_size`` (the height), None: square
    image_width: int | None = None
    #: frames per clip (video models), None: still images
    frames: int | None = None

    @property
    def size(self) -> InputSize:
        """The input's height, width and frames."""
        return InputSize.from_fields(self.image_size, self.image_width, self.frames)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PointConfig":
        data = dict(data)
        data["model"] = ModelSpec(**data["model"])
        return cls(**data)

    def key(self) -> str:
        """Stable 16-hex-digit hash of the configuration (resume matches rows by it).

        ``precision`` is hashed only when it is not fp32, and ``gpu`` and ``host_budget_bytes`` only when
        set, so every point measured before they existed keeps its key and committed runs still resume.
        """
        data = self.to_dict()
        if data["precision"] == DEFAULT_PRECISION:
            del data["precision"]
        for name in _KEYED_WHEN_SET:
            if data[name] is None:
                del data[name]
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        precision = "" if self.precision == DEFAULT_PRECISION else f" {self.precision}"
        gpu = "" if self.gpu is None else f" ({self.gpu})"
        return f"{self.model.label()} {self.strategy}{precision} b{self.batch_size} {self.size.label()} {self.device}{gpu}"


#: PointConfig fields added after runs were committed: part of the key only when set.
_KEYED_WHEN_SET = ("gpu", "host_budget_bytes", "image_width", "frames")


# --- the measurement -----------------------------------------------------------------------------
@dataclass
class Measurement:
    """What measuring a point reports. ``None`` means "not measured", never zero."""

    status: str
    message: str = ""
    activation_bytes: int | None = None
    peak_alloc_bytes: int | None = None
    reserved_bytes: int | None = None
    model_bytes: int | None = None
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    host_bytes: int | None = None
    samples_per_s_median: float | None = None
    samples_per_s_iqr: float | None = None
    step_time_s_median: float | None = None
    #: training steps the point ran (warm-up, the memory step, timed steps) and their wall seconds
    steps_run: int | None = None
    steps_s: float | None = None
    flops_per_sample: float | None = None
    forward_flops_per_sample: float | None = None
    num_params: int | None = None
    depth: int | None = None
    strategy_note: str | None = None
    alloc_conf: str | None = None
    elapsed_s: float | None = None
    #: the step-time model's prediction (actbench/planning/step_time.py), never a measurement, and the
    #: device model it priced the step on (a GPU spec's name or a calibrated model's)
    predicted_step_s: float | None = None
    predicted_samples_per_s: float | None = None
    device_model: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def failure(cls, status: str, message: str, **extra: Any) -> "Measurement":
        """A point that could not be measured (or did not fit), with one line saying why."""
        return cls(status=status, message=one_line(message), **extra)


#: How long a stored message may be (rows, error replies of children).
MESSAGE_LIMIT = 300


#: Binary units, largest first: what :func:`format_bytes` writes.
BYTE_UNITS: tuple[tuple[str, int], ...] = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: int | None, decimals: int | None = 2, sep: str = " ", missing: str = "-") -> str:
    """Bytes for people, in the largest binary unit they reach: ``14.50 GiB``, ``292.48 MiB``, ``512 B``.

    ``decimals=None``: three significant digits, for labels and folder names (``16 GiB``, ``14.5 GiB``);
    ``missing``: what None reads as (tables write a dash).
    """
    if n is None:
        return missing
    for unit, size in BYTE_UNITS:
        if abs(n) >= size:
            number = f"{n / size:.3g}" if decimals is None else f"{n / size:.{decimals}f}"
            return f"{number}{sep}{unit}"
    return f"{n}{sep}B"


def one_line(text: object, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` with its whitespace collapsed to single spaces, cut to ``limit`` characters (ending in …)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_line(exc: BaseException, limit: int = MESSAGE_LIMIT) -> str:
    """An exception as one line: ``TypeName: message``."""
    return one_line(f"{type(exc).__name__}: {exc}", limit)


# --- the row -------------------------------------------------------------------------------------
#: Column order of ``table.csv`` (and of ``rows.jsonl``'s objects): identity first, then what was
#: measured, then how. Names only; each column's type comes from the dataclass that owns it.
_ROW_OWN = {"key": str, "run_id": str, "env_id": str, "model": str, "finished_at": "str | None"}
_FROM_MODEL = ("extra_blocks", "width_per_group")
_FROM_POINT = ("strategy", "batch_size", "image_size", "device", "budget_bytes", "precision", "gpu",
               "host_budget_bytes", "image_width", "frames", "checkpoint_segments", "warmup_steps", "timed_steps")
#: Columns with a default other than None: rows written before the column existed read as this value.
_ROW_DEFAULTS = {"precision": DEFAULT_PRECISION}
COLUMNS: tuple[str, ...] = (
    "key", "run_id", "env_id", "status", "message", "model", "extra_blocks", "width_per_group", "depth",
    "strategy", "batch_size", "image_size", "device", "budget_bytes", "precision", "gpu", "host_budget_bytes",
    "image_width", "frames", "activation_bytes", "peak_alloc_bytes", "reserved_bytes", "model_bytes", "param_bytes", "grad_bytes",
    "optimizer_state_bytes", "host_bytes", "samples_per_s_median", "samples_per_s_iqr", "step_time_s_median",
    "predicted_step_s", "predicted_samples_per_s", "device_model",
    "flops_per_sample", "forward_flops_per_sample", "num_params", "checkpoint_segments", "warmup_steps",
    "timed_steps", "steps_run", "steps_s", "strategy_note", "alloc_conf", "elapsed_s", "finished_at",
)


def _row_fields() -> list[tuple[str, Any, Any]]:
    """(name, type, field) of every column, each type taken from its owner; identity columns are
    required, measured ones default to None (not measured); ``precision`` defaults to fp32 (older rows)."""
    owners = {f.name: f.type for cls in (Measurement, PointConfig, ModelSpec) for f in fields(cls)}
    first_optional = COLUMNS.index("precision")
    return [(name, _ROW_OWN.get(name) or owners[name],
             dataclasses.field(default=_ROW_DEFAULTS.get(name)) if i >= first_optional else dataclasses.field())
            for i, name in enumerate(COLUMNS)]


def _check_columns() -> None:
    point_side = set(_ROW_OWN) | set(_FROM_MODEL) | set(_FROM_POINT)
    measured = {f.name for f in fields(Measurement)}
    missing = (point_side | measured) - set(COLUMNS)
    if missing or len(set(COLUMNS)) != len(COLUMNS):
        raise AssertionError(f"COLUMNS must name every row field once; missing {sorted(missing)}")


_check_columns()


def _build(cls: type, point: PointConfig, m: Measurement, run_id: str, env_id: str) -> Any:
    identity = {name: getattr(point, name) for name in _FROM_POINT}
    identity.update({name: getattr(point.model, name) for name in _FROM_MODEL})
    return cls(key=point.key(), run_id=run_id, env_id=env_id, model=point.model.name,
               finished_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               **identity, **asdict(m))


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    return cls(**{k: v for k, v in data.items() if k in _ROW_NAMES})


def _ok(self: Any) -> bool:
    return self.status == "ok"


def _size(self: Any) -> InputSize:
    return InputSize.from_fields(self.image_size, self.image_width, self.frames)


_ROW_NAMES = frozenset(COLUMNS)

ResultRow = dataclasses.make_dataclass(
    "ResultRow", _row_fields(),
    namespace={
        "__module__": __name__,
        "__doc__": "One measured point: the point's identity plus its Measurement. Units are in the names; "
                   "``None`` = not measured (differs from 0).",
        "build": classmethod(_build),
        "from_dict": classmethod(_from_dict),
        "ok": property(_ok),
        "size": property(_size),
    },
)


# --- checking a row read back --------------------------------------------------------------------
#: The largest number any column holds (a signed 64-bit integer: bytes, FLOPs, parameters).
MAX_COLUMN_VALUE = 2**63 - 1
#: Columns that count something there is at least one of, with their largest value; other numeric
#: columns are at least 0 and at most :data:`MAX_COLUMN_VALUE`.
_AT_LEAST_ONE: dict[str, int] = {
    "batch_size": LIMITS["batch"], "image_size": LIMITS["resolution"], "image_width": LIMITS["resolution"],
    "frames": LIMITS["frames"], "width_per_group": LIMITS["width"],
    "depth": 4 * LIMITS["depth"] + 1000, "checkpoint_segments": LIMITS["batch"],
    "budget_bytes": MAX_COLUMN_VALUE, "host_budget_bytes": MAX_COLUMN_VALUE,
}
_AT_MOST: dict[str, int] = {"extra_blocks": LIMITS["depth"], "warmup_steps": 10**6, "timed_steps": 10**6}


def number_problem(name: str, value: Any, low: float, high: float) -> str | None:
    """Why a numeric column's value cannot be true (not finite, outside ``low..high``), or None."""
    if value is None or isinstance(value, (str, bool)) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"field '{name}' is {value!r} (expected a finite number)"
    if not low <= value <= high:
        return f"field '{name}' is {value!r} (expected {low:g} to {high:g})"
    return None


def column_range(name: str) -> tuple[int, int]:
    """The smallest and largest value column ``name`` may hold. Reading rows back checks them, and what
    writes a point's values (options, experiment files) checks the same ones first, so a command never
    records a row its own readers would skip."""
    low = 1 if name in _AT_LEAST_ONE else 0
    return low, _AT_LEAST_ONE.get(name, _AT_MOST.get(name, MAX_COLUMN_VALUE))


def row_value_problem(data: dict[str, Any]) -> str | None:
    """Why a row's values (of the right types) cannot be a measurement, or None: sizes are at least 1
    and within :data:`LIMITS`, every other number finite and non-negative, the precision known.
    What reads rows back (results, analysis, plots, report) skips such a row instead of publishing it."""
    for name in COLUMNS:
        problem = number_problem(name, data.get(name), *column_range(name))
        if problem is not None:
            return problem
    precision = data.get("precision", DEFAULT_PRECISION)
    if precision not in PRECISIONS:
        return f"unknown precision {one_line(precision, 40)!r} (expected one of {', '.join(PRECISIONS)})"
    return None
