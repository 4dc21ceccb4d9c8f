"""How figures look: one colour per strategy, predicted series hollow and dashed, bars hatched.

Shared by every figure module (:mod:`actbench.reporting.plots`, :mod:`actbench.reporting.throughput_figure`),
so a strategy has one colour and a prediction one look wherever it is drawn.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from actbench.reporting.analysis import Series
from actbench.strategies import colour as strategy_colour
from actbench.strategies import registered

#: One colour per strategy (from the registry), and the paper's own baselines (overlay only).
PALETTE: Mapping[str, str] = MappingProxyType({
    **{name: s.colour for name, s in registered().items()},
    "dtr": "#7f7f7f", "cap": "#aec7e8", "blpa": "#c5b0d5",
})
FAIL_COLOUR = "red"
FAIL_MARKER = "x"
PREDICTED_HATCH = "//"
FP32_SHADE = "#dddddd"
FORMATS = ("png", "pdf")
GIB = 1 << 30
MIB = 1 << 20


def colour(strategy: str) -> str:
    # parameterised and combined names (compile@0.5, checkpoint+L2) take the registry's answer
    return PALETTE.get(strategy) or PALETTE.get(strategy.lower()) or strategy_colour(strategy)


def new_figure(width: float = 7.0, height: float = 4.5) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


#: Away from fp32 a series keeps its strategy's colour and is told apart by marker and hatch.
PRECISION_MARKERS: Mapping[str, str] = MappingProxyType({"bf16": "^", "fp16": "v"})
PRECISION_HATCH = ".."


def line_style(series: Series) -> dict:
    c = colour(series.strategy)
    style = dict(color=c, marker=PRECISION_MARKERS.get(series.precision, "o"), markersize=5, linewidth=1.5)
    if series.predicted:
        style.update(markerfacecolor="none", linestyle="--")
    if not series.paper_comparable:
        style.update(linewidth=1.0)
    return style


def bar_style(series: Series) -> dict:
    c = colour(series.strategy)
    if series.predicted:
        hatch = PREDICTED_HATCH + ("" if series.paper_comparable else PRECISION_HATCH)
        return dict(facecolor="none", edgecolor=c, hatch=hatch, linewidth=1.2)
    if not series.paper_comparable:
        return dict(color=c, edgecolor="black", hatch=PRECISION_HATCH, alpha=0.75)
    return dict(color=c, edgecolor=c)


def memory_unit(values: Iterable[int | None]) -> tuple[int, str]:
    """GiB unless every value is below 1 GiB (then MiB, so small cpu runs stay readable)."""
    vals = [v for v in values if v is not None]
    return (GIB, "GiB") if vals and max(vals) >= GIB else (MIB, "MiB")
