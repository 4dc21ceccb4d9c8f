"""Selective activation checkpointing (``sac``): keep what is expensive to recompute, recompute the rest.

Segments are cut as for ``checkpoint``, and each runs under
``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with :func:`policy`: the outputs of
convolutions, matrix products and fused attention are kept, every other op is recomputed. What that
costs and why gradients stay exact: docs/design.md §1.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from actbench.core import compat
from actbench.strategies.mechanics.checkpointing import apply_checkpointing

_aten = torch.ops.aten


def _overloads(*packets) -> frozenset:
    """Every overload of each op packet that this torch build has (attention kernels vary by build)."""
    found = set()
    for packet in packets:
        for name in packet.overloads():
            found.add(getattr(packet, name))
    return frozenset(found)


#: Ops whose outputs sac keeps: convolutions, matrix products, fused attention.
SAVED_OPS: frozenset = _overloads(
    _aten.convolution, _aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, *compat.internal_compute_ops(),
)


def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Keep the outputs of :data:`SAVED_OPS`; recompute every other op."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def context_fn():
    """The per-segment contexts ``checkpoint(..., context_fn=...)`` asks for."""
    return create_selective_checkpoint_contexts(policy)


def apply_selective_checkpointing(model: nn.Module, segments: int | None) -> int:
    """Wrap the model's blocks in selective checkpoint segments; return the number of segments made."""
    return apply_checkpointing(model, segments, context_fn=functools.partial(context_fn))


__all__ = ["SAVED_OPS", "apply_selective_checkpointing", "context_fn", "policy"]
