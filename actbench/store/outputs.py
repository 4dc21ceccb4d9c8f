"""Writing outputs (tables, reports, figures, JSON) safely: checked before any work starts (writable,
never over a file the command reads), then written through a per-writer temporary file and a rename,
so a full disk or a kill mid-write leaves the previous file and a one-line :class:`OutputError`.
"""

from __future__ import annotations

import contextlib
import csv
import os
import stat
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence


class OutputError(ValueError):
    """An output (table, report, figure) that could not be written: one line naming the file."""


def check_writable(out_dir: Path) -> None:
    """Raise ValueError if ``out_dir`` cannot be created or written (before any work starts)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".actbench-write-probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output directory '{out_dir}' is not writable: {exc.strerror or exc}") from None


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
    if os.path.exists(out) and not (os.path.isfile(out) or os.path.isdir(out)):
        raise ValueError(f"output '{out}' is a device, pipe or socket; expected a {'folder' if directory else 'file'} path")
    if not directory and os.path.isdir(out):
        raise ValueError(f"output '{out}' is a directory; expected a file path")
    check_writable(out if directory else (out.parent if str(out.parent) else Path(".")))


def _refuse_special(path: Path, what: str) -> None:
    """OutputError for a target that is a device, pipe or socket: renaming a file onto it would replace
    the node itself (as root, ``/dev/null``)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        raise OutputError(f"{what} '{path}' is a device, pipe or socket, not a file to replace; choose a file path")


def _unique_tmp(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer (process or thread) uses at once."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextlib.contextmanager
def atomic_output(path: Path, what: str = "file") -> Iterator[Path]:
    """A per-writer temporary path beside ``path`` to write; renamed onto ``path`` when the block ends
    without error, removed otherwise. Readers see the old file or the new one, never a part; a failed
    write (a full disk) is an :class:`OutputError` naming ``path`` (``what``: how to call it)."""
    _refuse_special(path, what)
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

