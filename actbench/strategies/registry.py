"""The strategy registry: each memory-saving strategy is one class, registered by name (docs/design.md §7).

A strategy declares what the rest of actbench needs to know about it — a one-line description, its
place and colour in tables and figures, whether it runs on the meta device, whether it moves saved
tensors to host memory, which allocator configuration its child process needs — and how it prepares
a model for training. The CLI's choices and help, the order of tables, the legends of figures and
``results/README.md``'s list all read this registry. Declarations import no torch, so reading or
plotting results stays light; :meth:`Strategy.prepare` imports what it needs when called.

To add a strategy, add one module to this package defining a subclass with ``@register``; the
package imports every module in it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager

if TYPE_CHECKING:
    import torch
    from torch import nn

#: A context under which host copies are made (the cpu tracker files their storages as host memory).
HostScope = Callable[[], ContextManager[None]]


@dataclass(frozen=True)
class StrategyOptions:
    """Knobs of the strategies. ``checkpoint_segments=None`` checkpoints every block separately."""

    checkpoint_segments: int | None = None
    lr: float = 0.1
    momentum: float = 0.9


@dataclass
class PreparedModel:
    """A model ready to train, the context its forward runs under, and a note for the result row."""

    model: "nn.Module"
    forward_context: Callable[[], ContextManager[None]] = contextlib.nullcontext
    note: str | None = None


class Strategy:
    """One way to train with less memory. Subclasses set the class attributes and :meth:`prepare`."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: position in tables and legends (fp32 first); ties are broken by name
    order: ClassVar[int]
    colour: ClassVar[str]
    #: an ActNN level (compresses saved activations with the extension)
    is_actnn_level: ClassVar[bool] = False
    #: moves saved tensors to host memory (its rows fill ``host_bytes``)
    uses_host_memory: ClassVar[bool] = False
    #: PYTORCH_CUDA_ALLOC_CONF its child process starts with (set before CUDA initialises)
    cuda_alloc_conf: ClassVar[str | None] = None
    #: on meta, a strategy whose step is identical (the allocator setting is all that differs)
    same_on_meta_as: ClassVar[str | None] = None
    #: why this strategy cannot be predicted on fake tensors (None: it can); said before measuring
    not_on_meta: ClassVar[str | None] = None
    #: what ``NAME@VALUE`` sets, for a strategy that takes a parameter (``compile@0.5``); None: none
    parameter: ClassVar[str | None] = None

    @property
    def overlaps_host_copies(self) -> bool:
        """Its host copies run on a side stream where the device has one (ActNN's offloading levels)."""
        return self.is_actnn_level and self.uses_host_memory

    @property
    def copies_from_a_hook(self) -> bool:
        """Its saved tensors go to the host from a saved-tensor hook of its own (swap, save_on_cpu), whose
        Python runs once per copy; ActNN's offloading levels copy from their layers, priced as layers."""
        return self.uses_host_memory and not self.is_actnn_level

    def with_parameter(self, value: str) -> "Strategy":
        """This strategy with its parameter set from ``NAME@VALUE``; ValueError (one line) if it takes none."""
        raise ValueError(f"strategy '{self.name}' takes no parameter, got '{self.name}@{value}'")

    def prepare(self, model: "nn.Module", device: "torch.device", options: StrategyOptions,
                host_scope: HostScope) -> PreparedModel:
        """``model`` ready to train with this strategy. The model is handed over: it was built for
        this point and the caller keeps no reference, so a strategy changes it in place rather than
        copying it (a copy's original would be a second set of parameters on the device)."""
        raise NotImplementedError(f"strategy '{self.name}' does not say how to prepare a model")


_REGISTRY: dict[str, Strategy] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make ``cls`` (one instance per name) known by its ``name``."""
    instance = cls()
    if instance.name in _REGISTRY:
        raise ValueError(f"strategy '{instance.name}' is registered twice")
    _REGISTRY[instance.name] = instance
    return cls


def add(instance: Strategy) -> Strategy:
    """Register an instance (a class that stands for several named strategies, like the levels)."""
    if instance.name in _REGISTRY:
        raise ValueError(f"strategy '{instance.name}' is registered twice")
    _REGISTRY[instance.name] = instance
    return instance


def registered() -> dict[str, Strategy]:
    """Every strategy by name, in table order."""
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (kv[1].order, kv[0])))
