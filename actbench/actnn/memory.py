"""What a model keeps for backward, measured: one forward under saved-tensor hooks.

Every tensor autograd saves passes through ``torch.autograd.graph.saved_tensors_hooks``; we note
its storage (deduplicated: a ReLU output that the next conv also saves counts once), the module
whose forward was running, and the torch function that saved it (a ``TorchFunctionMode`` keeps the
outermost call), so the report can name ``F.relu`` in ``DenseNet.forward``. Parameters and buffers
are model state, not activations, and are left out. Bytes are storage bytes at the end of forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from actbench.actnn.layers import ActNNModule

PACKED_DTYPES = (torch.uint8, torch.int8, torch.bfloat16)


@dataclass(frozen=True)
class SavedGroup:
    """Saved tensors of one owner: ``category`` is one of

    ``compressed`` (an ActNN layer's packed state), ``layer statistics`` (BatchNorm's
    per-channel mean and 1/std, tiny), ``full precision by level`` (an ActNN layer
    told to keep fp32, e.g. L0), ``unconverted module`` (a leaf module actbench does not convert: unsupported, or the model is not converted),
    ``functional`` (a torch call inside a container's forward: F.relu, torch.cat, ...).
    """

    owner: str  # module qualname
    owner_type: str
    saved_by: str  # torch function that saved (outermost), or the ActNN layer type
    category: str
    nbytes: int
    count: int
    device: str = "cpu"  # where the storages live (L4/L5 on CUDA: "cpu", the pinned host copies)


@dataclass(frozen=True)
class SavedCensus:
    """All activation storages kept for backward after one forward."""

    groups: tuple[SavedGroup, ...]

    @property
    def total_bytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    def bytes_by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.category] = out.get(g.category, 0) + g.nbytes
        return out

    def bytes_by_device(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.device] = out.get(g.device, 0) + g.nbytes
        return out

    @property
    def uncompressed(self) -> tuple[SavedGroup, ...]:
        return tuple(g for g in self.groups if g.category not in ("compressed", "layer statistics"))


class _OuterCall(TorchFunctionMode):
    """Remembers the outermost torch function running (inner calls run with the mode off)."""

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        outer, self.current = self.current, getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.current = outer


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (str(t.device), s.data_ptr())


def saved_tensor_census(model: nn.Module, example_input: torch.Tensor | tuple) -> SavedCensus:
    """Run one training-mode forward of ``model`` and classify every saved activation storage.

    The model's mode is restored afterwards; BatchNorm running statistics are restored too, so a
    census does not change the model.
    """
    names = {m: n or type(model).__name__ for n, m in model.named_modules()}
    state_ptrs = {_storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    buffers = [b.detach().clone() for b in model.buffers()]
    stack: list[nn.Module] = []
    seen: set[tuple[str, int]] = set()
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    meta: dict[tuple[str, str, str, str], tuple[str, str]] = {}
    calls = _OuterCall()

    def pre(module, args):
        stack.append(module)

    def post(module, args, output):
        if stack and stack[-1] is module:
            stack.pop()

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key is None or key in state_ptrs or key in seen:
            return t
        seen.add(key)
        owner = stack[-1] if stack else model
        if isinstance(owner, ActNNModule):
            saved_by = type(owner).__name__
            if t.dtype in PACKED_DTYPES:
                category = "compressed"
            elif t.dim() <= 1:
                category = "layer statistics"  # BatchNorm's per-channel mean and 1/std
            else:
                category = "full precision by level"
        elif not any(True for _ in owner.children()):
            saved_by = calls.current or "?"
            category = "unconverted module"
        else:
            saved_by = calls.current or "?"
            category = "functional"
        gkey = (names.get(owner, "?"), saved_by, category, t.device.type)
        groups.setdefault(gkey, []).append(t.untyped_storage().nbytes())
        meta[gkey] = (type(owner).__name__, saved_by)
        return t

    was_training = model.training
    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    model.train()
    try:
        args = example_input if isinstance(example_input, tuple) else (example_input,)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), calls:
            out = model(*args)
        del out
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
        with torch.no_grad():
            for b, saved in zip(model.buffers(), buffers):
                b.copy_(saved)
    result = tuple(
        SavedGroup(key[0], meta[key][0], key[1], key[2], sum(sizes), len(sizes), key[3])
        for key, sizes in groups.items()
    )
    return SavedCensus(result)


def saved_bytes(model: nn.Module, batch: torch.Tensor | tuple) -> int:
    """Activation bytes kept for backward at the end of one training forward (deduplicated storages)."""
    return saved_tensor_census(model, batch).total_bytes
