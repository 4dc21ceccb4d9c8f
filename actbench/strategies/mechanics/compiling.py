"""torch.compile as a strategy (``compile``, ``compile@B``): the mechanics behind actbench/strategies/compile.py.

On cuda the compiled kernels run. Where the live-storage tracker counts storages (cpu, meta),
inductor's buffers are invisible to it, so the graphs run eagerly with the same capture and min-cut
partition, and save the same tensors. Graphs are static. Why, and what that means for the numbers:
docs/design.md §1.
"""

from __future__ import annotations

import torch
from torch import nn

from actbench.core import compat
from actbench.core.devices import profile_of


def compile_backend(device: torch.device) -> str:
    """inductor where the allocator measures (cuda); the eager-partitioned stand-in where a tracker does."""
    return "inductor" if profile_of(device).has_caching_allocator else compat.EAGER_PARTITIONED_BACKEND


def compile_model(model: nn.Module, device: torch.device) -> tuple[nn.Module, str]:
    """``torch.compile(model)`` with nothing from an earlier point of this process reused; (module, backend)."""
    compat.reset_compiler()
    backend = compile_backend(device)
    return torch.compile(model, backend=backend, dynamic=False), backend


__all__ = ["compile_backend", "compile_model"]
