"""The task registry: what is trained, one class per task, registered by name (docs/design.md §7).

A task says which torchvision models it answers for, how one is built, how a synthetic batch and
its targets are made, what loss is trained and what one sample is. Declarations import no torch,
so checking a model name stays light; the methods import what they need when called. To add a
task, add one module to this package defining a subclass with ``@register``.

Inputs and targets are whatever the task's models take: a tensor of images and a tensor of labels
(classification, segmentation), or a list of images and a list of target dicts (detection); the
loss is a dict of named terms, summed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterable

from actbench.schema import LIMITS, MIN_IMAGE_SIZE, InputSize, ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


class Task:
    """One kind of training. Subclasses set the class attributes and the methods below."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: what one sample of a batch is (samples/s counts these)
    sample: ClassVar[str] = "image"
    #: the size a point trains at when none is given: torchvision's reference training's (frames: video only)
    default_size: ClassVar[InputSize] = InputSize(224, 224)
    #: the models of the pinned torchvision (pyproject.toml) it answers for, sorted; a test holds
    #: this list equal to :meth:`installed_models`, so names are checked without torch
    pinned_models: ClassVar[tuple[str, ...]]

    def installed_models(self) -> tuple[str, ...]:
        """The models the installed torchvision has for this task, sorted (imports torchvision)."""
        raise NotImplementedError(f"task '{self.name}' does not list its models")

    def num_classes(self, spec: ModelSpec) -> int:
        """Classes the model's head predicts."""
        return spec.num_classes

    def size_problem(self, model: str, size: InputSize) -> str | None:
        """Why ``model`` cannot be built for ``size`` (one line naming both and what it takes), or None.
        Imports no torch: a command checks it with its other values, before anything is built."""
        return None

    def next_side(self, model: str, side: int, frames: int | None = None,
                  high: int = LIMITS["resolution"]) -> int | None:
        """The smallest square side in ``side..high`` (and ``MIN_IMAGE_SIZE..``) that :meth:`size_problem`
        lets ``model`` train at, or None when there is none: the grid a resolution search moves along."""
        for candidate in range(max(side, MIN_IMAGE_SIZE), min(high, LIMITS["resolution"]) + 1):
            if self.size_problem(model, InputSize(candidate, candidate, frames)) is None:
                return candidate
        return None

    def require_size(self, model: str, size: InputSize) -> None:
        """ValueError (one line) for a size :meth:`size_problem` refuses: ``build`` and ``batch`` call it for
        callers that come without a command (the Python API, tests)."""
        problem = self.size_problem(model, size)
        if problem is not None:
            raise ValueError(problem)

    def build(self, spec: ModelSpec, size: InputSize) -> "nn.Module":
        """``spec`` with random weights on the current device, for inputs of ``size``."""
        raise NotImplementedError(f"task '{self.name}' does not say how to build a model")

    def batch(self, spec: ModelSpec, batch_size: int, size: InputSize, device: "torch.device",
              seed: int) -> tuple[Any, Any]:
        """A synthetic (inputs, targets), made from ``seed`` on ``device`` (no data loading)."""
        raise NotImplementedError(f"task '{self.name}' does not say how to make a batch")

    def optimizer(self, params: "Iterable[torch.Tensor]", lr: float, momentum: float) -> "torch.optim.Optimizer":
        """What trains the model: SGD with momentum (the ActNN paper's, and torchvision's classification and
        segmentation references'); a task whose reference trains with another optimizer says so here,
        since its state is part of the step's memory."""
        import torch

        return torch.optim.SGD(params, lr=lr, momentum=momentum)

    def forward(self, model: "nn.Module", inputs: Any, targets: Any) -> Any:
        """The model's training output (detection models take the targets too)."""
        return model(inputs)

    def losses(self, output: Any, targets: Any) -> dict[str, "torch.Tensor"]:
        """The named loss terms trained, each already weighted."""
        raise NotImplementedError(f"task '{self.name}' does not say what loss it trains")

    def meta_note(self, model: "nn.Module") -> str | None:
        """What a ``meta`` prediction of ``model``'s step assumes that a measured step does not (for the
        row's note), or None: it steps the cpu op set as it is."""
        return None

    def loss(self, model: "nn.Module", inputs: Any, targets: Any) -> "torch.Tensor":
        """Forward and the sum of :meth:`losses`: the one scalar backward starts from."""
        terms = list(self.losses(self.forward(model, inputs, targets), targets).values())
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total


_REGISTRY: dict[str, Task] = {}


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` (one instance) known by its ``name``."""
    instance = cls()
    if instance.name in _REGISTRY:
        raise ValueError(f"task '{instance.name}' is registered twice")
    _REGISTRY[instance.name] = instance
    return cls


def registered() -> dict[str, Task]:
    """Every task by name, in registration order (classification first)."""
    return dict(_REGISTRY)
