"""The ActNN paper's reference numbers (docs/design.md §6), so plots and reports can set ours beside theirs.

Every number here comes from Chen, Zheng et al., ICML 2021 (arXiv 2104.14129): ResNet-50, 224²,
an NVIDIA T4 with 16 GB, PyTorch 1.7. Comparisons are only meaningful for the same model, input
size and memory budget, so :func:`matches` is the single gate every caller goes through.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from actbench.schema import LIMITS, InputSize, one_line
from actbench.store.reading import RunFileError, check_kind, read_csv

if TYPE_CHECKING:
    from actbench.reporting.runs import ResultRuns

CITATION = ("Chen, Zheng et al., \"ActNN: Reducing Training Memory Footprint via 2-Bit Activation "
            "Compressed Training\", ICML 2021, arXiv 2104.14129")

GIB = 1 << 30


@dataclass(frozen=True)
class PaperSetting:
    """The set-up the paper measured; ours is compared to it only when model, size and budget agree."""

    model: str = "resnet50"
    image_size: int = 224
    budget_bytes: int = 16 * GIB
    gpu: str = "NVIDIA T4 (16 GB)"
    torch_version: str = "1.7"
    #: "16 GB" (a T4 exposes ~15 GiB) and "16 GiB" budgets both count as the paper's budget
    budget_tolerance: float = 0.10
    #: the GPU spec (actbench/core/gpus.py) that plans for the paper's GPU; rows planned for it match
    gpu_spec: str = "t4"
    #: the paper's machine: "an AWS g4dn.4xlarge instance, which has a 16GB NVIDIA T4 GPU and 64GB CPU
    #: memory" (Section 6); the host budget its swap and L4/L5 had, at most (docs/design.md §6, §10)
    host_memory_bytes: int = 64 * GIB
    machine: str = "AWS g4dn.4xlarge (64 GB host memory)"
    #: the paper's maximum batches are all multiples of 32: each is a lower bound, the true limit lies
    #: below the next multiple
    batch_grid: int = 32


SETTING = PaperSetting()

#: largest batch that trains, per strategy (docs/design.md §6); dtr/cap/blpa are the paper's baselines
MAX_BATCH: Mapping[str, int] = MappingProxyType({
    "fp32": 160, "L1": 256, "L2": 416, "L3": 608, "L4": 768, "L5": 1056,
    "swap": 480, "dtr": 256, "cap": 288, "blpa": 608,
})

#: fp32's training throughput on the paper's figure (images/s at batch 160, docs/design.md §6)
FP32_IMAGES_PER_S = 120.0

#: fp32 activation bytes / L3 activation bytes (64 vs ~5.25 bits per element per conv-BN-ReLU block)
ACTIVATION_REDUCTION_L3 = 12.0

#: default location of the throughput figure's points inside the repository
DEFAULT_THROUGHPUT_CSV = Path(__file__).resolve().parents[2] / "results" / "paper" / "resnet50_t4_throughput.csv"


@dataclass(frozen=True)
class PaperPoint:
    """One point read off the paper's throughput figure (±1 images/s, ±4 batch)."""

    strategy: str
    batch_size: int
    samples_per_s: float | None
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def matches(model: str, size: InputSize, budget_bytes: int | None, setting: PaperSetting = SETTING,
            gpu: str | None = None) -> bool:
    """True when a group of rows was measured in the paper's setting (model, input size, and the budget
    or, for rows planned for a GPU spec, the paper's GPU's spec)."""
    if not matches_model(model, size, setting):
        return False
    if gpu is not None:
        return gpu == setting.gpu_spec
    if budget_bytes is None:
        return False
    return abs(budget_bytes - setting.budget_bytes) <= setting.budget_tolerance * setting.budget_bytes


def paper_batch_range(strategy: str, setting: PaperSetting = SETTING) -> tuple[int, int] | None:
    """(lowest, highest) the paper's true maximum batch can be: its number is on a 32-grid, a lower bound."""
    value = paper_max_batch(strategy)
    return None if value is None else (value, value + setting.batch_grid - 1)


def matches_model(model: str, size: InputSize, setting: PaperSetting = SETTING) -> bool:
    """Model and input size agree (enough for ratios that do not depend on the budget, e.g. activation)."""
    return model == setting.model and size == InputSize(setting.image_size, setting.image_size)


def paper_max_batch(strategy: str) -> int | None:
    return MAX_BATCH.get(strategy) if strategy in MAX_BATCH else MAX_BATCH.get(strategy.lower())


#: what a paper point's status may be: measured, or the figure's cross (the first batch that failed)
PAPER_STATUSES = ("ok", "oom")
#: the columns of the paper's throughput CSV
PAPER_COLUMNS = ("strategy", "batch_size", "ips", "status")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]{0,63}")


def load_throughput(path: Path | None = None) -> tuple[PaperPoint, ...]:
    """Points of the paper's throughput-vs-batch figure; ValueError (one line naming the file, the line
    and the field) when the CSV is missing or any line is bad: a reference that is silently wrong would
    be drawn beside every measurement, so the first bad line refuses the file rather than being skipped."""
    path = DEFAULT_THROUGHPUT_CSV if path is None else path
    try:
        found = read_csv(path, PAPER_COLUMNS, comments=True)
    except RunFileError as exc:
        raise ValueError(f"paper throughput CSV {exc}") from None
    if found is None:
        raise ValueError(f"paper throughput CSV '{path}' cannot be read: No such file or directory")
    rows, problems = found
    first_bad = min(problems, default=None)
    points = []
    for lineno, record in rows:
        if first_bad is not None and first_bad[0] < lineno:
            break
        try:
            points.append(_paper_point(record))
        except ValueError as exc:  # the only refusal _paper_point makes (read_csv checked the cells)
            raise ValueError(one_line(f"paper throughput CSV '{path}' line {lineno}: {exc}")) from None
    if first_bad is not None:
        raise ValueError(one_line(f"paper throughput CSV '{path}' line {first_bad[0]}: {first_bad[1]}"))
    if not points:
        raise ValueError(f"paper throughput CSV '{path}' has no points")
    return tuple(points)


def _paper_point(record: Mapping[str, str | None]) -> PaperPoint:
    """One line's point; ValueError naming the field and what it may be."""
    fields = {name: (record.get(name) or "").strip() for name in PAPER_COLUMNS}
    if not _LABEL.fullmatch(fields["strategy"]):
        raise ValueError(f"strategy must be a label of letters, digits and _.+@- (up to 64), got {fields['strategy']!r:.80}")
    batch = fields["batch_size"]
    if not (batch.isascii() and batch.isdigit() and 1 <= int(batch) <= LIMITS["batch"]):
        raise ValueError(f"batch_size must be an integer in 1..{LIMITS['batch']}, got {batch!r:.80}")
    try:
        ips = float(fields["ips"]) if fields["ips"] else None
    except ValueError:
        ips = math.nan
    if ips is not None and not (math.isfinite(ips) and ips > 0):
        raise ValueError(f"ips must be a positive number of images/s or empty, got {fields['ips']!r:.80}")
    if fields["status"] not in PAPER_STATUSES:
        raise ValueError(f"status must be one of {', '.join(PAPER_STATUSES)}, got {fields['status']!r:.80}")
    return PaperPoint(fields["strategy"], int(batch), ips, fields["status"])


def paper_throughput_at(points: tuple[PaperPoint, ...], strategy: str, batch_size: int,
                        tolerance: int = 4) -> PaperPoint | None:
    """The paper's ok point of ``strategy`` nearest ``batch_size``, within the ±4 read-off tolerance."""
    near = [p for p in points if p.ok and p.strategy.lower() == strategy.lower()
            and abs(p.batch_size - batch_size) <= tolerance and p.samples_per_s is not None]
    return min(near, key=lambda p: abs(p.batch_size - batch_size)) if near else None


def load_checked(paper_csv: Path | None) -> tuple[PaperPoint, ...]:
    """The paper's throughput points; ValueError (one line) for a CSV that is missing, bad, or not a
    regular file (a FIFO or a device is never opened)."""
    check_kind(DEFAULT_THROUGHPUT_CSV if paper_csv is None else paper_csv)
    return load_throughput(paper_csv)


def input_files(found: ResultRuns, paper_csv: Path | None) -> list[Path]:
    """What ``plot`` and ``report`` read: the runs' files and the paper's CSV (no output may replace one)."""
    return found.files() + [DEFAULT_THROUGHPUT_CSV if paper_csv is None else paper_csv]
