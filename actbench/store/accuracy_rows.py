"""The accuracy study's run directory, without torch: its rows (``accuracy.jsonl``, the truth), their
checks and their CSV table, so ``actbench report`` reads them as lightly as the harness's rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ROWS_FILE = "accuracy.jsonl"
TABLE_FILE = "accuracy.csv"


@dataclass
class AccuracyRow:
    """One trained setting. ``target_bits`` None = fp32; ``mean_bits`` = the controller's network average."""

    key: str
    run_id: str
    status: str
    message: str
    setting: str
    target_bits: float | None
    mean_bits: float | None
    train_loss_final: float | None
    train_accuracy_final: float | None
    test_loss: float | None
    test_accuracy: float | None
    chance_accuracy: float
    steps: int
    batch_size: int
    image_size: int
    num_classes: int
    model: str
    seed: int
    elapsed_s: float
    finished_at: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AccuracyRow":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def ok(self) -> bool:
        return self.status == "ok"


ROW_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(AccuracyRow))


#: Columns of an accuracy row that are fractions (0 to 1), and those that count something (at least 1).
_FRACTIONS = ("train_accuracy_final", "test_accuracy", "chance_accuracy")
_COUNTS = ("steps", "batch_size", "image_size", "num_classes")


def setting_label(bits: float | None) -> str:
    """A setting's name in rows, tables and figures: ``fp32`` or ``2 bits``; derived from ``target_bits``."""
    return "fp32" if bits is None else f"{bits:g} bits"


def accuracy_row_problem(data: Any) -> str | None:
    """Why ``data`` is not an accuracy row: types, then values (fractions within 0..1, counts at least
    1, every other number finite and non-negative, a known status), or None."""
    from actbench.store.reading import row_problem
    from actbench.schema import MAX_COLUMN_VALUE, STATUSES, number_problem

    problem = row_problem(AccuracyRow, data)
    for name in ROW_COLUMNS:
        if problem is not None:
            return problem
        low, high = (0, 1) if name in _FRACTIONS else (1 if name in _COUNTS else 0, MAX_COLUMN_VALUE)
        problem = number_problem(name, data.get(name), low, high)
    if problem is None and data["status"] not in STATUSES:
        problem = f"unknown status {data['status'][:40]!r} (expected one of {', '.join(STATUSES)})"
    if problem is None and data["setting"] != setting_label(data["target_bits"]):
        problem = (f"field 'setting' is {data['setting'][:40]!r} (expected "
                   f"{setting_label(data['target_bits'])!r}, the name of its target_bits)")
    return problem


class AccuracyStore:
    """``accuracy.jsonl`` (append-only truth) and ``accuracy.csv`` (derived) of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.rows_path = run_dir / ROWS_FILE
        self.table_path = run_dir / TABLE_FILE

    def read_rows(self) -> list[AccuracyRow]:
        from actbench.store.reading import read_jsonl

        # unreadable lines (a torn last line, invalid UTF-8 or JSON, not a row, a value out of range, past
        # the limits on size and digits): skipped, one warning each
        return read_jsonl(self.rows_path, AccuracyRow, accuracy_row_problem)

    def append(self, row: AccuracyRow) -> None:
        from actbench.store.results import append_record

        append_record(self.rows_path, asdict(row))

    def write_table(self) -> None:
        from actbench.store.results import write_rows_csv

        write_rows_csv(self.table_path, ROW_COLUMNS, self.read_rows())


def find_accuracy_runs(results_dir: Path) -> tuple[tuple[Path, tuple[AccuracyRow, ...]], ...]:
    """Every folder under ``results_dir`` (itself included) holding accuracy rows, sorted by path."""
    found = []
    for path in sorted(results_dir.rglob(ROWS_FILE)):
        rows = tuple(AccuracyStore(path.parent).read_rows())
        if rows:
            found.append((path.parent, rows))
    return tuple(found)
