"""Two strategies in one step, spelled ``WRAPPER+LEVEL`` (e.g. ``checkpoint+L2``), and the pairs refused.

Precision is not a strategy: every strategy runs at every precision (``--precision``). Between
strategies, one pair is meaningful and works, and is allowed:

- ``checkpoint+L0``, ``checkpoint+L1``, ``checkpoint+L2``: an ActNN level inside checkpointed segments.
  Forward keeps each segment's input as checkpoint does (full precision); backward recomputes one
  segment at a time with ActNN's layers, so the recomputed activations are compressed.

Every other pair is refused with one line saying why and what to use instead (:data:`REFUSED`,
:func:`why_not`), before anything is measured.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator

from actbench.schema import LEVEL_NAMES
from actbench.strategies.registry import PreparedModel, Strategy

#: wrapper -> the ActNN levels it may wrap
ALLOWED: dict[str, tuple[str, ...]] = {"checkpoint": ("L0", "L1", "L2")}

_MIXED = ("L3", "L4", "L5")
#: (wrapper, level or None for any) -> why the pair is refused and what to use instead
REFUSED: dict[tuple[str, str | None], str] = {
    ("checkpoint", None): ("L3-L5 allocate bits from per-step statistics, so a segment's recompute packs another size "
                           "than its forward and checkpoint's metadata check fails; use checkpoint+L2, or L3 alone"),
    ("sac", None): ("sac keeps conv/matmul outputs uncompressed and ActNN's L3-L5 recompute differently in backward; "
                    "use sac or an ActNN level alone, or checkpoint+L0..L2"),
    ("compile", None): ("dynamo breaks the graph at every ActNN layer (its controller keeps Python state per step), "
                        "so nothing would be compiled; use compile or an ActNN level alone"),
    ("swap", None): "ActNN with offload is L4 (packed codes to host); use L4",
    ("save_on_cpu", None): "ActNN with offload is L4 (packed codes to host); use L4",
}


def why_not(wrapper: str, level: str) -> str | None:
    """Why ``wrapper+level`` is refused (one clause), or None if it is allowed."""
    if level in ALLOWED.get(wrapper, ()):
        return None
    return REFUSED.get((wrapper, level)) or REFUSED.get((wrapper, None)) or "no combination with it is supported"


class Combined(Strategy):
    """An ActNN level converted first, then the wrapper applied to the converted model."""

    def __init__(self, wrapper: Strategy, level: Strategy) -> None:
        self.wrapper, self.level = wrapper, level
        self.name = f"{wrapper.name}+{level.name}"
        self.description = f"{wrapper.name} over ActNN {level.name}: {level.description}"
        self.order = wrapper.order + (LEVEL_NAMES.index(level.name) + 1) / 10
        self.colour = level.colour
        self.uses_host_memory = wrapper.uses_host_memory or level.uses_host_memory
        self.cuda_alloc_conf = level.cuda_alloc_conf
        self.not_on_meta = wrapper.not_on_meta or level.not_on_meta

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        inner = self.level.prepare(model, device, options, host_scope)
        outer = self.wrapper.prepare(inner.model, device, options, host_scope)
        note = "; ".join(n for n in (inner.note, outer.note) if n)
        return PreparedModel(model=outer.model, forward_context=_nested(inner.forward_context, outer.forward_context),
                             note=note or None)


def _nested(inner: Callable[[], ContextManager[None]], outer: Callable[[], ContextManager[None]]
            ) -> Callable[[], ContextManager[None]]:
    """A step's context that enters the level's (its loss scope), then the wrapper's."""
    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with inner(), outer():
            yield
    return both


def combine(name: str, lookup) -> Combined:
    """``WRAPPER+LEVEL`` -> the combined strategy; ValueError with one line for anything refused."""
    parts = [p.strip() for p in name.split("+")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"bad strategy '{name}': combine two strategies as WRAPPER+LEVEL, e.g. checkpoint+L2")
    a, b = (p.upper() if p.upper() in LEVEL_NAMES else p for p in parts)
    levels = [p for p in (a, b) if p in LEVEL_NAMES]
    if len(levels) != 1:
        raise ValueError(f"strategy '{name}' is refused: a combination is one strategy and one ActNN level "
                         f"(WRAPPER+LEVEL, e.g. checkpoint+L2); allowed: {allowed_text()}")
    level = levels[0]
    wrapper_name = b if a == level else a
    wrapper = lookup(wrapper_name)
    reason = why_not(wrapper.name.partition("@")[0], level)
    if reason is not None:
        raise ValueError(f"strategy '{name}' is refused: {reason} (allowed combinations: {allowed_text()})")
    return Combined(wrapper, lookup(level))


def allowed_text() -> str:
    return ", ".join(f"{w}+{lv}" for w, levels in ALLOWED.items() for lv in levels)


__all__ = ["ALLOWED", "Combined", "REFUSED", "allowed_text", "combine", "why_not"]
