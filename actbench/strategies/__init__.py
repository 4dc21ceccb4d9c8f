"""Memory-saving strategies, one module each, behind one registry (docs/design.md §7).

``get("swap").prepare(model, device, options, host_scope)`` turns a model into one ready to train
with that strategy. A name may carry a parameter, ``NAME@VALUE`` (``compile@0.5``: the strategy's
``parameter`` says what it sets), or combine a strategy with an ActNN level, ``WRAPPER+LEVEL``
(``checkpoint+L2``; the allowed pairs and why the others are refused: ``combined.py``). Everything
else here answers questions about strategies without torch: their names (:func:`names`), table order (:func:`rank`), colours, descriptions and allocator settings.
The registry is filled once, when this package is imported, by importing every module in it.
"""

from __future__ import annotations

import importlib
import pkgutil

from actbench.schema import BASELINE, LEVEL_NAMES, PRECISIONS
from actbench.strategies.registry import (HostScope, PreparedModel, Strategy, StrategyOptions, add, register,
                                          registered)

for _module in pkgutil.iter_modules(__path__):
    if not _module.ispkg and _module.name not in ("registry", "combined"):
        importlib.import_module(f"{__name__}.{_module.name}")

#: Every strategy name, in table order (fp32, swap, checkpoint, L0..L5, then any newer ones).
ALL_STRATEGIES: tuple[str, ...] = tuple(registered())
#: Strategies that are not ActNN levels.
PLAIN_STRATEGIES: tuple[str, ...] = tuple(n for n, s in registered().items() if not s.is_actnn_level)
FALLBACK_COLOUR = "#999999"


def get(name: str) -> Strategy:
    """The strategy called ``name`` (``NAME``, ``NAME@VALUE`` or ``WRAPPER+LEVEL``); ValueError in one line."""
    if "+" in name:
        from actbench.strategies.combined import combine

        return combine(name, get)
    base, has_value, value = name.partition("@")
    try:
        strategy = registered()[base]
    except KeyError:
        hint = f" ({name} is a precision: --precision {name})" if name in PRECISIONS else ""
        raise ValueError(f"unknown strategy '{name}'{hint}; known: {', '.join(ALL_STRATEGIES)}") from None
    return strategy.with_parameter(value) if has_value else strategy


def _lookup(name: str) -> Strategy | None:
    """The strategy called ``name``, or None for a name no strategy answers to (old runs)."""
    try:
        return get(name)
    except ValueError:
        return None


def canonical(name: str) -> str:
    """The one spelling of a strategy name (``compile@0.50`` -> ``compile@0.5``, ``l2+checkpoint`` ->
    ``checkpoint+L2``): what points and rows record. ValueError for a name no strategy answers to."""
    return get(name).name


def rank(name: str) -> tuple[float, str]:
    """Sort key for tables and legends: registry order, then unknown names (old runs) by name."""
    strategy = _lookup(name)
    return (strategy.order, name) if strategy is not None else (10**6, name)


def colour(name: str) -> str:
    strategy = _lookup(name)
    return strategy.colour if strategy is not None else FALLBACK_COLOUR


def cuda_alloc_conf(name: str) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF a strategy's child process starts with (L5: expandable segments)."""
    return get(name).cuda_alloc_conf


def is_actnn_level(name: str) -> bool:
    strategy = _lookup(name)
    return strategy is not None and strategy.is_actnn_level


def help_text() -> str:
    """One line per strategy, for --help."""
    lines = [f"{name}: {s.description}" for name, s in registered().items()]
    from actbench.strategies.combined import allowed_text

    lines.append(f"WRAPPER+LEVEL: an ActNN level inside another strategy; allowed: {allowed_text()}")
    return "\n".join(lines)


def markdown_table() -> str:
    """The strategy table of results/README.md (a test keeps the file equal to this)."""
    lines = ["| strategy | what it keeps for backward | host memory |", "|---|---|---|"]
    lines += [f"| `{name}` | {s.description} | {'yes' if s.uses_host_memory else '-'} |"
              for name, s in registered().items()]
    return "\n".join(lines)


__all__ = [
    "ALL_STRATEGIES", "BASELINE", "HostScope", "LEVEL_NAMES", "PLAIN_STRATEGIES", "PreparedModel", "Strategy",
    "StrategyOptions", "add", "canonical", "colour", "cuda_alloc_conf", "get", "help_text", "is_actnn_level", "markdown_table",
    "rank",
    "register", "registered",
]
