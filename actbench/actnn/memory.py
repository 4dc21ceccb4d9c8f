"""What a model keeps for backward, measured: one forward under saved-tensor hooks.

The saved-tensor census: each saved storage once, with the module and the torch function that saved
it and, for a converted model, what its packer did with it, so a report can say what stays
uncompressed and why. It works on fake tensors too, so meta points carry it. Details:
docs/design.md §3 ("What stays uncompressed").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from actbench.core import compat
from actbench.actnn import hooks
from actbench.actnn.controller import ROLE_COMPRESSED, ROLE_STATISTICS, saved_role
from actbench.actnn.layers import ActNNModule

PACKED_DTYPES = (torch.uint8, torch.int8, torch.bfloat16)

#: Categories of saved bytes that are not activations left uncompressed.
COMPRESSED_CATEGORIES = (ROLE_COMPRESSED, ROLE_STATISTICS)

#: A tensor the hook path left as it is, by the hook's reason -> census category.
_SKIP_CATEGORY = {
    hooks.SKIP_NOT_FLOATING: "integer or bool",
    hooks.SKIP_DTYPE: "not packable dtype",
    hooks.SKIP_SMALL: "small",
    hooks.SKIP_LEVEL: "full precision by level",
    hooks.SKIP_POSITION: "positions: kept exact",
}


@dataclass(frozen=True)
class SavedGroup:
    """Saved tensors of one owner: ``category`` is one of

    ``compressed`` (an ActNN layer's packed state, or a tensor the saved-tensor hook path packed:
    ``saved_by`` then starts with ``hook:``), ``layer statistics`` (BatchNorm's per-channel and
    LayerNorm's per-token 1/std, tiny), ``full precision by level`` (an ActNN layer or the hook
    path told to keep full precision, e.g. L0), ``integer or bool`` (indices, boolean masks: never
    quantized), ``positions: kept exact`` (boxes, sampling grids and offsets that an op reads as
    coordinates, never quantized: ``positions.py``), ``small`` (below ``LevelConfig.hook_min_elements``), ``not packable dtype``
    (float64), and, where no hook path runs (an unconverted model, or hooks off):
    ``unconverted module`` (a leaf module actbench does not convert) and ``functional`` (a torch
    call inside a container's forward: F.relu, torch.cat, ...).
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
        """Groups kept as they are (largest first): everything but compressed state and statistics."""
        left = [g for g in self.groups if g.category not in COMPRESSED_CATEGORIES]
        return tuple(sorted(left, key=lambda g: -g.nbytes))

    @property
    def uncompressed_bytes(self) -> int:
        return sum(g.nbytes for g in self.uncompressed)

    @property
    def uncompressed_share(self) -> float:
        """Uncompressed bytes over all saved bytes (0 when nothing is saved)."""
        total = self.total_bytes
        return self.uncompressed_bytes / total if total else 0.0

    def uncompressed_by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.uncompressed:
            out[g.category] = out.get(g.category, 0) + g.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def describe_uncompressed(self, top: int = 3) -> str:
        """One line: share of saved bytes left uncompressed, by category, and the largest owners."""
        total = self.total_bytes
        if not total:
            return "nothing saved"
        cats = ", ".join(f"{c} {b / total:.1%}" for c, b in self.uncompressed_by_category().items())
        head = f"uncompressed {self.uncompressed_share:.1%} of {total / 2**20:.1f} MiB saved"
        if not cats:
            return head
        owners = "; ".join(
            f"{g.owner} ({', '.join(x for x in (g.owner_type, g.saved_by, g.category) if x)}) {g.nbytes / total:.1%}"
            for g in self.uncompressed[:top])
        return f"{head} ({cats}); largest: {owners}"


class _OuterCall(TorchFunctionMode):
    """Remembers the outermost torch function running (inner calls run with the mode off)."""

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        outer, self.current = self.current, compat.callable_name(func)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.current = outer


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    try:
        return (str(t.device), compat.storage_identity(t))
    except (RuntimeError, NotImplementedError):
        return None


class _Census:
    """The running state of one census forward: the module stack, storages seen, groups of bytes."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names = {m: n or type(model).__name__ for n, m in model.named_modules()}
        self.state_keys = {_storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
        self.stack: list[nn.Module] = []
        self.seen: set[tuple[str, int]] = set()
        self.groups: dict[tuple[str, str, str, str], list[int]] = {}
        self.owner_types: dict[tuple[str, str, str, str], str] = {}
        self.calls = _OuterCall()
        self.packer = hooks.packer_of(model)

    def pre(self, module: nn.Module, args) -> None:
        self.stack.append(module)

    def post(self, module: nn.Module, args, output) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    @property
    def owner(self) -> nn.Module:
        return self.stack[-1] if self.stack else self.model

    def record(self, t: torch.Tensor, owner: nn.Module, saved_by: str, category: str) -> None:
        key = _storage_key(t)
        if key is None or key in self.state_keys or key in self.seen:
            return
        self.seen.add(key)
        gkey = (self.names.get(owner, "?"), saved_by, category, t.device.type)
        self.groups.setdefault(gkey, []).append(t.untyped_storage().nbytes())
        self.owner_types[gkey] = type(owner).__name__

    def classify(self, t: torch.Tensor) -> None:
        """A tensor saved outside any ActNN hook path (an unconverted model, or hooks off)."""
        owner, role = self.owner, saved_role(t)
        if role is not None and not isinstance(owner, ActNNModule):  # a functional call rerouted to a twin
            routed = self.packer.routing if self.packer is not None else None
            self.record(t, owner, f"twin: {routed or self.calls.current or '?'}", role)
            return
        if isinstance(owner, ActNNModule):
            self.record(t, owner, type(owner).__name__, _twin_category(t, role))
            return
        leaf = not any(True for _ in owner.children())
        self.record(t, owner, self.calls.current or "?", "unconverted module" if leaf else "functional")

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """Keeps a detached alias: an op's own output returned as it is would hold its graph, and the
        graph the tensor, in a cycle the collector cannot see (each census kept its forward alive)."""
        self.classify(t)
        return t.detach()

    def observe(self, t: torch.Tensor, packed, reason: str | None, owner_name: str) -> None:
        """The packer's report of one saved tensor (a converted model's own hooks)."""
        owner, saved_by = self.owner, f"hook: {self.calls.current or '?'}"
        if packed is not None:
            for p in packed.tensors:
                self.record(p, owner, saved_by, ROLE_COMPRESSED)
        elif reason == hooks.SKIP_TWIN:
            self.classify(t)
        elif reason != hooks.SKIP_STATE:
            self.record(t, owner, saved_by, _SKIP_CATEGORY.get(reason, reason))

    def result(self) -> SavedCensus:
        return SavedCensus(tuple(
            SavedGroup(key[0], self.owner_types[key], key[1], key[2], sum(sizes), len(sizes), key[3])
            for key, sizes in self.groups.items()))


def _twin_category(t: torch.Tensor, role: str | None) -> str:
    """What a tensor an ActNN twin keeps is: its marked role, else read off its dtype and rank."""
    if role is not None:
        return role
    if t.dtype in PACKED_DTYPES:
        return "compressed"
    return "layer statistics" if t.dim() <= 1 else "full precision by level"


def saved_tensor_census(model: nn.Module, example_input: torch.Tensor | tuple) -> SavedCensus:
    """Run one training-mode forward of ``model`` and classify every saved activation storage.

    The model's mode is restored afterwards; BatchNorm running statistics are restored too, so a
    census does not change the model.
    """
    census = _Census(model)
    buffers = [b.detach().clone() for b in model.buffers()]
    was_training = model.training
    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(census.pre))
        handles.append(m.register_forward_hook(census.post))
    if census.packer is not None:
        census.packer.observer = census.observe
    model.train()
    try:
        args = example_input if isinstance(example_input, tuple) else (example_input,)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(census.pack, lambda t: t), census.calls:
            out = model(*args)
        del out
    finally:
        if census.packer is not None:
            census.packer.observer = None
        for h in handles:
            h.remove()
        model.train(was_training)
        with torch.no_grad():
            for b, saved in zip(model.buffers(), buffers):
                b.copy_(saved)
    return census.result()


def last_forward_census(model: nn.Module) -> SavedCensus | None:
    """What the last training forward of a converted ``model`` saved, by owner and category.

    Kept by the model's saved-tensor packer as it goes (no extra forward; ``saved_by`` is not
    known there, so it is empty); None for a model without one (unconverted, or hooks off).
    """
    packer = hooks.packer_of(model)
    if packer is None:
        return None
    return SavedCensus(tuple(SavedGroup(owner, owner_type, "", category, nbytes, count)
                             for (owner, owner_type, category), (nbytes, count) in packer.saved.items()))


def saved_bytes(model: nn.Module, batch: torch.Tensor | tuple) -> int:
    """Activation bytes kept for backward at the end of one training forward (deduplicated storages)."""
    return saved_tensor_census(model, batch).total_bytes
