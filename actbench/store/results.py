"""Result rows and the run directory: ``rows.jsonl`` (the truth), ``table.csv`` (derived), ``env.json``.

A run directory's name derives from the command's configuration, so the same command resumes into
the same directory and skips rows whose ``key`` is already there; a different configuration gets a
new directory and never overwrites an old run.

Reliability (docs/design.md §9, results/README.md "Guarantees"):

- ``rows.jsonl`` is append-only; a key may have several rows (a retried ``error``/``timeout``), and
  the **latest** row per key is the one every view uses (:attr:`RunStore.rows`, ``table.csv``,
  analysis, plots, report). :meth:`RunStore.read_rows` is the whole history.
- Writers take ``run_dir/.lock`` (``fcntl.flock``) around every append and table write; before
  appending, a torn last line (no final newline: a write cut short) is moved to ``rows.jsonl.torn``
  and the file truncated to its last newline, so the next row never glues onto it.
- A point being measured is *claimed* by a lock on ``run_dir/.claims/<key>``, so concurrent writers
  share a run: one measures the point, the others wait for its row (see :mod:`actbench.execution.runner`).
  A claim dies with the process that held it.
- Lines that cannot be read (invalid UTF-8, invalid JSON, JSON that is not a row, a field of the
  wrong type, a missing field, a value out of range, a line past the limits on size, nesting and
  digits) are skipped with one warning naming the file and line; readers never write and never raise
  on them.
- A run file that is not what it must be (``rows.jsonl`` or ``rows.jsonl.torn`` a directory, a FIFO
  or a link to a device, ``.claims`` a file) is a one-line ``RunFileError`` before it is opened, never a
  hang (:mod:`actbench.store.reading`: reading within limits).
- Outputs (tables, reports, figures, JSON) go through a temporary file and a rename
  (:mod:`actbench.store.outputs`): a full disk leaves the previous file, and a one-line ``OutputError``.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import json
import logging
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from actbench.core.devices import DEVICE_NAMES
from actbench.core.gpus import GPU_NAMES
from actbench.schema import COLUMNS, STATUSES, InputSize, ResultRow, row_value_problem
from actbench.store.outputs import OutputError, atomic_output, atomic_write_text
from actbench.store.reading import (MAX_LINE_BYTES, RunFileError, check_kind, load_json, parse_jsonl,
                                    read_json_file, row_problem, warn_incomplete_tail)
from actbench.strategies import get as get_strategy

log = logging.getLogger(__name__)

#: Where a torn last line of ``rows.jsonl`` is set aside (``<rows file>`` + this suffix).
TORN_SUFFIX = ".torn"
LOCK_NAME = ".lock"
CLAIMS_DIR = ".claims"


def config_hash(config: dict[str, Any]) -> str:
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def run_name(command: str, model: str, device: str, size: InputSize, config: dict[str, Any]) -> str:
    """Deterministic directory name, e.g. ``sweep-batch_resnet18_cpu_64px_1a2b3c4d``."""
    safe_model = re.sub(r"[^A-Za-z0-9_.+-]", "_", model)
    return f"{command}_{safe_model}_{device}_{size.label()}_{config_hash(config)}"


#: What a run directory holds that a reader of it uses or a writer of it owns: no output may replace one.
RUN_FILES: tuple[str, ...] = ("rows.jsonl", "rows.jsonl" + ".torn", "table.csv", "env.json", "config.json",
                              "summary.json", "accuracy.jsonl", "accuracy.csv", LOCK_NAME, CLAIMS_DIR, "logs",
                              "slurm")


def run_files(run_dir: Path) -> list[Path]:
    """The run files of ``run_dir`` that exist (:data:`RUN_FILES`, ``env_<id>.json`` too)."""
    found = [run_dir / name for name in RUN_FILES if os.path.lexists(run_dir / name)]
    with contextlib.suppress(OSError):
        found += sorted(run_dir.glob("env_*.json"))
    return found


def _result_row_problem(data: Any) -> str | None:
    """Why ``data`` is not a result row: types (:func:`row_problem`), then values, then names."""
    problem = row_problem(ResultRow, data) or row_value_problem(data)
    if problem is not None:
        return problem
    if data["status"] not in STATUSES:
        return f"unknown status {data['status']!r} (expected one of {', '.join(STATUSES)})"
    if data["device"].partition(":")[0] not in DEVICE_NAMES:
        return f"unknown device {data['device'][:40]!r} (expected one of {', '.join(DEVICE_NAMES)})"
    if data.get("gpu") is not None and data["gpu"] not in GPU_NAMES:
        return f"unknown GPU spec {data['gpu'][:40]!r} (expected one of {', '.join(GPU_NAMES)})"
    try:
        get_strategy(data["strategy"])
    except ValueError:
        return f"unknown strategy {data['strategy'][:40]!r}"
    return None



# --- the run directory ---------------------------------------------------------------------------
class RunStore:
    """Append-only rows of one run directory, plus its environment files and derived table.

    Reading (construction, :meth:`refresh`, :attr:`rows`, :meth:`read_rows`) never writes.
    Writing (:meth:`append`, :meth:`write_table`) holds the run directory's lock.
    """

    def __init__(self, run_dir: Path, quiet_before: int | None = None) -> None:
        """``quiet_before``: a byte offset of ``rows.jsonl`` up to which another handle of this run (the
        command's own) has read and warned already, so each bad line is one warning per command."""
        self.run_dir = run_dir
        self.quiet_before = quiet_before
        self.run_id = run_dir.name
        self.rows_path = run_dir / "rows.jsonl"
        self.torn_path = run_dir / ("rows.jsonl" + TORN_SUFFIX)
        self.table_path = run_dir / "table.csv"
        self.lock_path = run_dir / LOCK_NAME
        self.claims_dir = run_dir / CLAIMS_DIR
        self._rows: dict[str, ResultRow] = {}      # latest row per key, in order of the key's first row
        self._offset: dict[str, int] = {}          # byte offset of that latest row in rows.jsonl
        self._history: list[ResultRow] = []
        self._read_pos = 0                         # bytes of complete lines consumed
        self._lineno = 0                           # lines consumed
        self._warned_tail: tuple[int, int] | None = None
        self._lock_fd: int | None = None
        self._lock_depth = 0
        with contextlib.suppress(RunFileError):  # raised again by the first use (check_files, refresh, locked)
            self.refresh()

    def check_files(self) -> None:
        """RunFileError (one line naming the path and what it must be) for a run file of the wrong kind:
        the run directory, ``rows.jsonl``, ``rows.jsonl.torn``, ``.lock``, ``env.json``, ``config.json``,
        ``.claims``."""
        check_kind(self.run_dir, directory=True)
        for path in (self.rows_path, self.torn_path, self.lock_path, self.run_dir / "env.json",
                     self.run_dir / "config.json"):
            check_kind(path)
        for path in (self.rows_path, self.torn_path, self.lock_path):  # opened for appending or writing in place
            if path.is_symlink():
                raise RunFileError(f"'{path}' is a symbolic link (to '{os.readlink(path)}'): a run writes only its "
                                   "own files, not what a link points to; put a copy of the target in its place")
        check_kind(self.claims_dir, directory=True)

    # reading -------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the rows appended since the last read (by this or any other writer). RunFileError (one
        line) when ``rows.jsonl`` is not a regular file: a FIFO or a device is never opened."""
        if not check_kind(self.rows_path):
            if self._read_pos:
                self._reset()
            return
        try:
            with self.rows_path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._read_pos:  # replaced or cut below what was read: start over
                    self._reset()
                fh.seek(self._read_pos)
                data = fh.read(max(0, size - self._read_pos))
        except FileNotFoundError:
            if self._read_pos:
                self._reset()
            return
        except OSError as exc:
            raise RunFileError(f"'{self.rows_path}' cannot be read: {exc.strerror or exc}") from None
        end = data.rfind(b"\n") + 1
        if end:
            for offset, row in parse_jsonl(self.rows_path, data[:end], self._lineno + 1, ResultRow,
                                           _result_row_problem, base_offset=self._read_pos,
                                           quiet_before=self.quiet_before):
                self._history.append(row)
                self._rows[row.key] = row
                self._offset[row.key] = offset
            self._lineno += data[:end].count(b"\n")
            self._read_pos += end
        tail = data[end:]
        if tail.strip() and self._warned_tail != (self._read_pos, len(tail)):
            self._warned_tail = (self._read_pos, len(tail))
            if self.quiet_before is None or self._read_pos > self.quiet_before:
                warn_incomplete_tail(self.rows_path, self._lineno + 1, tail)

    def _reset(self) -> None:
        self._rows.clear()
        self._offset.clear()
        self._history.clear()
        self._read_pos = self._lineno = 0

    def read_rows(self) -> list[ResultRow]:
        """Every readable row on disk, in file order: the whole history, retried failures included."""
        self.refresh()
        return list(self._history)

    def get(self, key: str) -> ResultRow | None:
        """The latest row recorded for ``key`` (as of the last read)."""
        return self._rows.get(key)

    def offset(self, key: str) -> int | None:
        """Byte offset in ``rows.jsonl`` of the latest row for ``key``: rows at or past a writer's
        :attr:`end` when it started were written while it ran."""
        return self._offset.get(key)

    @property
    def end(self) -> int:
        """Bytes of ``rows.jsonl`` read so far (complete lines only)."""
        return self._read_pos

    @property
    def rows(self) -> list[ResultRow]:
        """The latest row per key: what tables, analysis, plots and reports use."""
        return list(self._rows.values())

    # locking -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``run_dir/.lock`` (re-entrant for this store); a torn last line is repaired and the
        rows re-read on entry, so the holder sees every row and appends onto a clean line."""
        if self._lock_depth == 0:
            if not check_kind(self.run_dir, directory=True):
                self.run_dir.mkdir(parents=True, exist_ok=True)
            self.check_files()
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise RunFileError(f"'{self.lock_path}' cannot be opened: {exc.strerror or exc} (a run folder "
                                   "must be writable to add or resume rows; another --out starts a new run)") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._lock_fd = fd
        self._lock_depth += 1
        try:
            if self._lock_depth == 1:
                self._repair_tail()
                self.refresh()
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and self._lock_fd is not None:
                fd, self._lock_fd = self._lock_fd, None
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _repair_tail(self) -> None:
        """Under the lock: a last line without its newline is an interrupted write (no live writer is
        mid-append). A complete row gets its newline; anything else moves to ``rows.jsonl.torn``.
        :meth:`_torn_tail` has found the file non-empty and without its final newline, and every writer
        appends under the lock this holder has, so the file is not checked a second time."""
        if not self._torn_tail():
            return
        try:
            fh = self.rows_path.open("rb+")
        except OSError as exc:
            raise RunFileError(f"'{self.rows_path}' cannot be repaired: {exc.strerror or exc} (its last line is "
                               "incomplete, and mending it needs write access)") from None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            start = self._last_newline(fh, size) + 1
            fh.seek(start)
            tail = fh.read()
            try:
                complete_row = (len(tail) <= MAX_LINE_BYTES
                                and _result_row_problem(load_json(tail.decode("utf-8"))) is None)
            except (ValueError, RecursionError):  # not UTF-8, not JSON, past the limits
                complete_row = False
            if complete_row:
                fh.seek(size)
                fh.write(b"\n")
            else:
                torn = self.torn_path
                check_kind(torn)  # a FIFO here would block the append, a directory fail it
                with torn.open("ab") as out:
                    out.write(tail + b"\n")
                    out.flush()
                    os.fsync(out.fileno())
                fh.truncate(start)
                log.warning("%s:%d: an incomplete last line (%d bytes, an interrupted write) was moved to %s",
                            self.rows_path, self._count_lines(fh, start) + 1,
                            len(tail), torn.name)
            fh.flush()
            os.fsync(fh.fileno())
        if start < self._read_pos:  # cannot happen for complete lines; be safe
            self._reset()

    def _torn_tail(self) -> bool:
        """Whether ``rows.jsonl`` ends without its newline, found by reading only: a complete file (a
        resume with nothing left to add) needs no write access."""
        try:
            if not check_kind(self.rows_path):
                return False
            with self.rows_path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    return False
                fh.seek(size - 1)
                return fh.read(1) != b"\n"
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RunFileError(f"'{self.rows_path}' cannot be read: {exc.strerror or exc}") from None

    @staticmethod
    def _last_newline(fh: Any, size: int) -> int:
        """Offset of the last ``\\n`` before ``size`` (-1 if none)."""
        pos, chunk = size, 1 << 16
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            found = fh.read(pos - start).rfind(b"\n")
            if found >= 0:
                return start + found
            pos = start
        return -1

    @staticmethod
    def _count_lines(fh: Any, end: int) -> int:
        fh.seek(0)
        count, left = 0, end
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
        return count

    # claims (one writer measures a point at a time) ---------------------------------------------
    def try_claim(self, key: str) -> int | None:
        """Under the lock: claim ``key`` for measuring (a file descriptor to :meth:`release_claim`),
        or None when another writer holds it. A claim dies with its process."""
        assert self._lock_depth > 0, "try_claim needs the run lock"
        try:
            if not check_kind(self.claims_dir, directory=True):
                self.claims_dir.mkdir(parents=True, exist_ok=True)
            check_kind(self.claims_dir / key)
            fd = os.open(self.claims_dir / key, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a full disk or a read-only folder: one line, finished rows kept
            raise OutputError(f"claim '{self.claims_dir / key}' cannot be made: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # who holds the claim, for messages; the lock is the claim
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def release_claim(self, key: str, fd: int) -> None:
        """Drop a claim (its file goes, under the lock, so a waiter re-checks and finds the row)."""
        try:
            with self.locked():
                with contextlib.suppress(FileNotFoundError):
                    (self.claims_dir / key).unlink()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def wait_claim(self, key: str) -> None:
        """Block (without the run lock) until the writer claiming ``key`` lets go of it."""
        try:
            if not check_kind(self.claims_dir / key):
                return
            fd = os.open(self.claims_dir / key, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)  # closing drops the lock

    def claim_holder(self, key: str) -> str:
        with contextlib.suppress(OSError, ValueError):
            if check_kind(self.claims_dir / key):
                return (self.claims_dir / key).read_text()[:40].strip() or "?"
        return "?"

    # writing -------------------------------------------------------------------------------------
    def append(self, row: ResultRow) -> None:
        """Append under the lock onto a clean line, flush and fsync at once, so an interrupted sweep
        keeps every finished row and a torn line never swallows the next one."""
        with self.locked():
            append_record(self.rows_path, asdict(row))
            self.refresh()

    def write_table(self) -> None:
        """Rewrite ``table.csv`` (the latest row per key, every column in a fixed order) under the lock
        through a temporary file of this writer's own."""
        with self.locked():
            write_rows_csv(self.table_path, COLUMNS, self.rows)

    def record_environment(self, env: dict[str, Any], env_id: str) -> None:
        """``env.json`` holds the run's first environment; a resume elsewhere adds ``env_<id>.json``."""
        main = self.run_dir / "env.json"
        payload = {"env_id": env_id, **env}
        with self.locked():
            if not check_kind(main):
                atomic_write_text(main, json.dumps(payload, indent=2) + "\n")
                return
            try:
                existing = read_json_file(main).get("env_id")
            except (RunFileError, AttributeError):  # unreadable: kept as it is, this environment beside it
                existing = None
            if existing != env_id:
                atomic_write_text(self.run_dir / f"env_{env_id}.json", json.dumps(payload, indent=2) + "\n")

    def write_config(self, config: dict[str, Any]) -> None:
        self.check_files()
        path = self.run_dir / "config.json"
        if not path.exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(config, indent=2, default=str) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")


def write_rows_csv(path: Path, columns: Sequence[str], rows: Iterable[Any]) -> None:
    """``rows`` (dataclasses) as the CSV table ``path``, columns in the given order, None as an empty
    cell, through a temporary file of this writer's own: the derived table of a JSONL file of rows."""
    with atomic_output(path, "table") as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


def append_record(path: Path, record: dict[str, Any]) -> None:
    """One JSON line appended to ``path`` in one write, flushed and fsynced before returning: a finished
    record survives a kill or a power cut (the run directory's rows, the accuracy study's rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as fh:
        fh.write((json.dumps(record) + "\n").encode())
        fh.flush()
        os.fsync(fh.fileno())
