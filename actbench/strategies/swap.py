"""swap: saved tensors go to host memory in forward and come back in backward."""

from __future__ import annotations

import weakref
from typing import Any, Callable, ContextManager

from actbench.strategies.registry import HostScope, PreparedModel, Strategy, register


@register
class Swap(Strategy):
    name = "swap"
    description = "saved tensors copied to (pinned, on cuda) host memory in forward, back in backward"
    order = 10
    colour = "#8c564b"
    uses_host_memory = True

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        return PreparedModel(model=model, forward_context=_swap_context(model, device, host_scope))


def _swap_context(model: Any, device: Any, host_scope: HostScope) -> Callable[[], ContextManager[None]]:
    """Saved-tensor hooks that copy each saved tensor to a host buffer and back.

    Parameters stay put: they live on the device anyway, so copying them would only add traffic.
    A tensor saved by several ops in one forward (a block input read by conv1 and the downsample
    conv) is copied once: the cache matches storage, view geometry and version counter, and holds
    only a weak reference so a freed storage whose address is reused can never match.
    On a CPU device the copy still happens, into a buffer the tracker files as host memory, and
    backward copies it back, so the CPU run exercises the same logic as the GPU.
    """
    import torch

    from actbench.core.compat import storage_identity, tensor_version
    from actbench.core.devices import profile_of

    param_ptrs = frozenset(storage_identity(p) for p in model.parameters())  # fake tensors all have data_ptr 0
    pin = profile_of(device).pins_host_memory

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        dev, buf = packed
        if dev == buf.device:
            return buf.clone()  # the "copy back to the device" of a CPU run
        return buf.to(dev, non_blocking=True)

    def hooks() -> ContextManager[None]:
        cache: dict[tuple, tuple[weakref.ref, tuple[torch.device, torch.Tensor]]] = {}

        def pack(t: torch.Tensor) -> Any:
            # Compare device types: one training device per process, and "cuda" vs "cuda:0" must match.
            if t.numel() == 0 or t.device.type != device.type or storage_identity(t) in param_ptrs:
                return t
            storage = t.untyped_storage()
            key = (id(storage), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, tensor_version(t))
            hit = cache.get(key)
            if hit is not None and hit[0]() is storage:
                return hit[1]
            with host_scope():
                buf = torch.empty_like(t, device="cpu", pin_memory=pin)
                buf.copy_(t, non_blocking=pin)
            packed = (t.device, buf)
            cache[key] = (weakref.ref(storage), packed)
            return packed

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    return hooks
