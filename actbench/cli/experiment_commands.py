"""``actbench run``: one experiment file (experiments/*.toml) end to end — runs, figures, report.

Thin: resolve and validate the file (actbench.experiments), run it through the same library
functions the measuring commands call, print where everything went. A bad file, an unknown key or
an unknown experiment exits 2 with one line on stderr.
"""

from __future__ import annotations

import enum
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from actbench.cli.app import Device, app, fail
from actbench.devices import profile

log = logging.getLogger(__name__)


@app.command("run")
def run_command(
    experiment: Annotated[Optional[str], typer.Argument(
        help="An experiment file (experiments/NAME.toml) or a bare NAME from experiments/.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Apply the file's [quick] overrides: a reduced run for CPU in minutes.")] = False,
    device: Annotated[Optional[Device], typer.Option(
        "--device", help="Override every measuring step's device (accuracy always trains on cpu).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Results root; runs go to OUT/<experiment>[-quick]/<run>/.")] = Path("results"),
    list_: Annotated[bool, typer.Option("--list", help="List the experiments in experiments/ and exit.")] = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Run only; draw no figures, write no report.")] = False,
) -> None:
    """Run an experiment file: every step's rows, then its figures (PNG+PDF) and Markdown report.

    Examples:
      actbench run --list
      actbench run max_batch --quick --device cpu        # minutes on a CPU
      actbench run experiments/max_batch.toml            # the paper's grid, on a GPU
    """
    from actbench.experiments import (ExperimentError, list_experiments, load_experiment, resolve_experiment,
                                      run_experiment)

    if list_:
        listed = list_experiments()
        if not listed:
            fail("no experiment files found")
        width = max(len(e.name) for e in listed)
        for e in listed:
            typer.echo(f"{e.name:<{width}}  {e.description if e.error is None else 'INVALID: ' + e.error}")
        if any(e.error for e in listed):
            raise typer.Exit(1)
        return
    if experiment is None:
        fail("give an experiment (a .toml file or a name; `actbench run --list` lists them)")
    try:
        exp = load_experiment(resolve_experiment(experiment), quick=quick,
                              device=device.value if device is not None else None)
    except ExperimentError as exc:
        fail(str(exc))
    for device_name in dict.fromkeys(getattr(s, "device", None) for s in exp.steps if hasattr(s, "device")):
        reason = profile(device_name).unavailable()
        if reason is not None:
            fail(f"{exp.name}: a step runs on {device_name}, but {reason.partition(': ')[2]}; "
                 "use --device meta (predictions) or --quick --device cpu")
    err = Console(stderr=True, highlight=False)

    def on_event(kind: str, text: str) -> None:
        # markup off: step descriptions hold "[fp32,L3]", which rich would read as a style tag
        if kind == "info":
            err.print(f"{exp.name}: {text}", markup=False)
        elif kind != "start":
            err.print(f"  {text}" + (" (resumed)" if kind == "cached" else ""), markup=False)

    try:
        result = run_experiment(exp, out, on_event=on_event, draw=not no_report)
    except ValueError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err.print("interrupted: finished rows are kept; rerun the same command to resume")
        raise typer.Exit(130)
    for path in result.run_dirs:
        typer.echo(f"run: {path}")
    for path in result.figures:
        typer.echo(f"figure: {path}")
    for path in result.reports:
        typer.echo(f"report: {path}")
    err.print(f"{exp.name}: {result.rows} rows ({result.failed_rows} not ok) under {result.folder}")
