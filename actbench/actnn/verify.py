"""verify-grads: bias and variance of ActNN's compressed gradients against fp32, per parameter.

For a fixed batch, the fp32 gradient g is computed once; then K gradients g_k of the converted
model, each with fresh rounding noise. At another precision (``precision``: bf16 or fp16, forward
and loss under autocast as in the measured training step, docs/design.md §1) g is the unconverted
model's gradient at that precision, so the statistics isolate compression from autocast's own
rounding; fp16 scales the loss as a gradient scaler does. Per parameter tensor (``fp32_norm`` keeps
its name: it is g's norm, at whatever precision g was computed):

* ``rel_bias`` = ||mean_k g_k - g|| / ||g||
* ``rel_std``  = sqrt(sum_k ||g_k - mean||^2 / (K - 1)) / ||g||   (spread of one draw)
* ``bias_z``   = ||mean_k g_k - g|| / (rel_std ||g|| / sqrt(K)): the bias in units of its own
  standard error. An unbiased estimator gives about 1; a real bias grows like sqrt(K).

Dropout is put in eval mode in both models (the two would otherwise draw different masks, and
the difference would not be compression); BatchNorm stays in training mode.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from actbench.actnn.convert import convert
from actbench.actnn.levels import LevelConfig, resolve
from actbench.schema import DEFAULT_PRECISION
from actbench.training.precision import autocast, check_precision, uses_loss_scaling

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyConfig:
    """One verification: model (torchvision name), level, batch, K seeds, input side, device, precision."""

    model: str
    level: str | LevelConfig = "L3"
    batch: int = 4
    seeds: int = 8
    image_size: int = 64
    device: str = "cpu"
    num_classes: int = 10
    data_seed: int = 0
    precision: str = DEFAULT_PRECISION

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 (a variance needs two draws), got {self.seeds}")
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {self.image_size}")


@dataclass(frozen=True)
class GradRow:
    """Statistics of one parameter's compressed gradient (relative to the fp32 gradient's norm)."""

    parameter: str
    numel: int
    fp32_norm: float
    rel_bias: float
    rel_std: float
    bias_z: float


def _eval_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.eval()


class LossScale:
    """fp16's loss scale, shared by the reference and every draw: GradScaler's first scale (2^16), halved
    and the step redone while a gradient is not finite (GradScaler skips such a step; here the step's
    gradient is the result). It never grows again, so one verification's draws see one scale or less."""

    def __init__(self, precision: str) -> None:
        self.value = 2.0**16 if uses_loss_scaling(precision) else 1.0


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = DEFAULT_PRECISION,
           scale: LossScale | None = None) -> dict[str, torch.Tensor]:
    """Parameter gradients (float64, cpu) of one cross-entropy step at ``precision``."""
    from actbench.models import logits_of

    scale = scale or LossScale(precision)
    while True:
        model.zero_grad(set_to_none=True)
        with autocast(precision, x.device):
            loss = F.cross_entropy(logits_of(model(x)), y)
        (loss if scale.value == 1.0 else loss * scale.value).backward()
        grads = {n: p.grad.detach().to("cpu", torch.float64) / scale.value
                 for n, p in model.named_parameters() if p.grad is not None}
        if scale.value == 1.0 or all(bool(torch.isfinite(g).all()) for g in grads.values()):
            return grads
        scale.value /= 2


def grad_statistics(reference: dict[str, torch.Tensor], draws: list[dict[str, torch.Tensor]]) -> list[GradRow]:
    """Rows for every parameter in ``reference`` from K >= 2 draws."""
    k = len(draws)
    rows = []
    for name, g in reference.items():
        stack = torch.stack([d[name] for d in draws])
        mean = stack.mean(0)
        norm = float(g.norm()) or 1e-30
        bias = float((mean - g).norm())
        std = math.sqrt(float((stack - mean).pow(2).sum()) / (k - 1))
        z = bias / (std / math.sqrt(k)) if std > 0 else (0.0 if bias == 0 else math.inf)
        rows.append(GradRow(name, g.numel(), float(g.norm()), bias / norm, std / norm, z))
    return rows


def compare_gradients(
    model: nn.Module,
    level: str | LevelConfig,
    x: torch.Tensor,
    y: torch.Tensor,
    seeds: int,
    progress: Callable[[int, int], None] | None = None,
    precision: str = DEFAULT_PRECISION,
) -> list[GradRow]:
    """Gradient of ``model`` on (x, y) vs ``seeds`` compressed draws at ``level``, both at ``precision``."""
    config = resolve(level)
    model = copy.deepcopy(model).train()
    _eval_dropout(model)
    scale = LossScale(check_precision(precision))
    reference = _grads(copy.deepcopy(model), x, y, precision, scale)
    generator = torch.Generator().manual_seed(0)
    conv = convert(model, config, generator=generator)
    _eval_dropout(conv.model)
    _grads(conv.model, x, y, precision, scale)  # warm-up: L3's allocation adapts from the second step on
    draws = []
    for k in range(seeds):
        generator.manual_seed(1000 + k)
        draws.append(_grads(conv.model, x, y, precision, scale))
        if progress:
            progress(k + 1, seeds)
    return grad_statistics(reference, draws)


def verify_grads(config: VerifyConfig, progress: Callable[[int, int], None] | None = None) -> list[GradRow]:
    """Build the torchvision model, make a fixed batch, and compare (see module docstring)."""
    from actbench.models import ModelSpec, build_model

    torch.manual_seed(config.data_seed)
    model = build_model(ModelSpec(config.model, num_classes=config.num_classes), config.image_size)
    device = torch.device(config.device)
    model = model.to(device)
    g = torch.Generator().manual_seed(config.data_seed)
    x = torch.randn(config.batch, 3, config.image_size, config.image_size, generator=g).to(device)
    y = torch.randint(0, config.num_classes, (config.batch,), generator=g).to(device)
    log.info("verify-grads %s at %s %s: batch %d, %d seeds, %d px", config.model, resolve(config.level).name,
             config.precision, config.batch, config.seeds, config.image_size)
    return compare_gradients(model, config.level, x, y, config.seeds, progress, config.precision)


def verify_task(args: dict, progress: Callable[[int, int], None] | None = None) -> dict:
    """The executor task "verify-grads": ``args`` are VerifyConfig's fields (a level as a name or as
    LevelConfig fields); returns ``{"rows": [GradRow fields, ...]}``."""
    fields = dict(args)
    if isinstance(fields.get("level"), dict):
        fields["level"] = LevelConfig(**fields["level"])
    rows = verify_grads(VerifyConfig(**fields), progress)
    return {"rows": [dataclasses.asdict(r) for r in rows]}


def write_csv(rows: list[GradRow], path: Path) -> Path:
    """Write rows as CSV (columns = GradRow fields); refuses to overwrite an existing file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fld.name for fld in dataclasses.fields(GradRow)])
        writer.writeheader()
        for r in rows:
            writer.writerow(dataclasses.asdict(r))
    return path
