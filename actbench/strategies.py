"""Memory-saving strategies behind one interface: each turns (model, optimizer) into a training step.

A strategy prepares the model (wrap blocks in checkpoints, convert layers to ActNN) and may give a
context that is active during forward (swap's saved-tensor hooks). The step itself is always the
same: forward, cross-entropy loss, backward, SGD(momentum=0.9) step, as in the ActNN paper.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from actbench.compat import storage_identity, tensor_version
from actbench.models import logits_of

LEVEL_NAMES: tuple[str, ...] = ("L0", "L1", "L2", "L3", "L4", "L5")
BASELINE = "fp32"
PLAIN_STRATEGIES: tuple[str, ...] = ("fp32", "swap", "checkpoint")
ALL_STRATEGIES: tuple[str, ...] = PLAIN_STRATEGIES + LEVEL_NAMES

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

    model: nn.Module
    forward_context: Callable[[], ContextManager[None]] = contextlib.nullcontext
    note: str | None = None


def is_actnn_level(name: str) -> bool:
    return name in LEVEL_NAMES


def cuda_alloc_conf(strategy: str) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF a strategy needs in its child process (L5: expandable segments)."""
    if not is_actnn_level(strategy):
        return None
    from actbench.actnn import level_config  # lazy: the ActNN package is optional at import time

    return level_config(strategy).cuda_alloc_conf


# --- swap --------------------------------------------------------------------------------------
def _swap_context(model: nn.Module, device: torch.device, host_scope: HostScope) -> Callable[[], ContextManager[None]]:
    """Saved tensors go to (pinned, on CUDA) host buffers in forward and come back in backward.

    Parameters stay put: they live on the device anyway, so copying them would only add traffic.
    A tensor saved by several ops in one forward (a block input read by conv1 and the downsample
    conv) is copied once: the cache matches storage, view geometry and version counter, and holds
    only a weak reference so a freed storage whose address is reused can never match.
    On a CPU device the copy still happens, into a buffer the tracker files as host memory, and
    backward copies it back, so the CPU run exercises the same logic as the GPU.
    """
    param_ptrs = frozenset(storage_identity(p) for p in model.parameters())  # fake tensors all have data_ptr 0
    pin = device.type == "cuda"

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        dev, buf = packed
        if dev.type == "cpu":
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


# --- checkpoint --------------------------------------------------------------------------------
def find_block_containers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Sequential]]:
    """Outermost ``nn.Sequential`` children with >= 2 entries, as (parent, attribute, container).

    Their entries are the model's blocks (ResNet layer1..4's bottlenecks, VGG/DenseNet/EfficientNet
    ``features`` entries, ViT encoder layers), in forward order for torchvision models.
    """
    found: list[tuple[nn.Module, str, nn.Sequential]] = []

    def visit(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if type(child).forward is nn.Sequential.forward and isinstance(child, nn.Sequential) and len(child) >= 2:
                found.append((parent, name, child))
            else:
                visit(child)

    visit(model)
    return found


class CheckpointedSequential(nn.Module):
    """Runs a Sequential's entries in runs; each run is one non-reentrant checkpoint segment."""

    def __init__(self, inner: nn.Sequential, runs: Sequence[tuple[int, int]]) -> None:
        super().__init__()
        self.inner = inner
        self.runs = tuple(runs)

    def _run(self, start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        for i in range(start, stop):
            x = self.inner[i](x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for start, stop in self.runs:
            if torch.is_grad_enabled():
                x = checkpoint(self._run, start, stop, x, use_reentrant=False)
            else:
                x = self._run(start, stop, x)
        return x


def _starts_inplace(module: nn.Module) -> bool:
    return bool(getattr(module, "inplace", False))


def apply_checkpointing(model: nn.Module, segments: int | None) -> int:
    """Wrap the model's blocks in checkpoint segments; return the number of segments made.

    Blocks from all containers are split into ``segments`` contiguous groups of near-equal size
    (``None``: one per block); a group never spans two containers. A segment never starts with an
    in-place module (VGG's ReLU(inplace)), which would overwrite the previous segment's saved input.
    """
    containers = find_block_containers(model)
    blocks = [(ci, bi) for ci, (_, _, seq) in enumerate(containers) for bi in range(len(seq))]
    if not blocks:
        raise ValueError(f"checkpoint: found no nn.Sequential blocks in {type(model).__name__}")
    n = len(blocks)
    k = n if segments is None else max(1, min(segments, n))
    group_of = [i * k // n for i in range(n)]
    made = 0
    for ci, (parent, attr, seq) in enumerate(containers):
        idx = [g for (c, _), g in zip(blocks, group_of) if c == ci]
        runs: list[tuple[int, int]] = []
        start = 0
        for bi in range(1, len(seq) + 1):
            if bi == len(seq) or (idx[bi] != idx[bi - 1] and not _starts_inplace(seq[bi])):
                runs.append((start, bi))
                start = bi
        made += len(runs)
        setattr(parent, attr, CheckpointedSequential(seq, runs))
    return made


# --- ActNN -------------------------------------------------------------------------------------
def _convert_actnn(model: nn.Module, level: str) -> PreparedModel:
    from actbench.actnn import convert  # lazy: written by another room, optional at import time

    conversion = convert(model, level)
    report = getattr(conversion, "report", None)
    # summary() is the ActNN room's one-paragraph account; fall back to str() for any report object.
    text = report.summary() if callable(getattr(report, "summary", None)) else report
    note = None if report is None else " ".join(str(text).split())[:300]
    return PreparedModel(model=conversion.model, note=note)


def prepare(
    strategy: str,
    model: nn.Module,
    device: torch.device,
    options: StrategyOptions,
    host_scope: HostScope = contextlib.nullcontext,
) -> PreparedModel:
    """Apply ``strategy`` to ``model`` (already on ``device``)."""
    if strategy == "fp32":
        return PreparedModel(model=model)
    if strategy == "swap":
        return PreparedModel(model=model, forward_context=_swap_context(model, device, host_scope))
    if strategy == "checkpoint":
        made = apply_checkpointing(model, options.checkpoint_segments)
        return PreparedModel(model=model, note=f"{made} checkpoint segments")
    if is_actnn_level(strategy):
        return _convert_actnn(model, strategy)
    raise ValueError(f"unknown strategy '{strategy}'; known: {', '.join(ALL_STRATEGIES)}")


@dataclass
class TrainingStep:
    """One training step split in phases so measurement can look between forward and backward."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    forward_context: Callable[[], ContextManager[None]] = contextlib.nullcontext
    criterion: nn.Module = field(default_factory=nn.CrossEntropyLoss)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def forward_loss(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.forward_context():
            return self.criterion(logits_of(self.model(images)), targets)

    def backward_and_update(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.optimizer.step()

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> None:
        self.zero_grad()
        self.backward_and_update(self.forward_loss(images, targets))

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """Parameters, buffers, gradients and optimizer state: what lives across steps."""
        yield from self.model.parameters()
        yield from self.model.buffers()
        for p in self.model.parameters():
            if p.grad is not None:
                yield p.grad
        yield from self.optimizer_state_tensors()

    def optimizer_state_tensors(self) -> Iterator[torch.Tensor]:
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value


def build_training_step(
    strategy: str,
    model: nn.Module,
    device: torch.device,
    options: StrategyOptions = StrategyOptions(),
    host_scope: HostScope = contextlib.nullcontext,
) -> tuple[TrainingStep, str | None]:
    """Prepare ``model`` for ``strategy`` and pair it with SGD(momentum 0.9); returns (step, note)."""
    prepared = prepare(strategy, model, device, options, host_scope)
    optimizer = torch.optim.SGD(prepared.model.parameters(), lr=options.lr, momentum=options.momentum)
    return TrainingStep(prepared.model, optimizer, prepared.forward_context), prepared.note
