"""``actbench run``: one experiment file (experiments/*.toml) end to end — runs, figures, report.

Thin: resolve and validate the file (actbench.experiments), run it through the same library
functions the measuring commands call, print where everything went. A bad file, an unknown key or
an unknown experiment exits 2 with one line on stderr.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from actbench.cli.app import (DEFAULT_OUT, Device, app, checked_out_dir, fail, interrupted_by,
                              interrupted_exit_code, terminate_like_ctrl_c)
from actbench.cli.options import ExecutorChoice, ExecutorOpt, GpusOpt, IsolateOpt, JobsOpt
from actbench.cli.progress import ensure_extension, plural
from actbench.core.devices import profile

log = logging.getLogger(__name__)


@app.command("run")
def run_command(
    experiment: Annotated[Optional[str], typer.Argument(
        help="An experiment file (experiments/NAME.toml) or a bare NAME from experiments/.")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="Apply the file's [quick] overrides: a reduced run for CPU in minutes.")] = False,
    device: Annotated[Optional[Device], typer.Option(
        "--device", help="Override every measuring step's device (accuracy always trains on cpu).")] = None,
    out: Annotated[Path, typer.Option("--out", parser=checked_out_dir, help=(
        "Runs go to OUT/<experiment>[-quick]/<run>/ (default runs/, ignored by git; results/ holds the committed "
        "reference results)."))] = DEFAULT_OUT,
    list_: Annotated[bool, typer.Option("--list", help="List the experiments in experiments/ and exit.")] = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Run only; draw no figures, write no report.")] = False,
    force: Annotated[bool, typer.Option("--force", help=(
        "Measure every point of the measuring steps again, even those already recorded."))] = False,
    no_retry: Annotated[bool, typer.Option("--no-retry", help=(
        "Keep recorded error and timeout rows instead of measuring those points again."))] = False,
    jobs: JobsOpt = 1,
    gpus: GpusOpt = None,
    executor: ExecutorOpt = ExecutorChoice.local,
    isolate: IsolateOpt = False,
    slurm: Annotated[Optional[list[str]], typer.Option("--slurm", metavar="KEY=VALUE", help=(
        "KEY=VALUE for --executor slurm, repeatable, over the file's [slurm] table: partition, account, time, "
        "gpus-per-job, cpus-per-job, array-parallelism; other keys go to sbatch."))] = None,
) -> None:
    """Run an experiment file: every step's rows, then its figures (PNG+PDF) and Markdown report.

    \b
    Examples:
      actbench run --list
      actbench run max_batch --quick --device cpu        # minutes on a CPU
      actbench run experiments/max_batch.toml            # the paper's grid, on a GPU
    """
    if list_:
        _list_experiments()
        return
    if experiment is None:
        fail("give an experiment (a .toml file or a name; `actbench run --list` lists them)")
    exp = _loaded(experiment, quick, device)
    execution = _checked_execution(exp, executor, jobs, gpus, isolate, slurm)
    result = _run(exp, out, execution, draw=not no_report, force=force, retry_failed=not no_retry)
    for path in result.run_dirs:
        typer.echo(f"run: {path}")
    for path in result.figures:
        typer.echo(f"figure: {path}")
    for path in result.reports:
        typer.echo(f"report: {path}")
    err = Console(stderr=True, highlight=False)
    err.print(f"{exp.name}: {plural(result.rows, 'row')} ({result.failed_rows} not ok, {result.unmeasured_rows} "
              f"failed to measure) under {result.folder}", markup=False)
    if result.rows and result.unmeasured_rows == result.rows:
        err.print(f"actbench: every point of {exp.name} failed to measure (error or timeout); see the messages above",
                  markup=False)
        raise typer.Exit(1)


def _list_experiments() -> None:
    """``run --list``: one line per experiment file; exit 1 when any of them is invalid."""
    from actbench.experiments import list_experiments

    listed = list_experiments()
    if not listed:
        fail("no experiment files found")
    width = max(len(e.name) for e in listed)
    for e in listed:
        typer.echo(f"{e.name:<{width}}  {e.description if e.error is None else 'INVALID: ' + e.error}")
    if any(e.error for e in listed):
        raise typer.Exit(1)


def _loaded(experiment: str, quick: bool, device: Optional[Device]):
    """The experiment file, checked whole (every step's fields) before anything runs."""
    from actbench.experiments import ExperimentError, load_experiment, resolve_experiment

    try:
        return load_experiment(resolve_experiment(experiment), quick=quick,
                               device=device.value if device is not None else None)
    except ExperimentError as exc:
        fail(str(exc))


def _checked_execution(exp, executor, jobs: int, gpus: Optional[str], isolate: bool, slurm: Optional[list[str]]):
    """How the experiment's steps execute, refused in one line where a step's device cannot take it."""
    from actbench.execution.execution_options import ExecutionOptions, SlurmOptions, parse_gpus

    devices = dict.fromkeys(getattr(s, "device", "cpu") for s in exp.steps)  # accuracy steps train on the cpu
    if exp.slurm is not None and executor.value != "slurm":
        fail(f"{exp.name}: the file's [slurm] table applies to --executor slurm only, got --executor "
             f"{executor.value}; add --executor slurm, or run a copy of the file without [slurm]")
    try:
        execution = ExecutionOptions(executor=executor.value, jobs=jobs, gpus=parse_gpus(gpus), isolate=isolate,
                                     slurm=SlurmOptions.parse(slurm, base=exp.slurm if executor.value == "slurm"
                                                              else None))
        for device_name in devices:
            execution.check(profile(device_name))
    except ValueError as exc:
        fail(str(exc))
    for device_name in devices:
        reason = profile(device_name).unavailable()
        if reason is not None:
            fail(f"{exp.name}: a step runs on {device_name}, but {reason.partition(': ')[2]}; "
                 "use --device meta (predictions) or --quick --device cpu")
    return execution


def _run(exp, out: Path, execution, draw: bool, force: bool, retry_failed: bool):
    """Every step, with progress on stderr; Ctrl-C, SIGTERM and SIGHUP keep finished rows."""
    from actbench.execution.slurm import SubmitError
    from actbench.experiments import run_experiment

    printer = _StepPrinter(exp)
    with terminate_like_ctrl_c():
        try:
            for device_name, strategies in _extension_needs(exp).items():
                problem = ensure_extension(strategies, device_name, printer.say)
                if problem is not None:
                    fail(problem, code=1)
            result = run_experiment(exp, out, on_event=printer.on_event, draw=draw, force=force,
                                    retry_failed=retry_failed, execution=execution)
        except ValueError as exc:
            printer.close()
            fail(str(exc))
        except SubmitError as exc:
            printer.close()
            fail(str(exc), code=exc.code)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP
            printer.close()
            Console(stderr=True, highlight=False).print(
                f"{interrupted_by(exc)}: finished rows are kept; rerun the same command to resume", markup=False)
            raise typer.Exit(interrupted_exit_code(exc))
    printer.close()
    return result


def _extension_needs(exp) -> dict[str, tuple[str, ...]]:
    """Per device, the strategies of the steps that run there (accuracy trains with ActNN on cpu)."""
    from actbench.experiments import AccuracyStep

    needs: dict[str, list[str]] = {}
    for step in exp.steps:
        if isinstance(step, AccuracyStep):
            needs.setdefault(ACCURACY_DEVICE, []).append(ACCURACY_STRATEGY)
        else:
            needs.setdefault(step.device, []).extend(step.strategies)
    return {d: tuple(dict.fromkeys(s)) for d, s in needs.items()}


#: accuracy_vs_bits trains on the CPU with ActNN's mixed precision (an L3 configuration).
ACCURACY_DEVICE, ACCURACY_STRATEGY = "cpu", "L3"


class _StepPrinter:
    """One line per step and per point on stderr, flushed: "  measuring resnet18 fp32 b2 16px cpu ... ok (3.1 s)"."""

    def __init__(self, exp) -> None:
        self.name = exp.name
        self.steps = list(exp.steps)
        self.step = -1
        self.verb = "measuring"
        self.open = ""
        self.started = 0.0

    def _write(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.open:
            self._write("\n")
            self.open = ""

    def say(self, text: str) -> None:
        self.close()
        self._write(text + "\n")

    def on_event(self, kind: str, text: str) -> None:
        if kind == "info":
            self.step += 1
            step = self.steps[self.step] if self.step < len(self.steps) else None
            device = getattr(step, "device", None) if step is not None and hasattr(step, "specs") else None
            self.verb = "" if device is None else ("predicting" if profile(device).predicts else "measuring")
            self.say(f"{self.name}: {text}")
        elif kind == "start":
            self.close()
            self.started = time.monotonic()
            self.open = text
            self._write(f"  {(self.verb + ' ') if self.verb else ''}{text} ... ")
        elif kind == "cached":
            self.say(f"  {text} (resumed)")
        elif self.open:  # the point (or training) that started on this line is done: its result ends it
            result = text[len(self.open):].lstrip(": ").strip() if text.startswith(self.open) else text
            self._write(f"{result or 'done'} ({time.monotonic() - self.started:.1f} s)\n")
            self.open = ""
        else:
            self.say(f"  {text}")

