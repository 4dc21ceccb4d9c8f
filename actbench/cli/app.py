"""The Typer app shared by every command module, and options used by several commands."""

import contextlib
import enum
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any, Iterator, NoReturn, Sequence

import typer

from actbench.core.devices import DEVICE_NAMES, MEASURING_DEVICES, profile
from actbench.core.gpus import GPU_NAMES
from actbench.schema import PRECISIONS

app = typer.Typer(
    name="actbench",
    help=(
        "Benchmark memory-saving training strategies (ActNN levels L0-L5, swapping, checkpointing) "
        "against plain fp32 on torchvision models: memory, maximum batch/depth/width/resolution, "
        "and throughput. Your runs go to runs/<run>/ (rows.jsonl, table.csv); results/ holds the "
        "committed reference results."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Help text is printed as written: rich markup would eat "[quick]" and other bracketed words,
    # and flags would show a "<bool>" type. Examples keep their lines through click's "\b" marker.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)

#: Where measuring commands write by default: a folder of the user's own (gitignored), never the
#: committed reference results under results/.
DEFAULT_OUT = Path("runs")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one clear line on stderr and exit with ``code`` (used for every bad input)."""
    typer.echo(f"actbench: error: {message}", err=True)
    raise typer.Exit(code)


#: Characters no output path may hold: a path reaches ``#SBATCH`` lines of a shell script (``--executor
#: slurm``), where a new line would be a command of its own.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def refuse_control_characters(option: str, text: str, what: str = "a path") -> None:
    """Exit 2 with one line when ``text`` holds a control character (below 0x20, or 0x7f)."""
    if CONTROL_CHARACTERS.search(text):
        fail(f"{option} must be {what} of printable characters (no new line, tab, escape or other control "
             f"character), got {text!r}")


def refuse_run_file(option: str, path: Path) -> None:
    """Exit 2 with one line when output ``path`` would replace a file a run folder owns (``rows.jsonl``,
    ``table.csv``, ``config.json``, ...: ``actbench.store.results.RUN_FILES``) in a folder that holds
    ``rows.jsonl`` or ``config.json``: an output aimed at another run must not overwrite its rows."""
    import fnmatch

    from actbench.store.results import RUN_FILES

    folder = path.parent
    if not (path.name in RUN_FILES or fnmatch.fnmatchcase(path.name, "env_*.json")):
        return
    if any(os.path.lexists(folder / name) for name in ("rows.jsonl", "config.json")):
        fail(f"{option} '{path}' would overwrite {path.name} of the run folder '{folder}' (a run's own files: "
             f"{', '.join(RUN_FILES)}, env_<id>.json); choose another name, or a folder that holds no run")


def require_train_batch(batch_size: int) -> None:
    """Exit 2 with one line unless ``--batch`` is in 2..LIMITS["batch"] (the cap every command keeps):
    BatchNorm in train mode needs two samples, and a typo is refused before a step allocates for it."""
    from actbench.execution.parsing import check_int

    try:
        check_int(batch_size, what="--batch", smallest=2)
    except ValueError as exc:
        fail(f"{exc} (BatchNorm in train mode needs two samples)")


def checked_out_dir(value: str | Path, option: str = "--out") -> Path:
    """``value`` as a folder to write results under, checked before any work (a Typer ``parser``).

    It must name a directory that exists, or one that can be created under a writable directory, and
    hold no control characters; nothing is created here, so a refused value leaves no trace. Exit 2
    with one line otherwise.
    """
    text = str(value) if isinstance(value, Path) else value
    refuse_control_characters(option, text)
    if not text.strip():
        fail(f"{option} must name a directory, got {text!r}")
    path = Path(text)
    if path.is_symlink() and not path.exists():
        fail(f"{option} '{path}' is a dangling symbolic link (to '{os.readlink(path)}'); name a directory, "
             "or remove the link")
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a directory"
        fail(f"{option} must be a directory (or one to create), got '{path}': it is {kind}")
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        fail(f"{option} '{path}' is not writable: '{ancestor}' is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"{option} '{path}' is not writable: '{ancestor}' does not let this user write in it")
    refuse_run_file(option, path)
    return path


def new_bench_dir(out: Path, name: str, device: str) -> Path:
    """``OUT/NAME_<UTC time>/`` (``-2``, ``-3``, ... when that exists) with the environment ``device`` runs
    in (``env.json``): a benchmark's folder. Created exclusively, so never an existing one: a rerun, or
    a second benchmark started in the same second, writes beside earlier results, not over them."""
    import json
    import time

    from actbench.measure.environment import capture_environment
    from actbench.store.outputs import atomic_write_text

    base = f"{name}_{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    for n in range(1, 1000):
        run_dir = out / (base if n == 1 else f"{base}-{n}")
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            break
        except FileExistsError:
            continue
        except OSError as err:
            fail(f"cannot create output directory {run_dir}: {err.strerror or err}")
    else:
        fail(f"cannot create output directory {out / base}: 999 folders of that second exist")
    atomic_write_text(run_dir / "env.json", json.dumps(capture_environment(profile(device)), indent=2, default=str))
    return run_dir


def write_bench_csv(path: Path, row_type: type, rows: Sequence[Any]) -> None:
    """A benchmark's rows (dataclasses of ``row_type``) as ``path``, one column per field; exit 2 with
    one line when it cannot be written (the previous file stays whole)."""
    import dataclasses

    from actbench.store.outputs import OutputError, atomic_write_csv

    names = [f.name for f in dataclasses.fields(row_type)]
    try:
        atomic_write_csv(path, names, ([getattr(row, n) for n in names] for row in rows), "CSV")
    except OutputError as exc:
        fail(str(exc))


#: --device choices, from the device profiles (actbench/core/devices.py).
Device = enum.Enum("Device", {name: name for name in DEVICE_NAMES}, type=str)
#: Devices that compute (not meta): bench-kernels, verify-grads, trust.
MeasuringDevice = enum.Enum("MeasuringDevice", {name: name for name in MEASURING_DEVICES}, type=str)
#: --gpu choices, from the GPU specs (actbench/core/gpus.py).
Gpu = enum.Enum("Gpu", {name: name for name in GPU_NAMES}, type=str)


#: --precision's help in the commands that measure outside a run directory (trust, verify-grads)
PRECISION_HELP = "fp32, or forward and loss under autocast to bf16 / fp16 (fp16 with a gradient scaler)."
#: --precision's choices, in every command that trains
Precision = enum.Enum("Precision", {name: name for name in PRECISIONS}, type=str)


#: What to do without a GPU when the question is memory or scale: predict it.
PREDICT_INSTEAD = ("without a GPU, predict with --device meta --budget 16GiB (or `actbench plan`), "
                   "or measure small sizes with --device cpu --image-size 64")
#: What to do without a GPU when the question is speed: meta has no throughput to predict.
MEASURE_SMALL_INSTEAD = ("without a GPU, measure small sizes with --device cpu --image-size 64 "
                         "(--device meta predicts memory only, no throughput)")


def require_device(name: str, instead: str = "use --device cpu") -> None:
    """Exit 2 with one line when this machine cannot run points on device ``name`` (e.g. no GPU).

    Called before anything is written; the profile says why, ``instead`` what to do.
    """
    reason = profile(name).unavailable()
    if reason is not None:
        fail(f"{reason}; {instead}")


# --- SIGTERM and SIGHUP behave like Ctrl-C ------------------------------------------------------
class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: handled like Ctrl-C (finished rows kept, the running child killed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals that end a measuring command the way Ctrl-C does.
TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def terminate_like_ctrl_c() -> Iterator[None]:
    """While measuring, SIGTERM and SIGHUP raise :class:`Terminated` (a KeyboardInterrupt).

    Whatever runs a child kills the child's process group on any exception
    (``actbench.execution.worker_processes.run_child``), and every ``except KeyboardInterrupt`` that keeps finished
    rows keeps them here too; :func:`interrupted_exit_code` then gives 128 + the signal's number.
    Outside the main thread (no signal handlers there) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in TERMINATING_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def interrupted_exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP (the shell's 128 + signal number)."""
    return 128 + exc.signum if isinstance(exc, Terminated) else 130


def interrupted_by(exc: BaseException) -> str:
    return f"{signal.Signals(exc.signum).name} received" if isinstance(exc, Terminated) else "interrupted"
