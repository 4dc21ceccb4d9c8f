"""Commands that read finished runs: ``plot`` (figures) and ``report`` (Markdown).

Thin: parse, call actbench.plots / actbench.report, print what was written. A missing or empty
results folder exits 2 with one line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from actbench.cli.app import app, fail

ResultsDirArg = Annotated[Path, typer.Argument(help="A results folder (every run below it) or one run directory.")]
PaperCsvOpt = Annotated[Optional[Path], typer.Option(
    "--paper-csv", help="The paper's throughput points (default: results/paper/resnet50_t4_throughput.csv).")]


@app.command("plot")
def plot_command(
    results_dir: ResultsDirArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Figure folder (default: RESULTS_DIR/figures).")] = None,
    paper: Annotated[bool, typer.Option(
        "--paper", help="Overlay the ActNN paper's points where model (resnet50), 224² and 16 GiB budget match.")] = False,
    paper_csv: PaperCsvOpt = None,
) -> None:
    """Draw every figure the rows support (PNG and PDF): throughput, maximum batch, memory, max-scale, accuracy vs bits.

    Example:
      actbench plot results/ --paper        # overlays the paper's points where the setting matches
    """
    from actbench.plots import write_figures

    try:
        written = write_figures(results_dir, out, with_paper=paper, paper_csv=paper_csv)
    except ValueError as exc:
        fail(str(exc))
    if not written:
        fail(f"the rows under '{results_dir}' support no figure (no ok row with a measured value)")
    for path in written:
        typer.echo(str(path))
    if paper:
        from actbench.analysis import find_runs
        from actbench.plots import paper_overlay_groups

        if not paper_overlay_groups(find_runs(results_dir)):
            typer.echo("actbench: note: --paper overlaid nothing: no rows in the paper's setting "
                       "(resnet50, 224x224, budget 16 GiB)", err=True)


@app.command("report")
def report_command(
    results_dir: ResultsDirArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Markdown file (default: RESULTS_DIR/report.md).")] = None,
    figures: Annotated[Optional[Path], typer.Option(
        "--figures", help="Where the linked figures are drawn (default: RESULTS_DIR/figures).")] = None,
    no_figures: Annotated[bool, typer.Option("--no-figures", help="Tables only; draw and link no figures.")] = False,
    paper_csv: PaperCsvOpt = None,
) -> None:
    """Write one Markdown report of the folder: environment, tables, figures, the paper's numbers with ratios, accuracy vs bits.

    Example:
      actbench report results/meta --out results/meta/report.md
    """
    from actbench.report import write_report

    try:
        result = write_report(results_dir, out, figures, draw_figures=not no_figures, paper_csv=paper_csv)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(str(result.path))
