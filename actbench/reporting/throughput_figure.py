"""The throughput-vs-batch figure: measured series solid, predicted series dashed, never mixed.

Measured samples/s (cpu, cuda rows) are drawn per series as before, with their spread; the step-time
model's predicted samples/s (meta rows, and any row that carries one) are separate dashed series
labelled "STRATEGY (predicted, DEVICE-MODEL)"; meta rows, which measure nothing, appear only as
those. The paper's derived "ActNN" curve (the fastest fitting level at each batch) is drawn beside
the levels, dashed when it is predicted. The paper's points overlay the figure in its setting.
"""

from __future__ import annotations

from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from actbench.reporting import paper as paper_ref
from actbench.reporting.analysis import BatchGroup, Series
from actbench.reporting.speed import (RateSeries, actnn_series, measured_rate, predicted_rate,
                                      predicted_series)
from actbench.reporting.style import FAIL_COLOUR, FAIL_MARKER, FP32_SHADE, colour, line_style, new_figure

#: The derived ActNN curve: a wide translucent band under the levels it picks from.
ACTNN_COLOUR = "black"


def plot_throughput_vs_batch(group: BatchGroup,
                             paper_points: Sequence[paper_ref.PaperPoint] | None = None) -> Figure | None:
    """Images/s vs batch per series; red × at each series' first failing batch; fp32-feasible batches shaded.

    ``paper_points`` are overlaid only when the group's setting is the paper's (model, 224², 16 GiB or
    the t4 spec). Returns None when no row has a measured or a predicted throughput.
    """
    measured = [s for s in group.series() if any(measured_rate(r) is not None for r in group.ok_points(s))]
    predicted = predicted_series(group)
    if not measured and not predicted:
        return None
    overlay = bool(paper_points) and group.model == group.base_model \
        and paper_ref.matches(group.base_model, group.size, group.budget_bytes, gpu=group.gpu)
    fig = new_figure(10.0 if overlay else 8.0, 4.8 if not predicted else 5.6)
    ax = fig.add_subplot()
    fp32_max = _fp32_max(group)
    if fp32_max is not None:
        ax.axvspan(0, fp32_max, color=FP32_SHADE, alpha=0.6, zorder=0, label=f"fp32 fits (batch ≤ {fp32_max})")
    for s in measured:
        _draw_measured(ax, group, s)
    for rs in predicted:
        _draw_rates(ax, rs, colour(rs.name), dict(linestyle="--", marker="o", markerfacecolor="none", markersize=4,
                                                 linewidth=1.3))
    for rs in actnn_series(group):
        _draw_actnn(ax, rs)
    _draw_failures(ax, group)
    if overlay:
        _overlay_paper(ax, paper_points)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (images)")
    ax.set_ylabel("throughput (images/s" + (", median; bars: IQR)" if measured else ")"))
    ax.set_title(group.title("Throughput vs batch"), fontsize=10, parse_math=False)
    ax.grid(True, alpha=0.3)
    # outside the axes: with the paper's overlay the legend would hide curves
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=2 if overlay else 1)
    if predicted:
        fig.supxlabel("dashed: predicted by the step-time model on the named device model (docs/design.md §11), "
                      "not measured", fontsize=6)
    return fig


def _draw_measured(ax: Axes, group: BatchGroup, s: Series) -> None:
    """A measured series: its median samples/s, with error bars of ± half the IQR over the timed steps."""
    pts = [r for r in group.ok_points(s) if measured_rate(r) is not None]
    xs, ys = [r.batch_size for r in pts], [r.samples_per_s_median for r in pts]
    ax.plot(xs, ys, label=group.label(s), gid=f"measured:{s.name}:{s.device}", **line_style(s))
    spread = [(r.samples_per_s_iqr or 0.0) / 2 for r in pts]
    if any(spread):
        ax.errorbar(xs, ys, yerr=spread, fmt="none", ecolor=colour(s.strategy), elinewidth=0.8, capsize=2,
                    alpha=0.9, label=f"_iqr:{s.strategy}:{s.device}")  # "_": no legend entry


def _draw_rates(ax: Axes, rs: RateSeries, colour_: str, style: dict) -> None:
    kind = "predicted" if rs.predicted else "measured"
    ax.plot([p.batch_size for p in rs.points], [p.samples_per_s for p in rs.points], color=colour_,
            label=rs.label, gid=f"{kind}:{rs.name}:{rs.device}:{rs.device_model or ''}", **style)


def _draw_actnn(ax: Axes, rs: RateSeries) -> None:
    """The derived ActNN curve, with the level it takes written where the level changes."""
    _draw_rates(ax, rs, ACTNN_COLOUR, dict(linestyle="--" if rs.predicted else "-", linewidth=4.0, alpha=0.3,
                                           zorder=1))
    previous = None
    for p in rs.points:
        if p.strategy != previous:
            ax.annotate(p.strategy, (p.batch_size, p.samples_per_s), textcoords="offset points", xytext=(0, 6),
                        fontsize=6, ha="center", color=ACTNN_COLOUR, gid=f"actnn-level:{p.strategy}")
            previous = p.strategy


def _last_rate(group: BatchGroup, s: Series) -> float:
    """The series' throughput at its largest fitting batch: measured, else predicted, else 0."""
    for row in reversed(group.ok_points(s)):
        rate = measured_rate(row)
        found = predicted_rate(row)
        if rate is not None or found is not None:
            return rate if rate is not None else found[0]
    return 0.0


def _draw_failures(ax: Axes, group: BatchGroup) -> None:
    """A red × at each series' first failing batch (faded for predicted series)."""
    labelled = {False: False, True: False}
    for s in group.series():
        row = group.first_failure(s)
        if row is None:
            continue  # a series without throughput still shows where it stops fitting (at 0 images/s)
        label = "first failing batch" + (" (predicted)" if s.predicted else "")
        ax.plot([row.batch_size], [_last_rate(group, s)], linestyle="none", marker=FAIL_MARKER, color=FAIL_COLOUR,
                markersize=10, markeredgewidth=2, alpha=0.5 if s.predicted else 1.0, clip_on=False,
                label=None if labelled[s.predicted] else label, gid=f"fail:{s.strategy}:{s.device}")
        labelled[s.predicted] = True


def _fp32_max(group: BatchGroup) -> int | None:
    measured = [s for s in group.series() if s == Series("fp32", s.device) and not s.predicted]
    candidates = measured or [s for s in group.series() if s == Series("fp32", s.device)]
    batches = [r.batch_size for s in candidates for r in group.ok_points(s)]
    return max(batches) if batches else None


def _overlay_paper(ax: Axes, points: Sequence[paper_ref.PaperPoint]) -> None:
    by_strategy: dict[str, list[paper_ref.PaperPoint]] = {}
    for p in points:
        by_strategy.setdefault(p.strategy, []).append(p)
    fail_done = False
    for strategy, pts in by_strategy.items():
        ok = sorted((p for p in pts if p.ok and p.samples_per_s is not None), key=lambda p: p.batch_size)
        ax.plot([p.batch_size for p in ok], [p.samples_per_s for p in ok], color=colour(strategy), marker="s",
                markersize=3, linewidth=0.8, linestyle=":", alpha=0.8, label=f"paper: {strategy}",
                gid=f"paper:{strategy}")
        for p in pts:
            if not p.ok:
                y = ok[-1].samples_per_s if ok else 0.0
                ax.plot([p.batch_size], [y], linestyle="none", marker="+", color="darkred", markersize=8,
                        label=None if fail_done else "paper: first failing batch (T4)", gid=f"paper-fail:{strategy}")
                fail_done = True
