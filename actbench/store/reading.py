"""Reading run files within limits: a file of the wrong kind (a FIFO, a device, a directory) is a
one-line :class:`RunFileError` before it is opened, never a hang; JSON is read within limits on size,
nesting and digits; each unreadable line of a JSONL file is skipped with one warning naming it, and
each unreadable line of a CSV table is named for its reader to skip or refuse.

Torch-free and row-agnostic: :mod:`actbench.store.results` checks what a result row holds.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence, TypeVar

from actbench.schema import one_line

log = logging.getLogger(__name__)

T = TypeVar("T")

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
            wanted = " or ".join(sorted({"null" if t is type(None) else t.__name__ for t in types}))
            return f"field '{name}' has the wrong type ({type(value).__name__}; expected {wanted})"
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
        except (ValueError, RecursionError) as exc:
            salvaged = _salvage(text, check)
            if salvaged is None:
                warn("%s:%d: skipped: not valid JSON (%s)", path, lineno, _json_why(exc))
            else:
                warn("%s:%d: recovered a row glued after a torn one; skipped the torn start (%d bytes)",
                     path, lineno, salvaged[0])
                yield start, cls.from_dict(salvaged[1])
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


def _json_why(exc: BaseException) -> str:
    """Why a line is not JSON, from the decoder's position and message only: a warning never shows
    what the line holds (a run file may be a link to any file on the machine)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return type(exc).__name__


def _salvage(text: str, check: Callable[[Any], str | None]) -> tuple[int, dict[str, Any]] | None:
    """The complete row at the end of a line whose start is torn, if there is one, with the length
    in bytes of the torn start before it."""
    pos = text.find('{"', 1)
    while pos > 0:
        try:
            obj = load_json(text[pos:])
        except (ValueError, RecursionError):
            obj = None
        if obj is not None and check(obj) is None:
            return len(text[:pos].encode("utf-8")), obj
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
    warn_incomplete_tail(path, data[:end].count(b"\n") + 1, data[end:])
    return rows


def warn_incomplete_tail(path: Path, lineno: int, tail: bytes) -> None:
    if tail.strip():
        log.warning("%s:%d: skipped: incomplete last line (%d bytes, an interrupted write or one in progress)",
                    path, lineno, len(tail))



# --- reading CSV tables --------------------------------------------------------------------------
#: One CSV row: its line in the file and its cells by column name.
CsvRow = tuple[int, dict[str, str]]


def read_csv(path: Path, required: Sequence[str],
             comments: bool = False) -> tuple[list[CsvRow], list[tuple[int, str]]] | None:
    """The rows of a CSV table actbench wrote (``trust``'s, a re-prediction's), None when it is absent:
    ``(rows, problems)``, one ``(line, why)`` per line that is not a row (past
    :data:`MAX_LINE_BYTES`, not UTF-8, not CSV, another count of cells than the header's), for the
    caller to skip with a warning or to refuse. RunFileError (one line naming it) when it is not a
    regular file, cannot be read, or its header lacks a ``required`` column. With ``comments``, blank
    lines and lines starting with ``#`` (a hand-kept table's notes, the paper's CSV) are passed over,
    before the header too; line numbers stay the file's own."""
    if not check_kind(path):
        return None
    line = [0]  # the physical line the CSV reader has reached
    problems: list[tuple[int, str]] = []
    try:
        with path.open("rb") as fh:
            reader = csv.reader(_csv_lines(fh, line, problems, comments))
            header = _csv_header(path, reader, problems, required, comments)
            rows = list(_csv_rows(reader, header, line, problems))
    except OSError as exc:
        raise RunFileError(f"'{path}' cannot be read: {exc.strerror or exc}") from None
    return rows, problems


def _csv_lines(fh: BinaryIO, line: list[int], problems: list[tuple[int, str]],
               comments: bool = False) -> Iterator[str]:
    """The lines of ``fh`` as text, each read within :data:`MAX_LINE_BYTES`; a line past it or not
    UTF-8 goes to ``problems`` instead; with ``comments``, blank and ``#`` lines are passed over."""
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        line[0] += 1
        if len(raw) > MAX_LINE_BYTES:
            size = len(raw)
            while raw and not raw.endswith(b"\n"):  # the rest of the line, a chunk at a time
                raw = fh.readline(1 << 20)
                size += len(raw)
            problems.append((line[0], f"a line of {size} bytes (at most {MAX_LINE_BYTES})"))
            continue
        try:
            text = raw.decode("utf-8-sig" if line[0] == 1 else "utf-8")  # a spreadsheet's byte-order mark
        except UnicodeDecodeError as exc:
            problems.append((line[0], f"not UTF-8 (byte {exc.start + 1})"))
            continue
        if not (comments and (not text.strip() or text.lstrip().startswith("#"))):
            yield text


def _csv_header(path: Path, reader: Any, problems: list[tuple[int, str]], required: Sequence[str],
                comments: bool = False) -> list[str]:
    """The column names of the first line (the first that is not a note, with ``comments``); RunFileError
    when that line is unreadable or lacks a column."""
    try:
        header = next(reader, [])
    except csv.Error as exc:
        raise RunFileError(f"'{path}': its header line is not CSV ({exc})") from None
    if problems:
        raise RunFileError(f"'{path}': its header line is unreadable ({problems[0][1]})")
    missing = [c for c in required if c not in header]
    if missing:
        empty = "it has no line but notes and blank ones" if comments else "its first line is empty"
        has = f"its columns are {one_line(', '.join(header), 120)}" if header else empty
        raise RunFileError(f"'{path}': missing column(s) {', '.join(missing)} ({has})")
    return header


def _csv_rows(reader: Any, header: list[str], line: list[int], problems: list[tuple[int, str]]) -> Iterator[CsvRow]:
    """Each row after the header with as many cells as it; an empty line is passed over."""
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            problems.append((line[0], f"not CSV ({exc})"))
            continue
        if not cells:
            continue
        if len(cells) != len(header):
            problems.append((line[0], f"{len(cells)} cells, the header names {len(header)}"))
            continue
        yield line[0], dict(zip(header, cells))
