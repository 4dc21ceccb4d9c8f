"""Reading finished runs from disk: run folders, their rows, env.json and config.json.

Kept apart from the tables (:mod:`actbench.reporting.analysis`) so that what is read and what is
derived from it change for their own reasons; nothing in this module writes anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from actbench.schema import DIMENSIONS, ResultRow
from actbench.store.reading import RunFileError, read_json_file
from actbench.store.results import RunStore, run_files

log = logging.getLogger(__name__)


def read_json(path: Path) -> Mapping[str, Any]:
    """A run's ``env.json`` or ``config.json`` as a mapping; empty when absent. One that cannot be read
    (not a regular file, not UTF-8 or JSON, past the limits, not an object) is a warning naming it,
    and the run is reported without it."""
    try:
        data = read_json_file(path)
    except RunFileError as exc:
        log.warning("%s; read as empty", exc)
        return MappingProxyType({})
    if data is not None and not isinstance(data, dict):
        log.warning("'%s' is not a JSON object; read as empty", path)
    return MappingProxyType(data if isinstance(data, dict) else {})


@dataclass(frozen=True)
class Run:
    """One run directory as read from disk."""

    path: Path
    rows: tuple[ResultRow, ...]
    env: Mapping[str, Any]
    config: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    def scale_dimension(self) -> str | None:
        """The max-scale dimension: from config.json when the harness wrote it, else from what varies.

        A ``plan`` over depth, width or resolution is a max-scale search too (predicted): its figure
        is the maxima per strategy, not a memory chart per model it probed."""
        if self.config.get("command") in ("max-scale", "plan") and self.config.get("dim") in DIMENSIONS:
            return str(self.config["dim"])
        if self.config.get("command") not in (None, "max-scale"):
            return None
        return infer_scale_dimension(self.rows)


def infer_scale_dimension(rows: Iterable[ResultRow]) -> str | None:
    """Within each strategy a max-scale run keeps the batch fixed and varies exactly one model/input field."""
    by_strategy: dict[tuple[str, str], list[ResultRow]] = {}
    for row in rows:
        by_strategy.setdefault((row.strategy, row.device), []).append(row)
    if not by_strategy:
        return None
    found: set[str] = set()
    for group in by_strategy.values():
        if len({r.batch_size for r in group}) != 1:
            return None
        varying = [dim for dim, field in (("depth", "extra_blocks"), ("width", "width_per_group"),
                                          ("resolution", "image_size"))
                   if len({getattr(r, field) for r in group}) > 1]
        if len(varying) > 1:
            return None
        found.update(varying)
    return found.pop() if len(found) == 1 else None


def _check_results_dir(results_dir: Path) -> None:
    if not results_dir.exists():
        raise ValueError(f"results directory '{results_dir}' does not exist")
    if not results_dir.is_dir():
        raise ValueError(f"'{results_dir}' is not a directory")


def _harness_runs(results_dir: Path) -> tuple[Run, ...]:
    runs = []
    for rows_path in sorted(results_dir.rglob("rows.jsonl")):
        run_dir = rows_path.parent
        store = RunStore(run_dir)
        store.refresh()  # RunFileError (one line) for a rows.jsonl that is not a regular file
        rows = tuple(store.rows)  # the latest row per key (a retried point: its new row)
        if rows:
            runs.append(Run(path=run_dir, rows=rows, env=read_json(run_dir / "env.json"),
                            config=read_json(run_dir / "config.json")))
    return tuple(runs)


def find_runs(results_dir: Path) -> tuple[Run, ...]:
    """Every folder under ``results_dir`` (itself included) holding a ``rows.jsonl``, sorted by path.

    Raises ValueError with one line when the folder is missing or holds no rows.
    """
    _check_results_dir(results_dir)
    runs = _harness_runs(results_dir)
    if not runs:
        raise ValueError(f"no result rows under '{results_dir}' (no rows.jsonl with at least one row)")
    return runs


@dataclass(frozen=True)
class ResultRuns:
    """Both kinds of run under one folder: harness measurements and accuracy-vs-bits trainings."""

    harness: tuple[Run, ...]
    accuracy: tuple[tuple[Path, tuple[Any, ...]], ...]  # (run directory, AccuracyRow tuple)

    def files(self) -> list[Path]:
        """Every run file of these runs: what no output of ``plot`` or ``report`` may replace."""
        dirs = [run.path for run in self.harness] + [run_dir for run_dir, _ in self.accuracy]
        return [path for run_dir in dirs for path in run_files(run_dir)]


def find_result_runs(results_dir: Path) -> ResultRuns:
    """Harness runs (``rows.jsonl``) and accuracy runs (``accuracy.jsonl``) under ``results_dir``.

    ``plot`` and ``report`` accept a folder holding either kind; ValueError (one line) when it holds neither.
    """
    from actbench.store.accuracy_rows import ROWS_FILE, find_accuracy_runs

    _check_results_dir(results_dir)
    found = ResultRuns(harness=_harness_runs(results_dir), accuracy=find_accuracy_runs(results_dir))
    if not found.harness and not found.accuracy:
        raise ValueError(f"no result rows under '{results_dir}' "
                         f"(no rows.jsonl or {ROWS_FILE} with at least one row)")
    return found
