"""save_on_cpu: PyTorch's own offload, ``torch.autograd.graph.save_on_cpu`` (pinned host memory on cuda).

Unlike ``swap`` (actbench's hooks), torch's copies every saved tensor, parameters and repeats included,
and copies back synchronously on use in backward.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

from actbench.strategies.registry import HostScope, PreparedModel, Strategy, register


@register
class SaveOnCpu(Strategy):
    name = "save_on_cpu"
    description = ("torch.autograd.graph.save_on_cpu: every saved tensor copied to (pinned, on cuda) host memory "
                   "in forward, back in backward (torch's built-in offload; parameters and repeats copied too)")
    order = 210
    colour = "#c49c94"
    uses_host_memory = True

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        return PreparedModel(model=model, forward_context=_save_on_cpu_context(device, host_scope),
                             note="torch.autograd.graph.save_on_cpu")


def _save_on_cpu_context(device: Any, host_scope: HostScope) -> Callable[[], ContextManager[None]]:
    """torch's ``save_on_cpu(pin_memory=True)`` where the device pins host copies (cuda).

    Where it does not (cpu, meta), torch's unpinned path is ``tensor.cpu()``, which on a CPU device
    is the tensor itself: nothing would move and nothing could be measured. There the hooks make the
    copy torch's pinned path makes — a fresh host buffer of the same size, ``copy_`` into it — only
    unpinned, and backward gets a copy back, so a CPU run (and a meta prediction) shows what a GPU
    keeps in host memory and holds on the device in backward. Either way the host buffers are created
    inside ``host_scope``, which the cpu tracker files as host memory.
    """
    import torch

    from actbench.core.devices import profile_of

    pin = profile_of(device).pins_host_memory

    def copy_to_host(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout)
        packed.copy_(tensor)
        return tensor.device, packed

    def back_to_device(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        dev, tensor = packed
        # On a CPU device ``.to`` would hand backward the host buffer itself; a GPU gets a device copy,
        # so the copy is made here too and backward's device bytes are a GPU's (as swap does).
        return tensor.clone() if tensor.device == dev else tensor.to(dev)

    def hooks() -> ContextManager[None]:
        if pin:
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
        else:
            ctx = torch.autograd.graph.saved_tensors_hooks(copy_to_host, back_to_device)
        inner = ctx.pack_hook

        def pack(tensor: torch.Tensor) -> Any:
            with host_scope():
                return inner(tensor)

        ctx.pack_hook = pack
        return ctx

    return hooks
