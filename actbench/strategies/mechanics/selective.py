"""Selective activation checkpointing (``sac``): keep what is expensive to recompute, recompute the rest.

The model's blocks are found and cut into segments exactly as for ``checkpoint``
(:func:`actbench.strategies.mechanics.checkpointing.apply_checkpointing`, one segment per block by default); each
segment runs under ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with
:func:`policy`, the policy large training stacks use:

- **kept** (``MUST_SAVE``): the outputs of convolutions, matrix products (``mm``, ``addmm``, ``bmm``,
  ``baddbmm``) and fused attention kernels — the ops whose recomputation costs FLOPs;
- **recomputed** (``PREFER_RECOMPUTE``): everything else — BatchNorm, LayerNorm, activations, adds,
  pooling, dropout (with the RNG state checkpoint preserves), dtype casts and views.

Memory therefore lies between ``checkpoint`` (only segment inputs kept) and ``fp32`` (every saved
tensor kept), and backward recomputes only cheap pointwise and normalisation ops. Gradients are
those of fp32 training exactly: recomputation replays the same ops on the same inputs.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from actbench.strategies.mechanics.checkpointing import apply_checkpointing

_aten = torch.ops.aten


def _overloads(*packets) -> frozenset:
    """Every overload of each op packet that this torch build has (attention kernels vary by build)."""
    found = set()
    for packet in packets:
        for name in packet.overloads():
            found.add(getattr(packet, name))
    return frozenset(found)


def _optional_packets(*names: str) -> list:
    return [getattr(_aten, n) for n in names if hasattr(_aten, n)]


#: Ops whose outputs sac keeps: convolutions, matrix products, fused attention.
SAVED_OPS: frozenset = _overloads(
    _aten.convolution, _aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm,
    *_optional_packets("_convolution", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_cudnn_attention"),
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
