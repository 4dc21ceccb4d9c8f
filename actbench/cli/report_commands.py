"""Commands that read finished runs: ``plot`` (figures) and ``report`` (Markdown).

Thin: parse, call actbench.reporting.plots / actbench.reporting.report, print what was written. A missing or empty
results folder, or an output path that is empty, unwritable, one of the run files read or a run file
of another run folder, exits 2 with one line on stderr before anything is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from actbench.cli.app import app, fail, refuse_control_characters, refuse_run_file


def _path(option: str, value: Optional[str]) -> Optional[Path]:
    """An output path option, refused when given as the empty string (which would mean the cwd), with
    control characters, or naming a file of another run folder."""
    if value is None:
        return None
    refuse_control_characters(option, value)
    if not value.strip():
        fail(f"{option} must not be empty (a path, e.g. {option} report/)")
    refuse_run_file(option, Path(value))
    return Path(value)


ResultsDirArg = Annotated[Path, typer.Argument(help="A results folder (every run below it) or one run directory.")]
PaperCsvOpt = Annotated[Optional[Path], typer.Option(
    "--paper-csv", help="The paper's throughput points (default: results/paper/resnet50_t4_throughput.csv).")]


@app.command("plot")
def plot_command(
    results_dir: ResultsDirArg,
    out: Annotated[Optional[str], typer.Option("--out", help=(
        "Figure folder (default: each folder of runs gets its own FOLDER/figures; with --out, "
        "OUT/<folder relative to RESULTS_DIR>)."))] = None,
    paper: Annotated[bool, typer.Option(
        "--paper", help="Overlay the ActNN paper's points and maxima where model (resnet50), 224² and 16 GiB budget match.")] = False,
    paper_csv: PaperCsvOpt = None,
) -> None:
    """Draw every figure the rows support (PNG and PDF): throughput, maximum batch, memory, max-scale, accuracy vs bits.

    Each folder of runs (an experiment's folder, runs/, results/meta/...) is drawn on its own, into
    its own figures/ folder, so your runs never share a figure with the committed results. Prints
    each file written, then one line saying what was drawn where.

    \b
    Examples:
      actbench plot runs/                    # your runs (the measuring commands' default --out)
      actbench plot results/ --paper         # the committed results; the paper's points where the setting matches
    """
    from actbench.reporting.plots import write_figures_per_folder

    try:
        drawn = write_figures_per_folder(results_dir, _path("--out", out), with_paper=paper, paper_csv=paper_csv)
    except ValueError as exc:
        fail(str(exc))
    if not drawn:
        fail(f"the rows under '{results_dir}' support no figure (no ok row with a measured value)")
    for folder in drawn:
        for path in folder.paths:
            typer.echo(str(path))
    figures = sum(f.count for f in drawn)
    where = ", ".join(f"{f.target} ({f.count})" for f in drawn)
    typer.echo(f"drew {figures} figure{'s' if figures != 1 else ''} (PNG and PDF) from "
               f"{len(drawn)} folder{'s' if len(drawn) != 1 else ''} of runs: {where}", err=True)
    if paper:
        from actbench.reporting.runs import find_runs
        from actbench.reporting.plots import paper_overlay_groups

        try:
            runs = find_runs(results_dir)
        except ValueError:  # accuracy runs only: nothing the paper's maxima or curves apply to
            runs = ()
        if not paper_overlay_groups(runs):
            typer.echo("actbench: note: --paper overlaid nothing: no rows in the paper's setting "
                       "(resnet50, 224x224, budget 16 GiB)", err=True)


@app.command("report")
def report_command(
    results_dir: ResultsDirArg,
    out: Annotated[Optional[str], typer.Option("--out", help="Markdown file (default: RESULTS_DIR/report.md).")] = None,
    figures: Annotated[Optional[str], typer.Option(
        "--figures", help="Where the linked figures are drawn (default: RESULTS_DIR/figures).")] = None,
    no_figures: Annotated[bool, typer.Option("--no-figures", help="Tables only; draw and link no figures.")] = False,
    paper_csv: PaperCsvOpt = None,
) -> None:
    """Write one Markdown report of the folder: environment, tables, figures, the paper's numbers with ratios, accuracy vs bits.

    \b
    Example:
      actbench report results/meta --out results/meta/report.md
    """
    from actbench.reporting.report import write_report

    try:
        result = write_report(results_dir, _path("--out", out), _path("--figures", figures),
                              draw_figures=not no_figures, paper_csv=paper_csv)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(str(result.path))
