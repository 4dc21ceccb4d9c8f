"""verify-grads: bias and variance of ActNN's compressed gradients against fp32, per parameter.

For a fixed batch, K gradients of the converted model, each with fresh rounding noise, are compared
with the reference gradient, per parameter tensor (``rel_bias``, ``rel_std``, ``bias_z``), to show
that compression adds variance and no bias. Definitions and the set-up: docs/design.md §3
("Checking compressed training").
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from actbench.actnn.convert import convert
from actbench.actnn.levels import LevelConfig, resolve
from actbench.execution.parsing import check_int
from actbench.schema import DEFAULT_PRECISION, MAX_SEEDS, InputSize
from actbench.training.precision import check_precision, uses_loss_scaling

if TYPE_CHECKING:
    from actbench.training.tasks import Task

log = logging.getLogger(__name__)


def check_counts(batch_size: int, seeds: int, prefix: str = "") -> None:
    """The batch and the number of compressed draws in their bounds (ValueError, one line); ``prefix``
    turns the names into the command line's options (``--``)."""
    check_int(batch_size, f"{prefix}batch" if prefix else "batch size")
    check_int(seeds, f"{prefix}seeds (compressed draws: a variance needs two)", MAX_SEEDS, smallest=2)


@dataclass(frozen=True)
class VerifyConfig:
    """One verification: model (torchvision name, any task), level, batch size, K seeds, input size (N or
    HxW; a clip's frames default to its task's), device, precision."""

    model: str
    level: str | LevelConfig = "L3"
    batch_size: int = 4
    seeds: int = 8
    image_size: str | int = 64
    device: str = "cpu"
    num_classes: int = 10
    data_seed: int = 0
    precision: str = DEFAULT_PRECISION
    frames: int | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_counts(self.batch_size, self.seeds)
        self.size()

    def size(self) -> InputSize:
        """The input size (ValueError, one line, for one the model cannot train at)."""
        from actbench.training.tasks import input_size_for

        return input_size_for(self.model, self.image_size, self.frames)


@dataclass(frozen=True)
class GradRow:
    """Statistics of one parameter's compressed gradient (relative to the fp32 gradient's norm)."""

    parameter: str
    numel: int
    fp32_norm: float
    rel_bias: float
    rel_std: float
    bias_z: float


#: Relative deviation from fp32 below which a gradient that never varies counts as exact (float rounding).
EXACT_RELATIVE = 1e-5


def _eval_dropout(model: nn.Module) -> None:
    """Dropout and stochastic depth off: their random masks are not compression."""
    from torchvision.ops import StochasticDepth

    for m in model.modules():
        if isinstance(m, (nn.modules.dropout._DropoutNd, StochasticDepth)):
            m.eval()


def _init_zero_weights(model: nn.Module, seed: int) -> list[str]:
    """Give all-zero weights (ViT's head) a small seeded init, so gradients reach the layers below."""
    g = torch.Generator().manual_seed(seed)
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() >= 2 and not bool(p.any()):
                p.copy_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
                names.append(name)
    return names


class LossScale:
    """fp16's loss scale, shared by the reference and every draw: GradScaler's first scale (2^16), halved
    and the step redone while a gradient is not finite (GradScaler skips such a step; here the step's
    gradient is the result). It never grows again, so one verification's draws see one scale or less."""

    def __init__(self, precision: str) -> None:
        self.value = 2.0**16 if uses_loss_scaling(precision) else 1.0


def _grads(model: nn.Module, x: Any, y: Any, precision: str = DEFAULT_PRECISION,
           scale: LossScale | None = None, task: "Task | None" = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Parameter gradients (float64, cpu) of one step of ``task``'s loss (classification's cross-entropy by
    default) at ``precision``. Torch's global generator is reset to ``seed`` first, so what a model draws
    for itself (a detector's sampled proposals) is the same in every draw: compression's rounding comes
    from its own generator, and the difference between draws is compression's alone."""
    from actbench.actnn import loss_scope
    from actbench.training.step import training_loss
    from actbench.training.tasks import CLASSIFICATION

    scale = scale or LossScale(precision)
    while True:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        with loss_scope(model):  # the loss compressed as a training step's is (none for the reference)
            loss = training_loss(model, x, y, precision, task or CLASSIFICATION)
        (loss if scale.value == 1.0 else loss * scale.value).backward()
        grads = {n: p.grad.detach().to("cpu", torch.float64) / scale.value
                 for n, p in model.named_parameters() if p.grad is not None}
        if scale.value == 1.0 or all(bool(torch.isfinite(g).all()) for g in grads.values()):
            return grads
        scale.value /= 2


class RunningGrads:
    """Per-parameter mean and sum of squared deviations over draws (Welford), one draw at a time."""

    def __init__(self, reference: dict[str, torch.Tensor]) -> None:
        self.reference = reference
        self.k = 0
        self.mean: dict[str, torch.Tensor] = {}
        self.m2: dict[str, torch.Tensor] = {}

    def add(self, draw: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.reference if n not in draw]
        if missing:
            raise ValueError(f"the compressed model gave no gradient for {len(missing)} parameter(s) fp32 trains, "
                             f"first {missing[0]}")
        self.k += 1
        for name in self.reference:
            g = draw[name]
            if self.k == 1:
                self.mean[name], self.m2[name] = g.clone(), torch.zeros_like(g)
            else:
                delta = g - self.mean[name]
                self.mean[name] += delta / self.k
                self.m2[name] += delta * (g - self.mean[name])

    def rows(self) -> list[GradRow]:
        """Rows for every parameter in the reference (needs K >= 2 draws)."""
        if self.k < 2:
            raise ValueError(f"a variance needs two draws, got {self.k}")
        rows = []
        for name, g in self.reference.items():
            norm = float(g.norm()) or 1e-30
            bias = float((self.mean[name] - g).norm())
            std = math.sqrt(float(self.m2[name].sum()) / (self.k - 1))
            exact = bias <= EXACT_RELATIVE * norm
            z = bias / (std / math.sqrt(self.k)) if std > 0 else (0.0 if exact else math.inf)
            rows.append(GradRow(name, g.numel(), float(g.norm()), bias / norm, std / norm, z))
        return rows


def grad_statistics(reference: dict[str, torch.Tensor], draws: list[dict[str, torch.Tensor]]) -> list[GradRow]:
    """Rows for every parameter in ``reference`` from K >= 2 draws."""
    running = RunningGrads(reference)
    for draw in draws:
        running.add(draw)
    return running.rows()


def compare_gradients(
    model: nn.Module,
    level: str | LevelConfig,
    x: Any,
    y: Any,
    seeds: int,
    progress: Callable[[int, int], None] | None = None,
    precision: str = DEFAULT_PRECISION,
    task: "Task | None" = None,
) -> list[GradRow]:
    """Gradient of ``model`` on (x, y) vs ``seeds`` compressed draws at ``level``, both at ``precision``,
    of ``task``'s loss (classification's by default)."""
    config = resolve(level)
    model = copy.deepcopy(model).train()
    _eval_dropout(model)
    scale = LossScale(check_precision(precision))
    reference = _grads(copy.deepcopy(model), x, y, precision, scale, task)
    generator = torch.Generator().manual_seed(0)
    conv = convert(model, config, generator=generator)
    _eval_dropout(conv.model)
    _grads(conv.model, x, y, precision, scale, task)  # warm-up: L3's allocation adapts from the second step on
    running = RunningGrads(reference)
    for k in range(seeds):
        generator.manual_seed(1000 + k)
        running.add(_grads(conv.model, x, y, precision, scale, task))
        if progress:
            progress(k + 1, seeds)
    return running.rows()


def verify_grads(config: VerifyConfig, progress: Callable[[int, int], None] | None = None) -> list[GradRow]:
    """Build the torchvision model, make its task's fixed batch, and compare (docs/design.md §3)."""
    from actbench.schema import ModelSpec
    from actbench.training.tasks import task_of

    task, size = task_of(config.model), config.size()
    spec = ModelSpec(config.model, num_classes=config.num_classes)
    torch.manual_seed(config.data_seed)
    model = task.build(spec, size)
    zeroed = _init_zero_weights(model, config.data_seed + 1)
    if zeroed:
        log.info("verify-grads %s: all-zero weights given a small random init: %s", config.model, ", ".join(zeroed))
    device = torch.device(config.device)
    model = model.to(device)
    x, y = task.batch(spec, config.batch_size, size, device, config.data_seed)
    log.info("verify-grads %s at %s %s: batch %d, %d seeds, %s", config.model, resolve(config.level).name,
             config.precision, config.batch_size, config.seeds, size.label())
    return compare_gradients(model, config.level, x, y, config.seeds, progress, config.precision, task)


def verify_task(args: dict, progress: Callable[[int, int], None] | None = None) -> dict:
    """The executor task "verify-grads": ``args`` are VerifyConfig's fields (a level as a name or as
    LevelConfig fields); returns ``{"rows": [GradRow fields, ...]}``."""
    fields = dict(args)
    if isinstance(fields.get("level"), dict):
        fields["level"] = LevelConfig(**fields["level"])
    rows = verify_grads(VerifyConfig(**fields), progress)
    return {"rows": [dataclasses.asdict(r) for r in rows]}


def write_csv(rows: list[GradRow], path: Path) -> Path:
    """Write rows as CSV (columns = GradRow fields) to ``path``, or ``NAME-2.csv``, ... when that exists
    (two runs in one second), through a temporary file; the path written."""
    from actbench.store.outputs import atomic_write_csv, new_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path = new_file(path)
    names = [fld.name for fld in dataclasses.fields(GradRow)]
    try:
        atomic_write_csv(path, names, ([getattr(r, n) for n in names] for r in rows), "CSV")
    except BaseException:
        path.unlink(missing_ok=True)  # the empty file that held the name
        raise
    return path
