"""torch.compile as a strategy (``compile``, ``compile@B``): the mechanics behind actbench/strategies/compile.py.

``compile`` is ``torch.compile`` with default settings — inductor, whose min-cut partitioner decides
which activations forward saves and which backward recomputes. ``compile@B`` sets the partitioner's
activation memory budget (``torch._functorch.config.activation_memory_budget = B``, 0 < B < 1): it
recomputes more so that saved activations stay near B × what the default would save.

Where memory comes from a caching allocator (cuda) the compiled kernels run and are measured. Where
the live-storage tracker counts storages (cpu, and meta's predictions), inductor's generated code
allocates its buffers outside the dispatcher, where no tracker can see them; there the graphs run
with ``compat.EAGER_PARTITIONED_BACKEND``: the same dynamo capture, AOT autograd, inductor's
decompositions and min-cut partitioner under the same budget — so the same tensors are saved for
backward — executed eagerly, op by op. Activation bytes are then the partition's; the peak lacks
inductor's fusion of temporaries (an upper bound), and cpu throughput is eager, not inductor's.

Graphs are static (``dynamic=False``), as the first compile of a fresh process is: each point on
cpu and cuda is one process and one batch size, while meta reuses one model over several batch sizes,
where the default would switch to a dynamic-shape graph after the second.
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
