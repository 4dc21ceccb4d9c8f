"""Experiments: one TOML file per paper figure or table, checked whole and run end to end by ``actbench run``.

A file only describes which commands run with which options; its steps run through the same library
functions the commands call, into ``OUT/<experiment>[-quick]/<run>/``, and the figures and the report
are drawn from that folder. The file format: docs/design.md §8.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

import actbench
from actbench.execution.specs import MEASURING_COMMANDS, PLAN_DEVICE, CommandSpec, RunPlan, SpecError
from actbench.core.devices import DEVICE_NAMES as DEVICES
from actbench.core.devices import PROFILES
from actbench.schema import RETRIED_STATUSES, one_line
from actbench.execution.execution_options import short_repr

log = logging.getLogger(__name__)

EXPERIMENTS_DIR = Path(actbench.__file__).resolve().parent.parent / "experiments"
HARNESS_COMMANDS = MEASURING_COMMANDS
COMMANDS = HARNESS_COMMANDS + ("accuracy",)
TOP_KEYS = ("name", "description", "paper", "steps", "quick", "slurm")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
#: Bounds on what one file may ask for: its size, its steps, a step's points (models x strategies x sizes).
MAX_FILE_BYTES = 1 << 20
MAX_STEPS = 100
MAX_STEP_POINTS = 100_000
#: Integers beyond this are no size, count or seconds any step takes (and a float loses them).
MAX_INTEGER = 2 ** 53
#: An accuracy step's integer fields: (least, most). Beyond them a run would not fit a machine.
ACCURACY_LIMITS: dict[str, tuple[int, int]] = {
    "steps": (1, 10_000_000), "batch_size": (1, 65536), "model_depth": (1, 1000), "width": (1, 4096),
    "heads": (1, 256), "patch_size": (1, 1024), "mlp_dim": (1, 65536), "num_classes": (2, 100_000),
    "image_size": (8, 1024), "train_size": (1, 10_000_000), "test_size": (1, 10_000_000),
    "group_size": (8, 1 << 20), "seed": (0, 2 ** 31 - 1), "threads": (1, 1024),
}


class ExperimentError(ValueError):
    """A bad experiment file or name; the message is one line naming the file and the problem."""


# --- schema --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HarnessStep:
    """One measuring command over one or more models: a :class:`~actbench.execution.specs.CommandSpec` per model.

    The step's keys are the spec's fields, with ``models`` (a list) instead of ``model``; validation
    and defaults are the spec's, so a step means exactly what the same command line means. Fields
    shared by the models (``device``, ``strategies``, ...) read through to the first spec.
    """

    models: tuple[str, ...]
    specs: tuple[CommandSpec, ...]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("models", "specs"):
            raise AttributeError(name)
        return getattr(self.specs[0], name)

    def plans(self) -> list[RunPlan]:
        """One run per model, with its run-directory name (the CLI's naming)."""
        return [spec.plan() for spec in self.specs]

    def describe(self) -> str:
        first = self.specs[0]
        what = f"dim {first.dim}" if first.dim is not None else f"batch {first.batch}"
        return (f"{first.command} {','.join(self.models)} [{','.join(first.strategies)}]{first.precision_tag()} {what} "
                f"{first.input_size().label()} {first.device}" + (f" budget {first.budget}" if first.budget else ""))


#: The keys a measuring step accepts: the spec's fields, ``models`` in place of ``model``.
_STEP_FIELDS = ("models",) + tuple(f.name for f in dataclasses.fields(CommandSpec) if f.name != "model")


def _harness_step(data: dict[str, Any], where: str) -> HarnessStep:
    unknown = sorted(set(data) - set(_STEP_FIELDS))
    if unknown:
        raise ExperimentError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_STEP_FIELDS)}")
    hints = typing.get_type_hints(CommandSpec)
    hints["models"] = tuple[str, ...]
    values = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    for required in ("models", "strategies"):
        if not values.get(required):
            raise ExperimentError(f"{where}.{required}: is missing or empty")
    models = values.pop("models")
    twice = next((m for i, m in enumerate(models) if m in models[:i]), None)
    if twice is not None:
        raise ExperimentError(f"{where}.models: {short_repr(twice)} is listed more than once; list each model once")
    specs = []
    for model in models:
        try:
            specs.append(CommandSpec(model=model, **values))
        except SpecError as exc:
            raise ExperimentError(f"{where}.{exc.field}: {exc.problem}") from None
    points = sum(spec.plan().points for spec in specs)
    if points > MAX_STEP_POINTS:
        raise ExperimentError(f"{where}: {points} points, at most {MAX_STEP_POINTS} in one step; split it into "
                              "steps or narrow its models, strategies or sizes")
    return HarnessStep(models, tuple(specs))


@dataclass(frozen=True)
class AccuracyStep:
    """Accuracy vs bits (actbench.studies.accuracy); every field but ``command`` is an AccuracyConfig field."""

    command: str
    config: Any  # AccuracyConfig

    def describe(self) -> str:
        c = self.config
        bits = ", ".join(f"{b:g}" for b in c.bits)
        return (f"accuracy {c.model_tag()} {c.image_size}px {c.num_classes} classes, {c.steps} steps, "
                f"{'fp32 + ' if c.include_fp32 else ''}bits {bits} (cpu)")


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    paper: str | None
    steps: tuple[HarnessStep | AccuracyStep, ...]
    path: Path
    quick: bool = False
    #: the file's ``[slurm]`` table (actbench.execution.execution_options.SlurmOptions): the job array's resources for
    #: ``actbench run --executor slurm`` (the CLI's ``--slurm`` options win)
    slurm: Any = None

    def folder(self, out: Path) -> Path:
        """Where this experiment's runs, figures and report go (quick runs never mix with full ones)."""
        return out / (f"{self.name}-quick" if self.quick else self.name)


# --- loading -------------------------------------------------------------------------------------
def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check a TOML value against a dataclass field type (int, float, str, bool, Optional, tuple[X, ...])."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(value, args[0], where)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, list):
            raise ExperimentError(f"{where}: expected a list, got {type(value).__name__} {short_repr(value)}")
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        raise ExperimentError(f"{where}: {short_repr(value)} is out of range (at most {MAX_INTEGER})")
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
        value = str(value) if ok else value  # batch = 64 is as good as batch = "64"
    else:
        ok = True
    if not ok:
        raise ExperimentError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(value).__name__} "
                              f"{short_repr(value)}")
    return value


def _build(cls: type, data: dict[str, Any], where: str, exclude: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in exclude]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ExperimentError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field missing
        raise ExperimentError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise ExperimentError(f"{where}: {exc}") from None


def _fields_of(command: Any) -> set[str]:
    """Keys a step of ``command`` accepts (none for an unknown command; _step reports that)."""
    if command == "accuracy":
        from actbench.studies.accuracy import AccuracyConfig

        return {"command"} | {f.name for f in dataclasses.fields(AccuracyConfig)}
    if command in HARNESS_COMMANDS:
        return set(_STEP_FIELDS)
    return set()


def _step(data: dict[str, Any], where: str) -> HarnessStep | AccuracyStep:
    command = data.get("command")
    if command not in COMMANDS:
        raise ExperimentError(f"{where}.command: must be one of {', '.join(COMMANDS)}, got {command!r}")
    if command == "accuracy":
        from actbench.studies.accuracy import AccuracyConfig

        rest = {k: v for k, v in data.items() if k != "command"}
        return AccuracyStep("accuracy", _checked_accuracy(_build(AccuracyConfig, rest, where), where))
    return _harness_step(data, where)


def _checked_accuracy(config: Any, where: str) -> Any:
    """``config`` when every field training will use is valid: bounds, a ResNet's depth, the
    compression's group size (checked here, not when training starts); else ExperimentError naming it."""
    from actbench.actnn import level_config

    for name, (least, most) in ACCURACY_LIMITS.items():
        value = getattr(config, name)
        if not least <= value <= most:
            raise ExperimentError(f"{where}.{name}: must be from {least} to {most}, got {short_repr(value)}")
    depth = config.model_depth
    if config.model == "resnet" and (depth < 8 or (depth - 2) % 6):
        raise ExperimentError(f"{where}.model_depth: a resnet's depth must be 6n+2 (8, 14, 20, ...), got {depth}")
    try:
        level_config("L3", group_size=config.group_size)
    except ValueError as exc:
        raise ExperimentError(f"{where}.group_size: {' '.join(str(exc).split())}") from None
    return config


def _checked_top_level(data: dict, where: str) -> tuple[list[dict], dict]:
    """The file's keys, name, description and paper checked; its [[steps]] (each with a known command)
    and its [quick] table (each key one that some step has)."""
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ExperimentError(f"{where}: unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(TOP_KEYS)}")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ExperimentError(f"{where}: '{key}' must be a non-empty string")
    if not _NAME.fullmatch(data["name"].strip()):
        # the name is a folder under --out: a path in it would write elsewhere
        raise ExperimentError(f"{where}: 'name' must be letters, digits, '_', '-' or '.' (a folder name of at "
                              f"most 100 characters, not a path), got {short_repr(data['name'])}")
    if data.get("paper") is not None and not isinstance(data["paper"], str):
        raise ExperimentError(f"{where}: 'paper' must be a string")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise ExperimentError(f"{where}: needs at least one [[steps]] table")
    if len(steps) > MAX_STEPS:
        raise ExperimentError(f"{where}: {len(steps)} [[steps]], at most {MAX_STEPS}")
    for i, raw in enumerate(steps):  # a bad command is blamed on itself, before [quick] is read
        if raw.get("command") not in COMMANDS:
            raise ExperimentError(f"{where}: steps[{i}].command: must be one of {', '.join(COMMANDS)}, "
                                  f"got {raw.get('command')!r}")
    quick_all = data.get("quick", {})
    if not isinstance(quick_all, dict):
        raise ExperimentError(f"{where}: [quick] must be a table")
    # [quick] applies each key to the steps that have it (device to measuring steps, bits to
    # accuracy steps); a key that no step of the file has is a typo.
    known = set().union(*(_fields_of(s.get("command")) for s in steps))
    stray = sorted(set(quick_all) - known)
    if stray:
        raise ExperimentError(f"{where}: [quick]: unknown key(s) {', '.join(stray)} for the steps of this file")
    return steps, quick_all


def load_experiment(path: Path, quick: bool = False, device: str | None = None) -> Experiment:
    """Parse and validate one experiment file; ``quick`` applies its overrides, ``device`` wins over both.

    Raises :class:`ExperimentError` with one line naming the file and the problem.
    """
    where = path.name
    data = _read_toml(path)
    steps, quick_all = _checked_top_level(data, where)
    if device is not None and device not in DEVICES:
        raise ExperimentError(f"device must be one of {', '.join(DEVICES)}, got '{device}'")
    built = []
    for i, raw in enumerate(steps):
        here = f"{where}: steps[{i}]"
        merged = {k: v for k, v in raw.items() if k != "quick"}
        own_quick = raw.get("quick", {})
        if not isinstance(own_quick, dict):
            raise ExperimentError(f"{here}.quick must be a table")
        shared = {k: v for k, v in quick_all.items() if k in _fields_of(raw.get("command"))}
        if quick:
            merged.update(shared)
            merged.update(own_quick)
        if device is not None and merged.get("command") in HARNESS_COMMANDS and merged["command"] != "plan":
            merged["device"] = device
            if PROFILES[device].predicts:  # a prediction times nothing: the file's step counts do not apply
                merged.pop("warmup_steps", None)
                merged.pop("timed_steps", None)
            else:  # a GPU spec plans a prediction on meta; a measured device measures itself
                merged.pop("gpu", None)
        if merged.get("command") == "plan":
            merged.setdefault("device", PLAN_DEVICE)
        step = _step(merged, here + (" (quick)" if quick else ""))
        if not quick:  # the reduced version must be valid too, so `--quick` never fails on a typo
            _step({**merged, **shared, **own_quick}, here + " (quick)")
        built.append(step)
    return Experiment(data["name"].strip(), " ".join(data["description"].split()), data.get("paper"),
                      tuple(built), path, quick, _slurm_table(data.get("slurm"), where))


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML, or ExperimentError in one line: unreadable, not a regular file, too large,
    not UTF-8, not TOML, nested too deeply, an integer beyond Python's digit limit."""
    where = path.name
    try:
        if not path.is_file():
            raise ExperimentError(f"{path}: not a regular file")
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ExperimentError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ExperimentError(f"{where}: larger than {MAX_FILE_BYTES} bytes; an experiment file describes steps")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExperimentError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentError(f"{where}: bad TOML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ExperimentError(f"{where}: bad TOML: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ExperimentError(f"{where}: bad TOML: an integer out of range ({one_line(exc, 120)})") \
            from None


def _slurm_table(table: Any, where: str) -> Any:
    """The ``[slurm]`` table as SlurmOptions (same keys as ``--slurm KEY=VALUE``), or None."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ExperimentError(f"{where}: [slurm] must be a table")
    from actbench.execution.execution_options import SlurmOptions

    try:
        return SlurmOptions.parse(table, where=f"{where}: [slurm]")
    except ValueError as exc:
        raise ExperimentError(str(exc)) from None


def experiment_paths(folder: Path = EXPERIMENTS_DIR) -> tuple[Path, ...]:
    return tuple(sorted(folder.glob("*.toml")))


def resolve_experiment(name_or_path: str, folder: Path = EXPERIMENTS_DIR) -> Path:
    """A path to a .toml file, or a bare name looked up in ``folder``."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if path.exists() and not path.is_file():
            raise ExperimentError(f"experiment file '{path}' is not a regular file (a folder, device or pipe); "
                                  "give a .toml file or a name from experiments/")
        if not path.is_file():
            raise ExperimentError(f"experiment file '{path}' does not exist")
        return path
    candidate = folder / f"{name_or_path}.toml"
    if candidate.is_file():
        return candidate
    known = ", ".join(p.stem for p in experiment_paths(folder)) or "none"
    raise ExperimentError(f"unknown experiment '{name_or_path}'; known: {known}")


@dataclass(frozen=True)
class ListedExperiment:
    name: str
    description: str
    path: Path
    error: str | None = None


def list_experiments(folder: Path = EXPERIMENTS_DIR) -> tuple[ListedExperiment, ...]:
    out = []
    for path in experiment_paths(folder):
        try:
            exp = load_experiment(path)
        except ExperimentError as exc:
            out.append(ListedExperiment(path.stem, "", path, str(exc)))
        else:
            out.append(ListedExperiment(exp.name, exp.description, path))
    return tuple(out)


# --- execution -----------------------------------------------------------------------------------
Event = Callable[[str, str], None]  # (kind, text): kind in start/done/cached/info


@dataclass
class ExperimentResult:
    folder: Path
    run_dirs: list[Path] = field(default_factory=list)
    figures: tuple[Path, ...] = ()
    reports: tuple[Path, ...] = ()
    rows: int = 0
    failed_rows: int = 0
    #: rows that failed to measure (error, timeout), a subset of failed_rows (oom, over_budget are results)
    unmeasured_rows: int = 0


def run_harness_plan(plan: RunPlan, out: Path, timeout_s: float, on_event: Event, force: bool = False,
                     retry_failed: bool = True, execution: Any = None) -> tuple[Path, int, int, int]:
    """Execute one plan into ``out/<plan.name>/`` through PointRunner (resumes recorded points).

    Returns the run directory and its counts of rows, rows not ok, and rows that failed to measure.
    ``force``/``retry_failed``: as :class:`~actbench.execution.runner.PointRunner`'s; ``execution``: how the
    points run (:class:`actbench.execution.execution_options.ExecutionOptions`: jobs, GPUs, Slurm).
    """
    from actbench.store.outputs import check_writable
    from actbench.store.results import RunStore
    from actbench.execution.scaleout import execute

    check_writable(out)
    store = RunStore(out / plan.name)
    store.write_config(plan.config.identity())

    def point_event(kind: str, point, row) -> None:
        text = point.describe() + ("" if row is None else f": {row.status} {one_line(row.message, 80)}".rstrip())
        on_event(kind, text)

    try:
        outcome = execute(plan, store, on_event=point_event, retry_failed=retry_failed, force=force,
                          options=execution, timeout_s=timeout_s)
    finally:
        store.write_table()
    if plan.summary is not None:
        store.write_summary(plan.summary(outcome))
    return (store.run_dir, len(outcome.rows), sum(1 for r in outcome.rows if not r.ok),
            sum(1 for r in outcome.rows if r.status in RETRIED_STATUSES))


def run_experiment(exp: Experiment, out: Path, on_event: Event | None = None, draw: bool = True,
                   force: bool = False, retry_failed: bool = True, execution: Any = None) -> ExperimentResult:
    """Run every step of ``exp`` under ``exp.folder(out)``, then draw its figures and write its report.

    ``force``/``retry_failed`` apply to the measuring steps (as :class:`~actbench.execution.runner.PointRunner`'s).
    """
    from actbench.studies.accuracy import run_accuracy

    emit = on_event or (lambda kind, text: log.info("%s %s", kind, text))
    folder = exp.folder(out)
    result = ExperimentResult(folder)
    for step in exp.steps:
        emit("info", step.describe())
        if isinstance(step, AccuracyStep):
            run_dir, rows = run_accuracy(step.config, folder,
                                         on_event=lambda kind, label, row: emit(kind, _accuracy_text(label, row)))
            result.run_dirs.append(run_dir)
            result.rows += len(rows)
            result.failed_rows += sum(1 for r in rows if not r.ok)
            result.unmeasured_rows += sum(1 for r in rows if r.status in RETRIED_STATUSES)
            continue
        for plan in step.plans():
            run_dir, n, failed, unmeasured = run_harness_plan(plan, folder, step.timeout_s, emit, force, retry_failed,
                                                              execution)
            result.run_dirs.append(run_dir)
            result.rows += n
            result.failed_rows += failed
            result.unmeasured_rows += unmeasured
    if draw:
        result.figures, result.reports = _figures_and_report(folder)
    return result


def _accuracy_text(label: str, row) -> str:
    if row is None:
        return f"training {label}"
    if not row.ok:
        return f"{label}: {row.status} {row.message}"
    return (f"{label}: test accuracy {row.test_accuracy:.3f}, final train loss {row.train_loss_final:.3f}"
            + (f", mean bits {row.mean_bits:.2f}" if row.mean_bits is not None else "") + f" ({row.elapsed_s:.0f} s)")


def _figures_and_report(folder: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The folder's figures and its one report (harness and accuracy runs together)."""
    from actbench.reporting.report import write_report

    try:
        written = write_report(folder)
    except ValueError as exc:  # e.g. nothing finished: still a finished run, just nothing to draw
        log.warning("no report for %s: %s", folder, exc)
        return (), ()
    return written.figures, (written.path,)


__all__ = [
    "AccuracyStep", "Experiment", "ExperimentError", "ExperimentResult", "HarnessStep", "EXPERIMENTS_DIR",
    "list_experiments", "load_experiment", "resolve_experiment", "run_experiment",
]
