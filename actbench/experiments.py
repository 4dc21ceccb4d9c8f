"""Experiments: one TOML file per paper figure or table, run end to end by ``actbench run``.

A file describes, and only describes, which commands run with which options::

    name = "max_batch"
    description = "Maximum batch per strategy ..."      # one line, shown by `actbench run --list`
    paper = "Table 4 / Figure 7"                       # what it reproduces (optional)

    [[steps]]                                          # one or more; each is one command
    command = "sweep-batch"                            # sweep-batch | throughput | memory | max-scale | accuracy
    models = ["resnet50", "resnet152"]
    strategies = ["fp32", "swap", "L3"]
    ...
    [steps.quick]                                      # this step's reduced version (optional)

    [quick]                                            # overrides for every step with --quick
    image_size = 32

Each step's keys are the fields of :class:`HarnessStep` (or :class:`AccuracyStep`); an unknown key,
a wrong type or a bad value is a one-line :class:`ExperimentError`. With ``quick``, the file's
``[quick]`` table and then the step's own ``[steps.quick]`` override the step.

Execution calls the same library functions the commands call (``actbench.search`` configs and
searches, ``actbench.runner.PointRunner``, ``actbench.accuracy.run_accuracy``); runs land in
``OUT/<experiment>[-quick]/<run>/`` and the figures and the report are drawn from that folder.
"""

from __future__ import annotations

import dataclasses
import logging
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

import actbench

log = logging.getLogger(__name__)

EXPERIMENTS_DIR = Path(actbench.__file__).resolve().parent.parent / "experiments"
HARNESS_COMMANDS = ("sweep-batch", "throughput", "memory", "max-scale")
COMMANDS = HARNESS_COMMANDS + ("accuracy",)
DEVICES = ("cpu", "cuda", "meta")
DIMENSIONS = ("depth", "width", "resolution")  # actbench.search.DIMENSIONS, without importing torch here
TOP_KEYS = ("name", "description", "paper", "steps", "quick")


class ExperimentError(ValueError):
    """A bad experiment file or name; the message is one line naming the file and the problem."""


# --- schema --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HarnessStep:
    """One measuring command over one or more models (the CLI's options, with the same defaults).

    ``batch``: "START:STOP:STEP", "N" or "N,M,..." (max-scale: one batch size). ``budget``: e.g.
    "16GiB". ``warmup_steps``/``timed_steps``: None = the command's default for the device.
    ``dim``/``low``/``high``/``step``: max-scale only (None = the command's default range).
    """

    command: str
    models: tuple[str, ...]
    strategies: tuple[str, ...]
    batch: str = "64"
    image_size: int = 224
    device: str = "cuda"
    budget: str | None = None
    stop_after: int = 2
    find_max: bool = False
    dim: str | None = None
    low: int | None = None
    high: int | None = None
    step: int | None = None
    warmup_steps: int | None = None
    timed_steps: int | None = None
    checkpoint_segments: int | None = None
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        from actbench.models import ModelSpec, validate_model_spec
        from actbench.parsing import parse_bytes, parse_int_range, parse_strategies

        if self.command not in HARNESS_COMMANDS:
            raise ValueError(f"command must be one of {', '.join(COMMANDS)}, got '{self.command}'")
        if not self.models:
            raise ValueError("models is empty")
        for name in self.models:
            validate_model_spec(ModelSpec(name))
        if not self.strategies:
            raise ValueError("strategies is empty")
        object.__setattr__(self, "strategies", parse_strategies(",".join(self.strategies)))
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got '{self.device}'")
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16 pixels, got {self.image_size}")
        batches = parse_int_range(self.batch, "batch")
        if self.command == "max-scale":
            if len(batches) != 1:
                raise ValueError(f"max-scale takes one batch size, got '{self.batch}'")
            if self.dim not in DIMENSIONS:
                raise ValueError(f"max-scale needs dim = depth, width or resolution, got {self.dim!r}")
        elif any(v is not None for v in (self.dim, self.low, self.high, self.step)):
            raise ValueError(f"dim/low/high/step apply to max-scale only, not {self.command}")
        if self.budget is not None:
            parse_bytes(self.budget)
        for name in ("stop_after", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_steps", "timed_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.checkpoint_segments is not None and self.checkpoint_segments <= 0:
            raise ValueError(f"checkpoint_segments must be > 0, got {self.checkpoint_segments}")
        for plan in self.plans():  # build every library config now, so a bad range fails at load time
            if self.command == "max-scale":
                from actbench.search import validate_max_scale

                validate_max_scale(plan.config)

    def settings(self):
        """The MeasureSettings the CLI would build from these options."""
        from actbench.parsing import parse_bytes
        from actbench.search import MeasureSettings

        return MeasureSettings.resolve(
            self.device, self.command, parse_bytes(self.budget) if self.budget is not None else None,
            self.warmup_steps, self.timed_steps, self.checkpoint_segments, self.timeout_s)

    def plans(self) -> list["RunPlan"]:
        """One library config per model, with its run-directory name (the CLI's naming)."""
        from actbench.models import ModelSpec
        from actbench.parsing import parse_int_range
        from actbench.results import run_name
        from actbench.search import (GridConfig, MaxScaleConfig, SweepConfig, run_grid, run_max_scale, run_sweep,
                                     search_probes, with_defaults)

        settings = self.settings()
        batches = parse_int_range(self.batch, "batch")
        plans = []
        for model in self.models:
            spec = ModelSpec(model)
            if self.command == "sweep-batch":
                cfg = SweepConfig(spec, self.strategies, batches, self.image_size, settings, self.stop_after,
                                  self.find_max)
                n = len(cfg.candidates())
                points = (search_probes(n) if self.find_max else n) * len(self.strategies)
                name = run_name("sweep-batch", spec.label(), settings.device, self.image_size, cfg.identity())
                plans.append(RunPlan(name, cfg, run_sweep, points, self._summary_maker("max_batch")))
            elif self.command == "max-scale":
                lo, hi, st = with_defaults(self.dim, self.low, self.high, self.step)
                cfg = MaxScaleConfig(self.dim, model, self.strategies, batches[0], self.image_size, lo, hi, st, settings)
                points = search_probes(len(cfg.candidates())) * len(self.strategies)
                name = run_name(f"max-scale-{self.dim}", model, settings.device, self.image_size, cfg.identity())
                plans.append(RunPlan(name, cfg, run_max_scale, points, self._summary_maker("max", dim=self.dim)))
            else:
                cfg = GridConfig(self.command, spec, self.strategies, batches, self.image_size, settings)
                name = run_name(self.command, spec.label(), settings.device, self.image_size, cfg.identity())
                plans.append(RunPlan(name, cfg, run_grid, len(cfg.points()), None))
        return plans

    def _summary_maker(self, what: str, **extra: Any) -> Callable[[Any], dict[str, Any]]:
        command = self.command

        def make(outcome) -> dict[str, Any]:
            return {"command": command, **extra, what: outcome.summary()}

        return make

    def describe(self) -> str:
        what = f"dim {self.dim}" if self.command == "max-scale" else f"batch {self.batch}"
        return (f"{self.command} {','.join(self.models)} [{','.join(self.strategies)}] {what} "
                f"{self.image_size}px {self.device}" + (f" budget {self.budget}" if self.budget else ""))


@dataclass(frozen=True)
class AccuracyStep:
    """Accuracy vs bits (actbench.accuracy); every field but ``command`` is an AccuracyConfig field."""

    command: str
    config: Any  # AccuracyConfig

    def describe(self) -> str:
        c = self.config
        bits = ", ".join(f"{b:g}" for b in c.bits)
        return (f"accuracy resnet{c.model_depth} {c.image_size}px {c.num_classes} classes, {c.steps} steps, "
                f"{'fp32 + ' if c.include_fp32 else ''}bits {bits} (cpu)")


@dataclass(frozen=True)
class RunPlan:
    """One run directory's worth of work: a library config and the search that executes it."""

    name: str
    config: Any
    search: Callable[[Any, Callable], Any]
    points: int
    summary: Callable[[Any], dict[str, Any]] | None


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    paper: str | None
    steps: tuple[HarnessStep | AccuracyStep, ...]
    path: Path
    quick: bool = False

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
            raise ExperimentError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
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
        raise ExperimentError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(value).__name__} {value!r}")
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
        from actbench.accuracy import AccuracyConfig

        return {"command"} | {f.name for f in dataclasses.fields(AccuracyConfig)}
    if command in HARNESS_COMMANDS:
        return {f.name for f in dataclasses.fields(HarnessStep)}
    return set()


def _step(data: dict[str, Any], where: str) -> HarnessStep | AccuracyStep:
    command = data.get("command")
    if command not in COMMANDS:
        raise ExperimentError(f"{where}.command: must be one of {', '.join(COMMANDS)}, got {command!r}")
    if command == "accuracy":
        from actbench.accuracy import AccuracyConfig

        rest = {k: v for k, v in data.items() if k != "command"}
        return AccuracyStep("accuracy", _build(AccuracyConfig, rest, where))
    return _build(HarnessStep, data, where)


def load_experiment(path: Path, quick: bool = False, device: str | None = None) -> Experiment:
    """Parse and validate one experiment file; ``quick`` applies its overrides, ``device`` wins over both.

    Raises :class:`ExperimentError` with one line naming the file and the problem.
    """
    where = path.name
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ExperimentError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentError(f"{where}: bad TOML: {exc}") from None
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ExperimentError(f"{where}: unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(TOP_KEYS)}")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ExperimentError(f"{where}: '{key}' must be a non-empty string")
    if data.get("paper") is not None and not isinstance(data["paper"], str):
        raise ExperimentError(f"{where}: 'paper' must be a string")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise ExperimentError(f"{where}: needs at least one [[steps]] table")
    quick_all = data.get("quick", {})
    if not isinstance(quick_all, dict):
        raise ExperimentError(f"{where}: [quick] must be a table")
    if device is not None and device not in DEVICES:
        raise ExperimentError(f"device must be one of {', '.join(DEVICES)}, got '{device}'")
    # [quick] applies each key to the steps that have it (device to measuring steps, bits to
    # accuracy steps); a key that no step of the file has is a typo.
    known = set().union(*(_fields_of(s.get("command")) for s in steps))
    stray = sorted(set(quick_all) - known)
    if stray:
        raise ExperimentError(f"{where}: [quick]: unknown key(s) {', '.join(stray)} for the steps of this file")
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
        if device is not None and merged.get("command") != "accuracy":
            merged["device"] = device
        step = _step(merged, here + (" (quick)" if quick else ""))
        if not quick:  # the reduced version must be valid too, so `--quick` never fails on a typo
            _step({**merged, **shared, **own_quick}, here + " (quick)")
        built.append(step)
    return Experiment(data["name"].strip(), " ".join(data["description"].split()), data.get("paper"),
                      tuple(built), path, quick)


def experiment_paths(folder: Path = EXPERIMENTS_DIR) -> tuple[Path, ...]:
    return tuple(sorted(folder.glob("*.toml")))


def resolve_experiment(name_or_path: str, folder: Path = EXPERIMENTS_DIR) -> Path:
    """A path to a .toml file, or a bare name looked up in ``folder``."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
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


def run_harness_plan(plan: RunPlan, out: Path, timeout_s: float, on_event: Event) -> tuple[Path, int, int]:
    """Execute one plan into ``out/<plan.name>/`` through PointRunner (resumes recorded points)."""
    from actbench.results import RunStore, check_writable
    from actbench.runner import PointRunner

    check_writable(out)
    store = RunStore(out / plan.name)
    store.write_config(plan.config.identity())

    def point_event(kind: str, point, row) -> None:
        text = point.describe() + ("" if row is None else f": {row.status} {row.message[:80]}".rstrip())
        on_event(kind, text)

    runner = PointRunner(store, plan.config.settings.device, timeout_s=timeout_s, on_event=point_event)
    try:
        outcome = plan.search(plan.config, runner.run)
    finally:
        store.write_table()
    if plan.summary is not None:
        store.write_summary(plan.summary(outcome))
    return store.run_dir, len(outcome.rows), sum(1 for r in outcome.rows if not r.ok)


def run_experiment(exp: Experiment, out: Path, on_event: Event | None = None, draw: bool = True) -> ExperimentResult:
    """Run every step of ``exp`` under ``exp.folder(out)``, then draw its figures and write its report."""
    from actbench.accuracy import run_accuracy

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
            continue
        for plan in step.plans():
            run_dir, n, failed = run_harness_plan(plan, folder, step.timeout_s, emit)
            result.run_dirs.append(run_dir)
            result.rows += n
            result.failed_rows += failed
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
    from actbench.report import write_report

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
