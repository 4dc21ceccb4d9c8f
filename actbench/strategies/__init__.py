"""Memory-saving strategies, one module each, behind one registry (docs/design.md §7).

``get("swap").prepare(model, device, options, host_scope)`` turns a model into one ready to train
with that strategy; everything else here answers questions about strategies without torch: their
names (:func:`names`), table order (:func:`rank`), colours, descriptions and allocator settings.
The registry is filled once, when this package is imported, by importing every module in it.
"""

from __future__ import annotations

import importlib
import pkgutil

from actbench.schema import BASELINE, LEVEL_NAMES
from actbench.strategies.registry import (HostScope, PreparedModel, Strategy, StrategyOptions, add, register,
                                          registered)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

#: Every strategy name, in table order (fp32, swap, checkpoint, L0..L5, then any newer ones).
ALL_STRATEGIES: tuple[str, ...] = tuple(registered())
#: Strategies that are not ActNN levels.
PLAIN_STRATEGIES: tuple[str, ...] = tuple(n for n, s in registered().items() if not s.is_actnn_level)
FALLBACK_COLOUR = "#999999"


def get(name: str) -> Strategy:
    """The strategy called ``name``; ValueError naming the known ones."""
    try:
        return registered()[name]
    except KeyError:
        raise ValueError(f"unknown strategy '{name}'; known: {', '.join(ALL_STRATEGIES)}") from None


def rank(name: str) -> tuple[int, str]:
    """Sort key for tables and legends: registry order, then unknown names (old runs) by name."""
    strategy = registered().get(name)
    return (strategy.order, "") if strategy is not None else (10**6, name)


def colour(name: str) -> str:
    strategy = registered().get(name)
    return strategy.colour if strategy is not None else FALLBACK_COLOUR


def cuda_alloc_conf(name: str) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF a strategy's child process starts with (L5: expandable segments)."""
    return get(name).cuda_alloc_conf


def is_actnn_level(name: str) -> bool:
    strategy = registered().get(name)
    return strategy is not None and strategy.is_actnn_level


def help_text() -> str:
    """One line per strategy, for --help."""
    return "\n".join(f"{name}: {s.description}" for name, s in registered().items())


def markdown_table() -> str:
    """The strategy table of results/README.md (a test keeps the file equal to this)."""
    lines = ["| strategy | what it keeps for backward | host memory |", "|---|---|---|"]
    lines += [f"| `{name}` | {s.description} | {'yes' if s.uses_host_memory else '-'} |"
              for name, s in registered().items()]
    return "\n".join(lines)


__all__ = [
    "ALL_STRATEGIES", "BASELINE", "HostScope", "LEVEL_NAMES", "PLAIN_STRATEGIES", "PreparedModel", "Strategy",
    "StrategyOptions", "add", "colour", "cuda_alloc_conf", "get", "help_text", "is_actnn_level", "markdown_table",
    "rank",
    "register", "registered",
]
