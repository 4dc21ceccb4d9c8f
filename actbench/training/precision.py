"""Numeric precision of the training step: fp32, or autocast to bf16 / fp16 (docs/design.md §1).

``bf16`` and ``fp16`` run forward and loss under ``torch.autocast`` for the training device's type
(weights stay fp32; autocast casts them per op, so the saved activations of matmuls and convolutions
are 16-bit); ``fp16`` also scales the loss with a gradient scaler (``torch.amp.GradScaler``), as
fp16 training needs to keep small gradients representable. Precision is orthogonal to the strategy:
every strategy runs at every precision (ActNN compresses 16-bit activations with the same kernels).

On the meta device (fake tensors, no data) the scaler cannot read back whether a gradient was
infinite, so :class:`StaticLossScaler` does the same arithmetic — scale the loss, unscale the
gradients in place, step — without the check: the same tensors of the same sizes.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

from actbench.schema import DEFAULT_PRECISION, PRECISIONS

_AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str) -> str:
    """``precision`` if known; ValueError naming the choices otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision '{precision}': choose {', '.join(PRECISIONS)}")
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype autocast lowers matmuls and convolutions to; None for fp32 (no autocast)."""
    return _AUTOCAST_DTYPES.get(check_precision(precision))


def autocast(precision: str, device: torch.device) -> ContextManager[Any]:
    """Forward's autocast context for ``device``'s type (nothing for fp32)."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def uses_loss_scaling(precision: str) -> bool:
    return check_precision(precision) == "fp16"


class StaticLossScaler:
    """GradScaler's arithmetic without its data-dependent check: for fake tensors (meta)."""

    def __init__(self, init_scale: float = 2.0**16) -> None:
        self.scale_value = init_scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.scale_value)  # in place, as GradScaler.unscale_
        optimizer.step()

    def update(self) -> None:
        pass


def make_scaler(precision: str, device: torch.device, fake: bool) -> Any:
    """The gradient scaler of ``precision`` (None unless fp16); ``fake``: the model's tensors have no data."""
    if not uses_loss_scaling(precision):
        return None
    if fake:
        return StaticLossScaler()
    return torch.amp.GradScaler(device.type)


__all__ = ["DEFAULT_PRECISION", "PRECISIONS", "StaticLossScaler", "autocast", "autocast_dtype", "check_precision",
           "make_scaler", "uses_loss_scaling"]
