"""One training step, split in phases so measurement can look between forward and backward.

The step is the same for every strategy: forward, cross-entropy loss, backward, SGD(momentum 0.9)
step, as in the ActNN paper. A strategy only prepares the model and may give a context that is
active during forward (swap's saved-tensor hooks).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn

from actbench.models import logits_of
from actbench.strategies import HostScope, StrategyOptions, get


@dataclass
class TrainingStep:
    """A prepared model, its optimizer and the context its forward runs under."""

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
    """Prepare ``model`` (already on ``device``) for ``strategy`` and pair it with SGD(momentum 0.9).

    Returns (step, note): the note is the strategy's account of what it did, for the result row.
    """
    prepared = get(strategy).prepare(model, device, options, host_scope)
    optimizer = torch.optim.SGD(prepared.model.parameters(), lr=options.lr, momentum=options.momentum)
    return TrainingStep(prepared.model, optimizer, prepared.forward_context), prepared.note


def synthetic_batch(batch: int, image_size: int, num_classes: int, device: torch.device,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [batch, 3, H, W] float32 and labels [batch] int64, made on ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    images = torch.randn(batch, 3, image_size, image_size, generator=gen).to(device)
    targets = torch.randint(0, num_classes, (batch,), generator=gen).to(device)
    return images, targets
