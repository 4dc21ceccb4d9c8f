"""Figures drawn from finished runs (they only read results; every number comes from actbench.reporting.analysis).

Each ``plot_*`` function returns a matplotlib ``Figure`` so tests can inspect its artists; only
:func:`write_figures` touches the disk. Figures are built without pyplot (no global figure registry)
on the Agg canvas, so drawing works headless and leaves no state behind.

Conventions shared by every figure (:mod:`actbench.reporting.style`): one colour per strategy
(:data:`PALETTE`); predictions (meta rows, and every row's predicted samples/s) are drawn with hollow
markers, dashed lines or hatched bars and "(predicted…)" in the legend, never as measured series; the failing
batch of a strategy is a red ×; memory is in GiB (MiB when everything is below 1 GiB); a maximum
that nothing larger was seen failing is a lower bound, labelled "≥"; "× fp32" means what
:data:`actbench.reporting.analysis.MULTIPLE_DEFINITIONS` says, and the figure says it too; throughput points
carry their spread (IQR) as error bars.

:func:`write_figures` draws each folder of runs on its own (an experiment's folder, ``runs/``,
``results/meta/...``), into that folder's ``figures/``: runs from different folders never share a figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from matplotlib.figure import Figure

from actbench.reporting import paper as paper_ref
from actbench.reporting.analysis import MULTIPLE_DEFINITIONS, BatchGroup, batch_groups, max_batch_table, memory_table
from actbench.reporting.runs import Run, find_result_runs
from actbench.reporting.scale import ScaleGroup, scale_groups
from actbench.reporting.style import (FORMATS, PALETTE, PREDICTED_HATCH, bar_style, colour, line_style,  # noqa: F401
                                      memory_unit, new_figure)
from actbench.reporting.throughput_figure import plot_throughput_vs_batch
from actbench.store.outputs import atomic_output, check_output
from actbench.strategies import FALLBACK_COLOUR

if TYPE_CHECKING:
    from actbench.store.accuracy_rows import AccuracyRow


# --- batch-type figures ------------------------------------------------------------------------
def plot_max_batch(group: BatchGroup, with_paper: bool = False) -> Figure | None:
    """Bars of the largest ok batch per series, each labelled with its multiple of fp32 (same device).

    A lower bound (nothing larger was seen failing) reads "≥". ``with_paper``: in the paper's setting
    (model, 224², 16 GiB) the paper's maxima are black diamonds on the bars of the same strategy.
    """
    entries = [e for e in max_batch_table(group) if e.max_batch is not None]
    if not entries or len(group.batch_sizes()) < 2:
        return None
    fig = new_figure()
    ax = fig.add_subplot()
    for i, e in enumerate(entries):
        bars = ax.bar([i], [e.max_batch], label=e.label, **bar_style(e.series))
        text = e.max_text
        if e.multiple_text is not None:
            text += f"\n{e.multiple_text}× fp32"
        ax.bar_label(bars, labels=[text], fontsize=7, padding=2)
    if with_paper and group.model == group.base_model \
            and paper_ref.matches(group.base_model, group.size, group.budget_bytes, gpu=group.gpu):
        marked = [(i, paper_ref.paper_max_batch(e.series.strategy)) for i, e in enumerate(entries)
                  if e.series.paper_comparable]
        marked = [(i, v) for i, v in marked if v is not None]
        if marked:
            ax.plot([i for i, _ in marked], [v for _, v in marked], linestyle="none", marker="D", color="black",
                    markersize=6, label="paper's maximum (T4, 16 GB)", gid="paper-max")
            for i, v in marked:
                ax.annotate(f"paper {v}", (i, v), textcoords="offset points", xytext=(6, -3), fontsize=6)
    ax.set_xticks(range(len(entries)), [e.label for e in entries], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("maximum batch size (images)")
    ax.set_title(group.title("Maximum batch"), fontsize=10, parse_math=False)
    notes = [MULTIPLE_DEFINITIONS["batch"]]
    if any(not e.bounded for e in entries):
        notes.append("≥: a lower bound, nothing larger was seen failing")
    fig.supxlabel("; ".join(notes), fontsize=6)
    ax.margins(y=0.2)
    ax.legend(fontsize=7, ncols=2)
    return fig


def plot_memory(group: BatchGroup) -> Figure | None:
    """Activation, peak allocated and model bytes per series at one batch size (grouped bars).

    Where a strategy keeps copies in CPU memory (swap, L4/L5), a fourth group of bars shows those
    host bytes beside the device bytes (they are counted in no device column).
    """
    batch_size, entries = memory_table(group)
    if not entries:
        return None
    metrics: tuple[tuple[str, str], ...] = (
        ("activation", "activation_bytes"), ("peak allocated", "peak_alloc_bytes"), ("model", "model_bytes"))
    if any(e.host_bytes for e in entries):
        metrics += (("host copies\n(CPU memory)", "host_bytes"),)
    scale, unit = memory_unit(getattr(e, f) for e in entries for _, f in metrics)
    fig = new_figure()
    ax = fig.add_subplot()
    n = len(entries)
    width = 0.8 / n
    for j, e in enumerate(entries):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(metrics))]
        ys = [(getattr(e, f) or 0) / scale for _, f in metrics]
        ax.bar(xs, ys, width=width, label=e.label, **bar_style(e.series))
    ax.set_xticks(range(len(metrics)), [m for m, _ in metrics])
    ax.set_ylabel(f"memory ({unit})" + (": device, and host copies" if len(metrics) > 3 else ""))
    ax.set_title(group.title(f"Memory at batch {batch_size}"), fontsize=10, parse_math=False)
    ax.legend(fontsize=7, ncols=2)
    return fig


def plot_activation_vs_batch(group: BatchGroup) -> Figure | None:
    """Activation bytes (saved state at the end of forward) vs batch size per series."""
    series = [s for s in group.series() if any(r.activation_bytes is not None for r in group.ok_points(s))]
    if not series or len(group.batch_sizes()) < 2:
        return None
    scale, unit = memory_unit(r.activation_bytes for r in group.rows if r.ok)
    fig = new_figure()
    ax = fig.add_subplot()
    for s in series:
        pts = [r for r in group.ok_points(s) if r.activation_bytes is not None]
        ax.plot([r.batch_size for r in pts], [r.activation_bytes / scale for r in pts], label=group.label(s),
                **line_style(s))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (images)")
    ax.set_ylabel(f"activation memory ({unit})")
    ax.set_title(group.title("Activation memory vs batch"), fontsize=10, parse_math=False)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2)
    return fig


# --- max-scale figures -------------------------------------------------------------------------
def plot_max_scale(group: ScaleGroup) -> Figure | None:
    """Left: the largest depth/width/resolution that fits per strategy; right: throughput at that maximum
    (only where a row measured one: predictions on meta have none, so their figure is the maxima alone)."""
    entries = [e for e in group.table() if e.max_value is not None]
    if not entries:
        return None
    with_ips = any(e.samples_per_s is not None for e in entries)
    fig = new_figure(9.0, 4.5)
    axes = fig.subplots(1, 2) if with_ips else (fig.subplots(1, 1),)
    ax_max = axes[0]
    names = {"depth": "maximum depth", "width": "maximum width", "resolution": "maximum resolution"}
    for i, e in enumerate(entries):
        bars = ax_max.bar([i], [e.max_value], label=e.label, **bar_style(e.series))
        # value, then what it adds ("(+680 blocks)"), then the multiple: one short line each, so the
        # labels of neighbouring bars of equal height do not run into each other
        text = e.max_label.replace(" (", "\n(", 1) + (f"\n{e.multiple_text}× fp32" if e.multiple_text else "")
        ax_max.bar_label(bars, labels=[text], fontsize=7, padding=2)
        if with_ips:
            bars = axes[1].bar([i], [e.samples_per_s or 0.0], **bar_style(e.series))
            axes[1].bar_label(bars, labels=["-" if e.samples_per_s is None else f"{e.samples_per_s:.3g}"],
                              fontsize=7, padding=2)
    for ax in axes:  # the tick labels name each bar (the legend would only repeat them over the bars)
        ax.set_xticks(range(len(entries)), [e.label for e in entries], rotation=30, ha="right", fontsize=8)
        ax.margins(y=0.25)
    ax_max.set_ylabel(f"{names[group.dim]} ({group.unit()})")
    if with_ips:
        axes[1].set_ylabel("throughput at the maximum (images/s)")
    notes = [group.definition()]
    if any(not e.bounded for e in entries):
        notes.append("≥: a lower bound, nothing larger was seen failing")
    fig.supxlabel("; ".join(notes), fontsize=6)
    fig.suptitle(group.title(names[group.dim].capitalize()), fontsize=10, parse_math=False)
    return fig


# --- all figures -------------------------------------------------------------------------------
@dataclass(frozen=True)
class NamedFigure:
    """A figure and its file stem (deterministic: kind + setting)."""

    name: str
    figure: Figure


def figures_for(runs: Sequence[Run], paper_points: Sequence[paper_ref.PaperPoint] | None = None) -> tuple[NamedFigure, ...]:
    """Every figure the rows support, in a fixed order."""
    out = []
    for group in batch_groups(runs):
        for kind, fig in (("throughput_vs_batch", plot_throughput_vs_batch(group, paper_points)),
                          ("max_batch", plot_max_batch(group, with_paper=paper_points is not None)),
                          ("memory", plot_memory(group)),
                          ("activation_vs_batch", plot_activation_vs_batch(group))):
            if fig is not None:
                out.append(NamedFigure(f"{kind}__{group.slug()}", fig))
    for sgroup in scale_groups(runs):
        fig = plot_max_scale(sgroup)
        if fig is not None:
            out.append(NamedFigure(f"max_{sgroup.slug()}", fig))
    return tuple(out)


def paper_overlay_groups(runs: Sequence[Run]) -> tuple[str, ...]:
    """Slugs of the batch groups measured in the paper's setting (where ``--paper`` overlays anything)."""
    return tuple(g.slug() for g in batch_groups(runs) if g.model == g.base_model
                 and paper_ref.matches(g.base_model, g.size, g.budget_bytes, gpu=g.gpu))


# --- accuracy vs bits (actbench.store.accuracy_rows) ----------------------------------------------------
def plot_accuracy_vs_bits(rows: Sequence["AccuracyRow"], title: str = "") -> Figure | None:
    """Test accuracy (left) and final train loss (right) vs average activation bits; fp32 as a line.

    Bits on a log2 axis (1.25 .. 8); the fp32 row is a horizontal line, chance a dotted one.
    None when no row trained successfully.
    """
    ok = [r for r in rows if r.ok]
    if not ok:
        return None
    fig = new_figure(9.0, 4.0)
    ax_acc, ax_loss = fig.subplots(1, 2)
    quant = sorted((r for r in ok if r.target_bits is not None), key=lambda r: r.target_bits)
    fp32 = next((r for r in ok if r.target_bits is None), None)
    for ax, attr, label in ((ax_acc, "test_accuracy", "test accuracy"), (ax_loss, "train_loss_final", "final train loss")):
        if quant:
            xs = [r.target_bits for r in quant]
            ax.plot(xs, [getattr(r, attr) for r in quant], color=colour("L3"), marker="o", label="ActNN (mixed precision)")
            for r in quant:
                ax.annotate(f"{getattr(r, attr):.3f}", (r.target_bits, getattr(r, attr)), fontsize=7,
                            textcoords="offset points", xytext=(0, 5), ha="center")
        if fp32 is not None:
            ax.axhline(getattr(fp32, attr), color=colour("fp32"), linestyle="--", label=f"fp32 ({getattr(fp32, attr):.3f})")
        ax.set_xscale("log", base=2)
        ticks = sorted({r.target_bits for r in quant})
        if ticks:
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
        ax.set_xlabel("average bits per saved activation")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_acc.axhline(ok[0].chance_accuracy, color=FALLBACK_COLOUR, linestyle=":", label="chance")
    ax_acc.set_ylim(0, 1.02)
    ax_acc.legend(fontsize=7)
    ax_loss.legend(fontsize=7)
    first = ok[0]
    fig.suptitle(title or (f"Accuracy vs activation bits — {first.model}, {first.num_classes} classes, "
                           f"{first.image_size}px, {first.steps} steps, seed {first.seed}"),
                 fontsize=10, parse_math=False)  # a model name is text, never mathtext
    return fig


def accuracy_figures(accuracy_runs: Sequence[tuple[Path, Sequence["AccuracyRow"]]]) -> tuple[NamedFigure, ...]:
    """``accuracy_vs_bits__<run>`` for every accuracy run with at least one finished training."""
    out = []
    for run_dir, rows in accuracy_runs:
        fig = plot_accuracy_vs_bits(rows)
        if fig is not None:
            out.append(NamedFigure(f"accuracy_vs_bits__{run_dir.name}", fig))
    return tuple(out)


# --- writing -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FolderFigures:
    """The figures drawn for one folder of runs, and where they went."""

    folder: Path
    target: Path
    paths: tuple[Path, ...]

    @property
    def count(self) -> int:
        """Figures drawn (each is written once per format)."""
        return len(self.paths) // len(FORMATS)


def run_folders(results_dir: Path, runs: Sequence[Run],
                accuracy_runs: Sequence[tuple[Path, Sequence["AccuracyRow"]]]) -> dict[Path, tuple[list, list]]:
    """Runs grouped by the folder that holds them (a run given directly is its own folder), in path order.

    An experiment's runs, ``runs/`` and each committed results folder are separate folders, so
    figures drawn per folder never mix a user's runs with the committed reference results.
    """
    folders: dict[Path, tuple[list, list]] = {}

    def folder_of(run_dir: Path) -> Path:
        return run_dir if run_dir == results_dir else run_dir.parent

    for run in runs:
        folders.setdefault(folder_of(run.path), ([], []))[0].append(run)
    for run_dir, rows in accuracy_runs:
        folders.setdefault(folder_of(run_dir), ([], []))[1].append((run_dir, rows))
    return dict(sorted(folders.items()))


def _save(figures: Sequence[NamedFigure], out_dir: Path) -> list[Path]:
    if not figures:
        return []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"figure directory '{out_dir}' cannot be created: {exc.strerror or exc}") from None
    written = []
    for nf in figures:
        for fmt in FORMATS:
            path = out_dir / f"{nf.name}.{fmt}"
            # fixed metadata so the same rows give the same files
            meta = {"Software": None} if fmt == "png" else {"CreationDate": None, "Producer": None}
            with atomic_output(path, "figure") as tmp:  # a full disk leaves the previous figure
                nf.figure.savefig(tmp, format=fmt, dpi=120, metadata=meta)
            written.append(path)
    return written


def _figure_targets(results_dir: Path, out_dir: Path | None, folders: Iterable[Path]) -> dict[Path, Path]:
    """Where each folder's figures go: ``FOLDER/figures``, or ``out_dir/<folder relative to results_dir>``."""
    return {folder: default_figures(folder) if out_dir is None else out_dir / folder.relative_to(results_dir)
            for folder in folders}


def default_figures(folder: Path) -> Path:
    """``folder/figures``; ValueError (one line) when it is a symbolic link: a results folder from
    elsewhere could otherwise point it anywhere and have figures written there unasked."""
    target = folder / "figures"
    if target.is_symlink():
        raise ValueError(f"'{target}' is a symbolic link (to '{os.readlink(target)}'): figures are drawn "
                         "into a real folder beside the runs; name another folder to draw them elsewhere "
                         "(plot --out, report --figures)")
    return target


def write_figures_per_folder(results_dir: Path, out_dir: Path | None = None, with_paper: bool = False,
                             paper_csv: Path | None = None) -> tuple[FolderFigures, ...]:
    """``actbench plot``: each folder of runs under ``results_dir`` drawn on its own.

    A folder's figures go to ``FOLDER/figures/``, or with ``out_dir`` to ``out_dir/<folder relative
    to results_dir>/``. Raises ValueError (one line) as :func:`write_figures` does.
    """
    found = find_result_runs(results_dir)
    folders = run_folders(results_dir, found.harness, found.accuracy)
    targets = _figure_targets(results_dir, out_dir, folders)
    inputs = paper_ref.input_files(found, paper_csv)
    for target in targets.values():  # every output checked before anything is drawn
        check_output(target, inputs, directory=True)
    points = paper_ref.load_checked(paper_csv) if with_paper else None
    drawn = []
    for folder, (runs, accuracy) in folders.items():
        target = targets[folder]
        paths = _save(figures_for(runs, points) + accuracy_figures(accuracy), target)
        if paths:
            drawn.append(FolderFigures(folder, target, tuple(paths)))
    return tuple(drawn)


def write_figures(results_dir: Path, out_dir: Path | None = None, with_paper: bool = False,
                  paper_csv: Path | None = None) -> tuple[Path, ...]:
    """Draw every figure the runs under ``results_dir`` support into ``out_dir`` (PNG and PDF); return the paths.

    All runs under ``results_dir`` are pooled (the report's view of a folder, which names the folders
    it pools); ``actbench plot`` draws each folder on its own (:func:`write_figures_per_folder`).
    Harness runs give throughput, max-batch, memory and max-scale figures; accuracy runs give
    accuracy vs bits. Raises ValueError (one line) for a missing folder, one holding no rows of
    either kind, or an unreadable paper CSV.
    """
    found = find_result_runs(results_dir)
    points = paper_ref.load_checked(paper_csv) if with_paper else None
    out_dir = default_figures(results_dir) if out_dir is None else out_dir
    return tuple(_save(figures_for(found.harness, points) + accuracy_figures(found.accuracy), out_dir))
