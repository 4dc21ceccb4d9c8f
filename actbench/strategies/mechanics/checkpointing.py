"""Gradient checkpointing of a model's blocks: the mechanics behind the ``checkpoint`` strategy."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


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


#: ``context_fn`` of a non-reentrant checkpoint (selective checkpointing's policy contexts); None: plain.
ContextFn = Callable[[], tuple[Any, Any]]


class CheckpointedSequential(nn.Module):
    """Runs a Sequential's entries in runs; each run is one non-reentrant checkpoint segment.

    ``context_fn`` (optional) is handed to every segment's ``checkpoint`` call: selective activation
    checkpointing (``sac``) passes the policy contexts that keep some ops' outputs.
    """

    def __init__(self, inner: nn.Sequential, runs: Sequence[tuple[int, int]],
                 context_fn: ContextFn | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.runs = tuple(runs)
        self.context_fn = context_fn

    def _run(self, start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        for i in range(start, stop):
            x = self.inner[i](x)
        return x

    def strategy_host_calls(self, args: tuple = ()) -> tuple[str, int]:
        """For the step-time model: each call checkpoints, and in backward recomputes, this many modules
        (containers included), whose bookkeeping and Python the device model's ``strategy_call_s``
        prices per module: a segment's host cost grows with what it recomputes."""
        modules = sum(1 for start, stop in self.runs for i in range(start, stop) for _ in self.inner[i].modules())
        return ("checkpoint_module" if self.context_fn is None else "selective_module"), modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for start, stop in self.runs:
            if torch.is_grad_enabled() and self.context_fn is not None:
                x = checkpoint(self._run, start, stop, x, use_reentrant=False, context_fn=self.context_fn)
            elif torch.is_grad_enabled():
                x = checkpoint(self._run, start, stop, x, use_reentrant=False)
            else:
                x = self._run(start, stop, x)
        return x


def _starts_inplace(module: nn.Module) -> bool:
    return bool(getattr(module, "inplace", False))


def plan_segments(containers: Sequence[tuple[nn.Module, str, nn.Sequential]],
                  segments: int | None) -> list[list[tuple[int, int]]]:
    """Per container, the (start, stop) runs of its entries that ``segments`` asks for (see
    :func:`apply_checkpointing`); nothing is changed, so callers can ask what a number makes."""
    blocks = [(ci, bi) for ci, (_, _, seq) in enumerate(containers) for bi in range(len(seq))]
    n = len(blocks)
    k = n if segments is None else max(1, min(segments, n))
    group_of = [i * k // n for i in range(n)]
    plans: list[list[tuple[int, int]]] = []
    for ci, (_, _, seq) in enumerate(containers):
        idx = [g for (c, _), g in zip(blocks, group_of) if c == ci]
        runs: list[tuple[int, int]] = []
        start = 0
        for bi in range(1, len(seq) + 1):
            if bi == len(seq) or (idx[bi] != idx[bi - 1] and not _starts_inplace(seq[bi])):
                runs.append((start, bi))
                start = bi
        plans.append(runs)
    return plans


def apply_checkpointing(model: nn.Module, segments: int | None, context_fn: ContextFn | None = None) -> int:
    """Wrap the model's blocks in checkpoint segments; return the number of segments made.

    Blocks from all containers are split into ``segments`` contiguous groups of near-equal size
    (``None``: one per block); a group never spans two containers. A segment never starts with an
    in-place module (VGG's ReLU(inplace)), which would overwrite the previous segment's saved input.
    """
    containers = find_block_containers(model)
    if not containers:
        raise ValueError(f"checkpoint: found no nn.Sequential blocks in {type(model).__name__}")
    plans = plan_segments(containers, segments)
    for (parent, attr, seq), runs in zip(containers, plans):
        setattr(parent, attr, CheckpointedSequential(seq, runs, context_fn))
    return sum(len(runs) for runs in plans)


def exact_segment_counts(model: nn.Module) -> tuple[int, ...]:
    """The ``segments`` values :func:`apply_checkpointing` makes exactly for ``model`` (it is not changed):
    a group never spans two containers nor starts at an in-place module, so other values make more or fewer."""
    containers = find_block_containers(model)
    n = sum(len(seq) for _, _, seq in containers)
    return tuple(k for k in range(1, n + 1) if sum(len(r) for r in plan_segments(containers, k)) == k)
