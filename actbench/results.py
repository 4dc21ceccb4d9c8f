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
  share a run: one measures the point, the others wait for its row (see :mod:`actbench.runner`).
  A claim dies with the process that held it.
- Lines that cannot be read (invalid UTF-8, invalid JSON, JSON that is not a row, a field of the
  wrong type, a missing field) are skipped with one warning naming the file and line; readers never
  write and never raise on them.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from actbench.schema import COLUMNS, STATUSES, ResultRow

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Where a torn last line of ``rows.jsonl`` is set aside (``<rows file>`` + this suffix).
TORN_SUFFIX = ".torn"
LOCK_NAME = ".lock"
CLAIMS_DIR = ".claims"


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
        probe = out_dir / f".actbench-write-probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output directory '{out_dir}' is not writable: {exc.strerror or exc}") from None


def _unique_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer (process or thread) uses at once."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def atomic_write_text(path: Path, text: str) -> None:
    """Write through a per-writer temporary file and rename: readers see the old file or the new one."""
    tmp = _unique_tmp(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# --- reading JSONL rows --------------------------------------------------------------------------
_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
                                       "None": (type(None),)}


def _field_rules(cls: type) -> tuple[frozenset[str], dict[str, tuple[type, ...]]]:
    """Required field names and the JSON types each field accepts (from the dataclass's annotations)."""
    required, accepted = set(), {}
    for f in dataclasses.fields(cls):
        spec = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        types: tuple[type, ...] = ()
        for part in spec.split("|"):
            types += _TYPES.get(part.strip().replace("Optional[", "").rstrip("]"), ())
        if f.default is None:
            types += (type(None),)
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default:
            required.add(f.name)
        if types:
            accepted[f.name] = types
    return frozenset(required), accepted


_RULES: dict[type, tuple[frozenset[str], dict[str, tuple[type, ...]]]] = {}


def row_problem(cls: type, data: Any) -> str | None:
    """Why ``data`` (parsed JSON) is not a ``cls`` row, or None when it is one."""
    if not isinstance(data, dict):
        kind = {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean", type(None): "null"}.get(
            type(data), "a JSON number")
        return f"not a row object ({kind})"
    if cls not in _RULES:
        _RULES[cls] = _field_rules(cls)
    required, accepted = _RULES[cls]
    missing = sorted(required - data.keys())
    if missing:
        return "missing field" + ("s " if len(missing) > 1 else " ") + ", ".join(f"'{m}'" for m in missing)
    for name, value in data.items():
        types = accepted.get(name)
        if types is None:
            continue  # unknown columns (a newer version's) are ignored
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            return f"field '{name}' has the wrong type ({type(value).__name__}: {str(value)[:40]!r})"
    return None


def _result_row_problem(data: Any) -> str | None:
    problem = row_problem(ResultRow, data)
    if problem is None and data["status"] not in STATUSES:
        return f"unknown status {data['status']!r} (expected one of {', '.join(STATUSES)})"
    return problem


def parse_jsonl(path: Path, data: bytes, first_lineno: int, cls: type[T],
                problem: Callable[[Any], str | None] | None = None,
                base_offset: int = 0) -> Iterator[tuple[int, T]]:
    """Rows of complete lines ``data`` of ``path`` as ``(byte offset, row)``; every unreadable line
    is skipped with one warning ``PATH:LINE: skipped: WHY``. Never raises on content.

    A line holding a torn row with a complete row glued after it (written by versions that did not
    repair a torn tail) gives the glued row back, with a warning.
    """
    check = problem or (lambda obj: row_problem(cls, obj))
    offset = base_offset
    for lineno, raw in enumerate(data.split(b"\n"), start=first_lineno):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            log.warning("%s:%d: skipped: not UTF-8 (byte %d)", path, lineno, exc.start + 1)
            continue
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            salvaged = _salvage(text, check)
            if salvaged is None:
                log.warning("%s:%d: skipped: not valid JSON (%s)", path, lineno, _preview(text))
            else:
                log.warning("%s:%d: recovered a row glued after a torn one; skipped the torn start (%s)",
                            path, lineno, _preview(text))
                yield start, cls.from_dict(salvaged)
            continue
        why = check(obj)
        if why is not None:
            log.warning("%s:%d: skipped: %s", path, lineno, why)
            continue
        try:
            yield start, cls.from_dict(obj)
        except (TypeError, ValueError) as exc:  # anything the checks above did not foresee
            log.warning("%s:%d: skipped: %s", path, lineno, exc)


def _preview(text: str) -> str:
    return repr(text[:40] + ("…" if len(text) > 40 else ""))


def _salvage(text: str, check: Callable[[Any], str | None]) -> dict[str, Any] | None:
    """The complete row at the end of a line whose start is torn, if there is one."""
    pos = text.find('{"', 1)
    while pos > 0:
        try:
            obj = json.loads(text[pos:])
        except (json.JSONDecodeError, RecursionError):
            obj = None
        if obj is not None and check(obj) is None:
            return obj
        pos = text.find('{"', pos + 1)
    return None


def read_jsonl(path: Path, cls: type[T], problem: Callable[[Any], str | None] | None = None) -> list[T]:
    """Every readable row of a JSONL file; a warning for each line that is not one (an incomplete
    last line included). Reads only."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n") + 1
    rows = [row for _, row in parse_jsonl(path, data[:end], 1, cls, problem)]
    _warn_tail(path, data[:end].count(b"\n") + 1, data[end:])
    return rows


def _warn_tail(path: Path, lineno: int, tail: bytes) -> None:
    if tail.strip():
        log.warning("%s:%d: skipped: incomplete last line (%d bytes, an interrupted write or one in progress)",
                    path, lineno, len(tail))


# --- the run directory ---------------------------------------------------------------------------
class RunStore:
    """Append-only rows of one run directory, plus its environment files and derived table.

    Reading (construction, :meth:`refresh`, :attr:`rows`, :meth:`read_rows`) never writes.
    Writing (:meth:`append`, :meth:`write_table`) holds the run directory's lock.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.rows_path = run_dir / "rows.jsonl"
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
        self.refresh()

    # reading -------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the rows appended since the last read (by this or any other writer)."""
        try:
            with self.rows_path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._read_pos:  # replaced or cut below what was read: start over
                    self._reset()
                fh.seek(self._read_pos)
                data = fh.read()
        except FileNotFoundError:
            if self._read_pos:
                self._reset()
            return
        end = data.rfind(b"\n") + 1
        if end:
            for offset, row in parse_jsonl(self.rows_path, data[:end], self._lineno + 1, ResultRow,
                                           _result_row_problem, base_offset=self._read_pos):
                self._history.append(row)
                self._rows[row.key] = row
                self._offset[row.key] = offset
            self._lineno += data[:end].count(b"\n")
            self._read_pos += end
        tail = data[end:]
        if tail.strip() and self._warned_tail != (self._read_pos, len(tail)):
            self._warned_tail = (self._read_pos, len(tail))
            _warn_tail(self.rows_path, self._lineno + 1, tail)

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
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
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
        mid-append). A complete row gets its newline; anything else moves to ``rows.jsonl.torn``."""
        try:
            fh = self.rows_path.open("rb+")
        except FileNotFoundError:
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            start = self._last_newline(fh, size) + 1
            fh.seek(start)
            tail = fh.read()
            try:
                complete_row = _result_row_problem(json.loads(tail.decode("utf-8"))) is None
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                complete_row = False
            if complete_row:
                fh.seek(size)
                fh.write(b"\n")
            else:
                torn = self.rows_path.with_name(self.rows_path.name + TORN_SUFFIX)
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
        self.claims_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.claims_dir / key, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
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
            fd = os.open(self.claims_dir / key, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)  # closing drops the lock

    def claim_holder(self, key: str) -> str:
        with contextlib.suppress(OSError):
            return (self.claims_dir / key).read_text().strip() or "?"
        return "?"

    # writing -------------------------------------------------------------------------------------
    def append(self, row: ResultRow) -> None:
        """Append under the lock onto a clean line, flush and fsync at once, so an interrupted sweep
        keeps every finished row and a torn line never swallows the next one."""
        with self.locked():
            line = (json.dumps(asdict(row), sort_keys=False) + "\n").encode()
            with self.rows_path.open("ab") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            self.refresh()

    def write_table(self) -> None:
        """Rewrite ``table.csv`` (the latest row per key, every column in a fixed order) under the lock
        through a temporary file of this writer's own."""
        with self.locked():
            tmp = _unique_tmp(self.table_path)
            try:
                with tmp.open("w", newline="") as fh:
                    writer = csv.DictWriter(fh, fieldnames=COLUMNS)
                    writer.writeheader()
                    for row in self.rows:
                        writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})
                os.replace(tmp, self.table_path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()

    def record_environment(self, env: dict[str, Any], env_id: str) -> None:
        """``env.json`` holds the run's first environment; a resume elsewhere adds ``env_<id>.json``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        main = self.run_dir / "env.json"
        payload = {"env_id": env_id, **env}
        with self.locked():
            if not main.exists():
                atomic_write_text(main, json.dumps(payload, indent=2) + "\n")
                return
            try:
                existing = json.loads(main.read_text()).get("env_id")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                existing = None
            if existing != env_id:
                atomic_write_text(self.run_dir / f"env_{env_id}.json", json.dumps(payload, indent=2) + "\n")

    def write_config(self, config: dict[str, Any]) -> None:
        path = self.run_dir / "config.json"
        if not path.exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(config, indent=2, default=str) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
