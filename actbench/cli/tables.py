"""The tables the measuring commands print: rows, maxima, memory breakdowns, plans (rich, to stdout)."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from actbench.schema import one_line


def console() -> Console:
    """Stdout console; wide when redirected so tables in logs do not wrap into unreadable columns."""
    return Console(width=None if sys.stdout.isatty() else 180)


def cell(text: object) -> Text:
    """A table cell printed as written: row messages like "[enforce fail at ...]" are not rich markup."""
    return Text(str(text))


def spread(median: float | None, iqr: float | None) -> str:
    """The IQR of samples/s, and what fraction of the median it is: ``1.2 (8%)``."""
    if iqr is None:
        return "-"
    return f"{iqr:.1f} ({iqr / median:.0%})" if median else f"{iqr:.1f}"


def series_name(row) -> str:
    """A row's strategy, with its precision away from fp32 (``L3 bf16``), as figures and reports name it."""
    from actbench.schema import DEFAULT_PRECISION

    return row.strategy if row.precision == DEFAULT_PRECISION else f"{row.strategy} {row.precision}"


def precision_suffix(rows) -> str:
    """`` at bf16`` for a table of maxima whose rows ran away from fp32; nothing at fp32."""
    from actbench.schema import DEFAULT_PRECISION

    others = sorted({r.precision for r in rows} - {DEFAULT_PRECISION})
    return f" at {', '.join(others)}" if others else ""


def render_rows(rows, title: str) -> None:
    from actbench.schema import format_bytes

    table = Table(title=cell(title))
    for col in ("strategy", "model", "depth", "batch", "px", "status", "activation", "peak alloc",
                "reserved", "model bytes", "samples/s", "IQR", "GFLOP/sample", "message"):
        table.add_column(col, overflow="fold")
    for r in rows:
        rate = "-" if r.samples_per_s_median is None else f"{r.samples_per_s_median:.1f}"
        flops = "-" if r.flops_per_sample is None else f"{r.flops_per_sample / 1e9:.3f}"
        model = r.model + (f"+{r.extra_blocks}" if r.extra_blocks else "") + (
            f" w{r.width_per_group}" if r.width_per_group else "")
        table.add_row(*(cell(c) for c in (
            series_name(r), model, str(r.depth or "-"), str(r.batch_size), str(r.image_size), r.status,
            format_bytes(r.activation_bytes), format_bytes(r.peak_alloc_bytes), format_bytes(r.reserved_bytes),
            format_bytes(r.model_bytes), rate, spread(r.samples_per_s_median, r.samples_per_s_iqr), flops,
            one_line(r.message, 80))))
    table.caption = cell("IQR: spread of samples/s over the timed steps (interquartile range), and its share "
                          "of the median") if any(r.samples_per_s_iqr is not None for r in rows) else None
    console().print(table)


def bound_caption(outcome) -> str | None:
    """Explains "≥" under a table of maxima, when any maximum is only a lower bound."""
    if all(outcome.bounded(s) for s, v in outcome.maxima.items() if v is not None):
        return None
    return ("≥ = nothing larger was seen failing: the limit lies beyond the range searched "
            "(widen the range, or set --budget)")


def max_cells(outcome, strategy: str) -> tuple[str, str]:
    """(maximum, × fp32) as text; "≥" marks a lower bound, and a ratio to or of one is only a bound.

    × fp32 has one definition, shared with the figures and the report (actbench.reporting.analysis): the
    searched quantity ÷ fp32's, where depth counts layers (not the extra blocks searched over).
    """
    from actbench.reporting.analysis import bound_ratio, scale_value

    value = outcome.maxima.get(strategy)
    exact = outcome.bounded(strategy)
    if value is None:
        return "none", "-"
    text = str(value) if exact else f"≥{value}"
    row, base = outcome.best_rows.get(strategy), outcome.best_rows.get("fp32")
    if row is None or base is None:
        return text, "-"
    ratio = bound_ratio(scale_value(outcome.dim, row), exact, scale_value(outcome.dim, base), outcome.bounded("fp32"))
    return text, ratio or "-"


def maxima_caption(outcome) -> str:
    from actbench.reporting.analysis import MULTIPLE_DEFINITIONS

    lines = [MULTIPLE_DEFINITIONS.get(outcome.dim, MULTIPLE_DEFINITIONS["batch"])]
    bound = bound_caption(outcome)
    if bound:
        lines.append(bound)
    return "\n".join(lines)


def render_maxima(outcome, what: str) -> None:
    from actbench.reporting.speed import PREDICTED_COLUMN_NOTE, predicted_text

    table = Table(title=f"largest {what} that fits{precision_suffix(outcome.rows)}")
    predicted = any(r is not None and r.predicted_samples_per_s is not None for r in outcome.best_rows.values())
    for col in ("strategy", what, "depth", "samples/s") + (("predicted samples/s",) if predicted else ()) \
            + ("GFLOP/sample", "× fp32"):
        table.add_column(col)
    for strategy in outcome.maxima:
        row = outcome.best_rows.get(strategy)
        value, ratio = max_cells(outcome, strategy)
        rate = "-" if row is None or row.samples_per_s_median is None else f"{row.samples_per_s_median:.1f}"
        flops = "-" if row is None or row.flops_per_sample is None else f"{row.flops_per_sample / 1e9:.3f}"
        table.add_row(*(cell(c) for c in (strategy, value, str(row.depth) if row is not None and row.depth else "-",
                                           rate) + ((predicted_text(row),) if predicted else ()) + (flops, ratio)))
    table.caption = cell(maxima_caption(outcome) + (f"\n{PREDICTED_COLUMN_NOTE}" if predicted else ""))
    console().print(table)


def print_plan(run_dir: Path, lines: list[str]) -> None:
    """A dry run's plan: the run directory, then one line per planned point."""
    out = console()
    out.print(f"run directory: {run_dir}", markup=False, highlight=False)
    for line in lines:
        out.print(line, markup=False, highlight=False)


def render_memory(rows, title: str) -> None:
    """``memory``'s table: each point's bytes by what holds them."""
    from actbench.schema import format_bytes

    table = Table(title=cell(title))
    for col in ("strategy", "batch", "status", "activation", "peak alloc", "reserved", "params", "grads",
                "optimizer state", "model total", "host (swap)", "message"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(cell(c) for c in (series_name(r), str(r.batch_size), r.status, *(format_bytes(v) for v in (
            r.activation_bytes, r.peak_alloc_bytes, r.reserved_bytes, r.param_bytes, r.grad_bytes,
            r.optimizer_state_bytes, r.model_bytes, r.host_bytes)), one_line(r.message, 80))))
    console().print(table)


def render_plan(outcome, title: str, dim: str, counted_host: bool) -> None:
    """``plan``'s table: per strategy the predicted maximum, × fp32, the bytes at it and its probes."""
    from actbench.schema import format_bytes

    table = Table(title=cell(title))
    for col in ("strategy", f"max {dim}", "× fp32", "peak alloc", "reserved", "activation", "model bytes",
                "host" if counted_host else "host (not counted)", "probes", "note"):
        table.add_column(col)
    for strategy in outcome.maxima:
        row = outcome.best_rows.get(strategy)
        probes = [r for r in outcome.rows if r.strategy == strategy]
        note = "" if row is not None else next((r.message for r in probes if r.status == "error"),
                                               "nothing in the range fits")
        table.add_row(*(cell(c) for c in (
            strategy, *max_cells(outcome, strategy),
            *(format_bytes(None if row is None else getattr(row, f)) for f in
              ("peak_alloc_bytes", "reserved_bytes", "activation_bytes", "model_bytes", "host_bytes")),
            str(len(probes)), one_line(note, 80))))
    table.caption = cell(maxima_caption(outcome))
    console().print(table)
