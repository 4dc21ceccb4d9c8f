"""One training step, split in phases so measurement can look between forward and backward.

The step is the same for every strategy: forward, the task's loss (``actbench.training.tasks``:
cross-entropy for classification), backward, SGD(momentum 0.9) step, as in the ActNN paper. A strategy only prepares the model and may give a context that is
active during forward (swap's saved-tensor hooks). The precision (``actbench.training.precision``)
wraps forward and loss in autocast (bf16, fp16) and, for fp16, scales the loss with a gradient
scaler; it is the same for every strategy.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch import nn

from actbench.core import compat
from actbench.training.models import logits_of
from actbench.schema import DEFAULT_PRECISION, InputSize
from actbench.strategies import HostScope, Strategy, StrategyOptions
from actbench.training.precision import autocast, check_precision, make_scaler
from actbench.training.tasks import CLASSIFICATION, Task


def logits_and_loss(model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                    precision: str = DEFAULT_PRECISION,
                    criterion: Callable[..., torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A classifier's logits and loss (autocast at ``precision``, cross-entropy by default): the accuracy
    study reads the logits; the ops are those of :func:`training_loss` for classification."""
    with autocast(precision, images.device):
        logits = logits_of(model(images))
        return logits, (criterion or nn.functional.cross_entropy)(logits, targets)


def training_loss(model: nn.Module, inputs: Any, targets: Any, precision: str = DEFAULT_PRECISION,
                  task: Task = CLASSIFICATION) -> torch.Tensor:
    """Forward and ``task``'s loss under autocast at ``precision``: what measured steps, FLOP counts and
    gradient checks train."""
    with autocast(precision, _device_of(inputs)):
        return task.loss(model, inputs, targets)


def _device_of(inputs: Any) -> torch.device:
    """The device of a batch's inputs: a tensor, or the first of a list of them (detection's images)."""
    return (inputs if isinstance(inputs, torch.Tensor) else inputs[0]).device


@dataclass
class TrainingStep:
    """A prepared model, its optimizer, the context its forward runs under, the step's precision and the
    task whose loss it trains.

    ``scaler``: fp16's gradient scaler (``torch.amp.GradScaler``, or on fake tensors
    ``precision.StaticLossScaler``); None at fp32 and bf16.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    forward_context: Callable[[], ContextManager[None]] = contextlib.nullcontext
    precision: str = DEFAULT_PRECISION
    task: Task = CLASSIFICATION
    scaler: Any = None
    #: fp16: optimizer steps the gradient scaler skipped (an inf/NaN gradient; it halves its scale)
    skipped_steps: int = 0
    last_step_skipped: bool = False

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def forward_loss(self, inputs: Any, targets: Any) -> torch.Tensor:
        with self.forward_context():
            return training_loss(self.model, inputs, targets, self.precision, self.task)

    def backward_and_update(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
            return
        self.scaler.scale(loss).backward()
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # unscales the gradients; skips the step on inf/NaN (GradScaler)
        self.scaler.update()
        self.last_step_skipped = self.scaler.get_scale() < scale  # only a skipped step lowers the scale
        self.skipped_steps += self.last_step_skipped

    def settle_loss_scale(self, images: torch.Tensor, targets: torch.Tensor, max_steps: int = 24) -> int:
        """fp16: step until the gradient scaler takes a step; returns the extra steps run.

        GradScaler starts at scale 2^16 and halves it on every step whose scaled gradients overflow
        fp16, skipping that optimizer step; a step measured then would lack the optimizer state of
        steady training. Warm-up therefore goes on until a step is taken (at most ``max_steps``).
        """
        extra = 0
        while self.scaler is not None and self.last_step_skipped and extra < max_steps:
            self(images, targets)
            extra += 1
        return extra

    def precision_note(self) -> str | None:
        """For the row: fp16's loss scale and how many steps the scaler skipped; None otherwise."""
        if self.scaler is None or not hasattr(self.scaler, "get_scale"):
            return None
        return f"fp16 loss scale {self.scaler.get_scale():g} ({self.skipped_steps} steps skipped on overflow)"

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
    strategy: Strategy,
    model: nn.Module,
    device: torch.device,
    options: StrategyOptions = StrategyOptions(),
    host_scope: HostScope = contextlib.nullcontext,
    precision: str = DEFAULT_PRECISION,
    task: Task = CLASSIFICATION,
) -> tuple[TrainingStep, str | None]:
    """Prepare ``model`` (already on ``device``) for ``strategy`` and pair it with its task's optimizer
    (SGD with momentum 0.9 unless the task trains otherwise).

    ``precision``: fp32, bf16 or fp16 (autocast; fp16 with a gradient scaler); ``task``: the loss trained
    (the point's, ``Point.task``). Returns (step, note):
    the note is the strategy's account of what it did, for the result row.
    """
    check_precision(precision)
    prepared = strategy.prepare(model, device, options, host_scope)
    optimizer = task.optimizer(prepared.model.parameters(), options.lr, options.momentum)
    first = next(iter(prepared.model.parameters()), None)
    scaler = make_scaler(precision, device, fake=first is not None and compat.is_fake(first))
    return TrainingStep(prepared.model, optimizer, prepared.forward_context, precision=precision,
                        scaler=scaler, task=task), prepared.note


def synthetic_batch(batch_size: int, size: InputSize | int, num_classes: int, device: torch.device,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [batch_size, 3, H, W] float32 and labels [batch_size] int64, made on ``device``
    (classification's; an int ``size`` is a square side)."""
    size = InputSize.of(size)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    images = torch.randn(batch_size, 3, size.height, size.width, generator=gen).to(device)
    targets = torch.randint(0, num_classes, (batch_size,), generator=gen).to(device)
    return images, targets
