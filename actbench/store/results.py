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
  or a link to a device, ``.claims`` a file) is a one-line :class:`RunFileError` before it is opened, never a hang.
- Outputs (tables, reports, figures, JSON) go through a temporary file and a rename
  (:func:`atomic_output`): a full disk leaves the previous file, and a one-line :class:`OutputError`.
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
import stat
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from actbench.core.devices import DEVICE_NAMES
from actbench.core.gpus import GPU_NAMES
from actbench.schema import COLUMNS, STATUSES, ResultRow, one_line, row_value_problem
from actbench.strategies import get as get_strategy

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


#: Limits a line of ``rows.jsonl`` (or ``accuracy.jsonl``) keeps to be read: far beyond any row written,
#: small enough that one hostile line costs neither memory nor Python's integer-to-string limit.
MAX_LINE_BYTES = 1 << 20
MAX_INT_DIGITS = 40
MAX_NESTING = 8
#: Largest ``env.json`` / ``config.json`` (or device model) read, and how deeply it may nest.
MAX_JSON_FILE_BYTES = 16 << 20
MAX_JSON_FILE_NESTING = 64


class RunFileError(ValueError):
    """A run file that cannot be used as one (wrong kind of file, unreadable): one line naming it."""


class OutputError(ValueError):
    """An output (table, report, figure) that could not be written: one line naming the file."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def check_kind(path: Path, directory: bool = False) -> bool:
    """Whether ``path`` exists as a regular file (or, ``directory``, a directory); RunFileError (one line)
    when it exists as anything else: a FIFO, a device or a link to one is never opened."""
    want = "a directory" if directory else "a regular file"
    try:
        st = os.stat(path)  # follows links: a link to /dev/zero is a character device
    except FileNotFoundError:
        if os.path.islink(path):
            raise RunFileError(f"'{path}' is a dangling symbolic link; expected {want}") from None
        return False
    except OSError as exc:
        raise RunFileError(f"'{path}' cannot be inspected: {exc.strerror or exc}; expected {want}") from None
    if (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        return True
    raise RunFileError(f"'{path}' is {_kind(st.st_mode)}; expected {want}")


def check_writable(out_dir: Path) -> None:
    """Raise ValueError if ``out_dir`` cannot be created or written (before any work starts)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".actbench-write-probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output directory '{out_dir}' is not writable: {exc.strerror or exc}") from None


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


def check_output(out: Path, inputs: Iterable[Path], directory: bool = False) -> None:
    """ValueError (one line) before any work for an output (a file, or a ``directory`` of files) that is,
    or is inside, one of ``inputs`` (run files, a CSV read), that is a directory where a file belongs,
    or that cannot be created or written."""
    target = Path(os.path.abspath(out)).resolve()
    for path in inputs:
        source = Path(os.path.abspath(path)).resolve()
        if target == source or source in target.parents:
            raise ValueError(f"output '{out}' would overwrite '{path}', which this command reads; "
                             "choose a path outside the run files")
    if not directory and os.path.isdir(out):
        raise ValueError(f"output '{out}' is a directory; expected a file path")
    check_writable(out if directory else (out.parent if str(out.parent) else Path(".")))


def _unique_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer (process or thread) uses at once."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextlib.contextmanager
def atomic_output(path: Path, what: str = "file") -> Iterator[Path]:
    """A per-writer temporary path beside ``path`` to write; renamed onto ``path`` when the block ends
    without error, removed otherwise. Readers see the old file or the new one, never a part; a failed
    write (a full disk) is an :class:`OutputError` naming ``path`` (``what``: how to call it)."""
    tmp = _unique_tmp(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"{what} '{path}' cannot be written: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def atomic_write_text(path: Path, text: str, what: str = "file") -> None:
    """Write through a per-writer temporary file and rename: readers see the old file or the new one."""
    with atomic_output(path, what) as tmp:
        tmp.write_text(text)


def atomic_write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]], what: str = "table") -> None:
    """A CSV written through a per-writer temporary file and renamed: a full disk or a kill mid-write
    leaves the previous file whole, and an :class:`OutputError` names ``path``."""
    with atomic_output(path, what) as tmp:
        with tmp.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows)


def new_file(path: Path) -> Path:
    """``path``, or ``NAME-2.EXT``, ``NAME-3.EXT``, ... when that is taken, created empty and exclusively:
    two writers started in the same second (a timestamped name) never want the same file."""
    for n in range(1, 1000):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            raise OutputError(f"file '{candidate}' cannot be created: {exc.strerror or exc}") from None
    raise OutputError(f"file '{path}' cannot be created: 999 files of that name exist")


def read_json_file(path: Path) -> Any:
    """The JSON value of a small run file (``env.json``, ``config.json``), None when it is absent;
    RunFileError (one line naming it) when it is not a regular file or not JSON within the limits."""
    if not check_kind(path):
        return None
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_JSON_FILE_BYTES + 1)
    except OSError as exc:
        raise RunFileError(f"'{path}' cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_JSON_FILE_BYTES:
        raise RunFileError(f"'{path}' is larger than {MAX_JSON_FILE_BYTES >> 20} MiB; expected a small JSON file")
    try:
        return load_json(data.decode("utf-8"), nesting=MAX_JSON_FILE_NESTING)
    except UnicodeDecodeError as exc:
        raise RunFileError(f"'{path}' is not UTF-8 (byte {exc.start + 1})") from None
    except LimitError as exc:
        raise RunFileError(f"'{path}' is past the limits of a JSON file: {exc}") from None
    except RecursionError:
        raise RunFileError(f"'{path}' is past the limits of a JSON file: nested too deeply "
                           f"(at most {MAX_JSON_FILE_NESTING} levels)") from None
    except ValueError as exc:
        raise RunFileError(f"'{path}' is not valid JSON ({one_line(exc, 80)})") from None


# --- reading JSONL rows --------------------------------------------------------------------------
class LimitError(ValueError):
    """JSON past the limits a row keeps (digits of an integer, nesting)."""


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise LimitError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _nesting(obj: Any) -> int:
    """How deeply arrays and objects nest in ``obj`` (iteratively: no recursion on hostile input)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_json(text: str, nesting: int = MAX_NESTING) -> Any:
    """``json.loads`` within the limits: integers of at most :data:`MAX_INT_DIGITS` digits and at most
    ``nesting`` levels of arrays and objects (LimitError); JSONDecodeError / RecursionError as json's."""
    obj = json.loads(text, parse_int=_bounded_int)
    depth = _nesting(obj)
    if depth > nesting:
        raise LimitError(f"nested {depth} levels deep (at most {nesting})")
    return obj

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
    """Why ``data`` is not a result row: types (:func:`row_problem`), then values, then names."""
    problem = row_problem(ResultRow, data) or row_value_problem(data)
    if problem is not None:
        return problem
    if data["status"] not in STATUSES:
        return f"unknown status {data['status']!r} (expected one of {', '.join(STATUSES)})"
    if data["device"].partition(":")[0] not in DEVICE_NAMES:
        return f"unknown device {data['device'][:40]!r} (expected one of {', '.join(DEVICE_NAMES)})"
    if data.get("gpu") is not None and data["gpu"] not in GPU_NAMES:
        return f"unknown GPU profile {data['gpu'][:40]!r} (expected one of {', '.join(GPU_NAMES)})"
    try:
        get_strategy(data["strategy"])
    except ValueError:
        return f"unknown strategy {data['strategy'][:40]!r}"
    return None


def parse_jsonl(path: Path, data: bytes, first_lineno: int, cls: type[T],
                problem: Callable[[Any], str | None] | None = None,
                base_offset: int = 0, quiet_before: int | None = None) -> Iterator[tuple[int, T]]:
    """Rows of complete lines ``data`` of ``path`` as ``(byte offset, row)``; every unreadable line
    is skipped with one warning ``PATH:LINE: skipped: WHY``. Never raises on content. Lines starting
    before byte ``quiet_before`` are skipped silently: another reader of this run has warned of them.

    A line holding a torn row with a complete row glued after it (written by versions that did not
    repair a torn tail) gives the glued row back, with a warning.
    """
    check = problem or (lambda obj: row_problem(cls, obj))
    offset = base_offset
    for lineno, raw in enumerate(data.split(b"\n"), start=first_lineno):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        warn = _quiet if quiet_before is not None and start < quiet_before else log.warning
        if len(raw) > MAX_LINE_BYTES:
            warn("%s:%d: skipped: a line of %d bytes (at most %d)", path, lineno, len(raw), MAX_LINE_BYTES)
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            warn("%s:%d: skipped: not UTF-8 (byte %d)", path, lineno, exc.start + 1)
            continue
        try:
            obj = load_json(text)
        except LimitError as exc:
            warn("%s:%d: skipped: %s", path, lineno, exc)
            continue
        except (ValueError, RecursionError):
            salvaged = _salvage(text, check)
            if salvaged is None:
                warn("%s:%d: skipped: not valid JSON (%s)", path, lineno, _preview(text))
            else:
                warn("%s:%d: recovered a row glued after a torn one; skipped the torn start (%s)",
                     path, lineno, _preview(text))
                yield start, cls.from_dict(salvaged)
            continue
        why = check(obj)
        if why is not None:
            warn("%s:%d: skipped: %s", path, lineno, why)
            continue
        try:
            yield start, cls.from_dict(obj)
        except (TypeError, ValueError) as exc:  # anything the checks above did not foresee
            warn("%s:%d: skipped: %s", path, lineno, exc)


def _quiet(*args: Any) -> None:
    """A warning already given by another reader of the same lines."""


def _preview(text: str) -> str:
    return repr(text[:40] + ("…" if len(text) > 40 else ""))


def _salvage(text: str, check: Callable[[Any], str | None]) -> dict[str, Any] | None:
    """The complete row at the end of a line whose start is torn, if there is one."""
    pos = text.find('{"', 1)
    while pos > 0:
        try:
            obj = load_json(text[pos:])
        except (ValueError, RecursionError):
            obj = None
        if obj is not None and check(obj) is None:
            return obj
        pos = text.find('{"', pos + 1)
    return None


def read_jsonl(path: Path, cls: type[T], problem: Callable[[Any], str | None] | None = None) -> list[T]:
    """Every readable row of a JSONL file; a warning for each line that is not one (an incomplete
    last line included). Reads only."""
    if not check_kind(path):
        return []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunFileError(f"'{path}' cannot be read: {exc.strerror or exc}") from None
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
            if not check_kind(self.run_dir, directory=True):
                self.run_dir.mkdir(parents=True, exist_ok=True)
            self.check_files()
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
            if not check_kind(self.rows_path):
                return
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
        if not check_kind(self.claims_dir, directory=True):
            self.claims_dir.mkdir(parents=True, exist_ok=True)
        check_kind(self.claims_dir / key)
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
            line = (json.dumps(asdict(row), sort_keys=False) + "\n").encode()
            with self.rows_path.open("ab") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            self.refresh()

    def write_table(self) -> None:
        """Rewrite ``table.csv`` (the latest row per key, every column in a fixed order) under the lock
        through a temporary file of this writer's own."""
        with self.locked(), atomic_output(self.table_path, "table") as tmp:
            with tmp.open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=COLUMNS)
                writer.writeheader()
                for row in self.rows:
                    writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})

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
