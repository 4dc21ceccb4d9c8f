"""Result rows and the run directory: ``rows.jsonl`` (the truth), ``table.csv`` (derived), ``env.json``.

A run directory's name derives from the command's configuration, so the same command resumes into
the same directory and skips rows whose ``key`` is already there; a different configuration gets a
new directory and never overwrites an old run.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable

from actbench.measure.point import Measurement, PointConfig


@dataclass
class ResultRow:
    """One measured point. Units are in the names; ``None`` = not measured (differs from 0)."""

    key: str
    run_id: str
    env_id: str
    status: str
    message: str
    model: str
    extra_blocks: int
    width_per_group: int | None
    depth: int | None
    strategy: str
    batch_size: int
    image_size: int
    device: str
    budget_bytes: int | None
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
    flops_per_sample: float | None = None
    forward_flops_per_sample: float | None = None
    num_params: int | None = None
    checkpoint_segments: int | None = None
    warmup_steps: int | None = None
    timed_steps: int | None = None
    strategy_note: str | None = None
    alloc_conf: str | None = None
    elapsed_s: float | None = None
    finished_at: str | None = None

    @classmethod
    def build(cls, point: PointConfig, m: Measurement, run_id: str, env_id: str) -> "ResultRow":
        """The point's identity plus every field of the measurement (a test checks they are all columns)."""
        return cls(
            key=point.key(), run_id=run_id, env_id=env_id, model=point.model.name,
            extra_blocks=point.model.extra_blocks, width_per_group=point.model.width_per_group,
            strategy=point.strategy, batch_size=point.batch_size, image_size=point.image_size, device=point.device,
            budget_bytes=point.budget_bytes, checkpoint_segments=point.checkpoint_segments,
            warmup_steps=point.warmup_steps, timed_steps=point.timed_steps,
            finished_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **asdict(m),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ResultRow":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def ok(self) -> bool:
        return self.status == "ok"


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ResultRow))


def config_hash(config: dict[str, Any]) -> str:
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def run_name(command: str, model: str, device: str, image_size: int | str, config: dict[str, Any]) -> str:
    """Deterministic directory name, e.g. ``sweep-batch_resnet18_cpu_64px_1a2b3c4d``."""
    safe_model = re.sub(r"[^A-Za-z0-9_.+-]", "_", model)
    return f"{command}_{safe_model}_{device}_{image_size}px_{config_hash(config)}"


def check_writable(out_dir: Path) -> None:
    """Raise ValueError if ``out_dir`` cannot be created or written (before any work starts)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".actbench-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output directory '{out_dir}' is not writable: {exc.strerror or exc}") from None


class RunStore:
    """Append-only rows of one run directory, plus its environment files and derived table."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.rows_path = run_dir / "rows.jsonl"
        self.table_path = run_dir / "table.csv"
        self._rows: dict[str, ResultRow] = {}
        for row in self.read_rows():
            self._rows[row.key] = row

    def read_rows(self) -> list[ResultRow]:
        """Rows on disk, skipping a torn last line (an interrupted write)."""
        if not self.rows_path.exists():
            return []
        rows = []
        for line in self.rows_path.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(ResultRow.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                continue
        return rows

    def get(self, key: str) -> ResultRow | None:
        return self._rows.get(key)

    @property
    def rows(self) -> list[ResultRow]:
        return list(self._rows.values())

    def append(self, row: ResultRow) -> None:
        """Append and flush to disk at once, so an interrupted sweep keeps every finished row."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.rows_path.open("a") as fh:
            fh.write(json.dumps(asdict(row), sort_keys=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._rows[row.key] = row

    def write_table(self) -> None:
        """Rewrite ``table.csv`` from ``rows.jsonl``; every column of ResultRow, in a fixed order."""
        rows = self.read_rows()
        tmp = self.table_path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})
        os.replace(tmp, self.table_path)

    def record_environment(self, env: dict[str, Any], env_id: str) -> None:
        """``env.json`` holds the run's first environment; a resume elsewhere adds ``env_<id>.json``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        main = self.run_dir / "env.json"
        payload = {"env_id": env_id, **env}
        if not main.exists():
            main.write_text(json.dumps(payload, indent=2) + "\n")
            return
        try:
            existing = json.loads(main.read_text()).get("env_id")
        except json.JSONDecodeError:
            existing = None
        if existing != env_id:
            (self.run_dir / f"env_{env_id}.json").write_text(json.dumps(payload, indent=2) + "\n")

    def write_config(self, config: dict[str, Any]) -> None:
        path = self.run_dir / "config.json"
        if not path.exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(config, indent=2, default=str) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def rows_by_status(rows: Iterable[ResultRow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return counts
