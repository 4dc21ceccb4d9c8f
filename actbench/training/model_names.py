"""Checking a model name without importing torch (docs/design.md §7).

Every command checks its model first. Importing torch and torchvision for it cost 3.8 s of a 30 s
cpu sweep in the command's own process, which otherwise only waits for its workers, and made every
one-line input error wait as long. Each task (``actbench.training.tasks``) lists the models of the
pinned torchvision (0.29.1, pyproject.toml) it answers for, and a test holds each list equal to the
installed torchvision's; a name not listed is looked up in the installed torchvision, so another
version's models are still accepted.
"""

from __future__ import annotations

import fnmatch
import functools

from actbench.schema import GROWABLE_MODEL, ModelSpec
from actbench.training.tasks import task_of


@functools.cache
def list_model_names(pattern: str | None = None) -> tuple[str, ...]:
    """Torchvision classification model names, optionally filtered by a glob such as ``resnet*``."""
    import torchvision

    names = sorted(torchvision.models.list_models(module=torchvision.models))
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return tuple(names)


def validate_model_spec(spec: ModelSpec) -> None:
    """Raise ValueError naming the bad value and what is allowed."""
    task_of(spec.name)  # the model must be some task's
    check_growth(spec)


def check_growth(spec: ModelSpec) -> None:
    """ValueError unless the growth fields (ResNet-152's alone) hold values that can be built."""
    if (spec.extra_blocks or spec.width_per_group is not None) and spec.name != GROWABLE_MODEL:
        raise ValueError(
            f"extra blocks / width_per_group apply to {GROWABLE_MODEL} only, got model '{spec.name}'"
        )
    if spec.extra_blocks < 0:
        raise ValueError(f"extra blocks must be >= 0, got {spec.extra_blocks}")
    if spec.width_per_group is not None and spec.width_per_group <= 0:
        raise ValueError(f"width_per_group must be > 0, got {spec.width_per_group}")


__all__ = ["ModelSpec", "check_growth", "list_model_names", "validate_model_spec"]
