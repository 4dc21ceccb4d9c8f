"""What is trained: one module per task, behind one registry (docs/design.md §7).

``task_of("fcn_resnet50")`` is the segmentation task; its ``build``, ``batch`` and ``loss`` are what a
point's step trains. Names are found in each task's pinned list without torch, then in the installed
torchvision. The registry is filled once, when this package is imported, by importing every module in it.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import pkgutil

from actbench.schema import LIMITS, MIN_IMAGE_SIZE, InputSize, SizeError
from actbench.training.tasks.registry import Task, register, registered

for _module in pkgutil.iter_modules(__path__):
    if not _module.ispkg and _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

#: Every task name, classification first.
TASK_NAMES: tuple[str, ...] = tuple(registered())
#: The task every step trains unless told otherwise (the ActNN paper's).
CLASSIFICATION: Task = registered()["classification"]


def task_of(model_name: str) -> Task:
    """The task ``model_name`` is trained for; ValueError (one line, with close names) for a model none has."""
    for task in registered().values():
        if model_name in task.pinned_models:
            return task
    for task in registered().values():  # another torchvision than the pinned one
        if model_name in task.installed_models():
            return task
    names = model_names()
    close = difflib.get_close_matches(model_name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown model '{model_name}'{hint} (`actbench models` lists all {len(names)})")


def input_size_for(model_name: str, image_size: str | int | None = None, frames: int | None = None) -> InputSize:
    """The size ``model_name`` trains at: ``image_size`` (N or HxW) and ``frames``, each defaulting to its
    task's; a model that cannot train at its task's default side (inception_v3 needs 299) defaults to the
    smallest square side above it that it takes. SizeError (one line) for a size that is not N or HxW,
    frames for a model without them, or a size the model cannot be built for (the task's ``size_problem``)."""
    task = task_of(model_name)
    default = task.default_size
    if frames is not None and default.frames is None:
        raise SizeError("frames", f"applies to video models; '{model_name}' is a {task.name} model, got {frames}")
    frames = default.frames if frames is None else frames
    if image_size is None:
        size = InputSize(default.height, default.width, frames)
        if task.size_problem(model_name, size) is not None:
            side = task.next_side(model_name, max(default.height, default.width), frames)
            size = size if side is None else InputSize(side, side, frames)
    else:
        size = InputSize.parse(image_size, frames)
    size.check(MIN_IMAGE_SIZE, LIMITS["resolution"])
    problem = task.size_problem(model_name, size)
    if problem is not None:
        raise SizeError("image_size", problem, whole=True)
    return size


def model_names(pattern: str | None = None, task: str | None = None) -> tuple[str, ...]:
    """Installed model names of every task (or of ``task``), sorted, filtered by a glob such as ``fcn_*``."""
    chosen = [registered()[task]] if task is not None else registered().values()
    names = sorted(n for t in chosen for n in t.installed_models())
    return tuple(n for n in names if not pattern or fnmatch.fnmatch(n, pattern))


__all__ = ["CLASSIFICATION", "TASK_NAMES", "Task", "input_size_for", "model_names", "register", "registered", "task_of"]
