"""Accuracy vs activation bits: does a network trained with compressed activations still learn?

Checks the paper's second claim (2-bit activations lose almost no accuracy, 1.25 bits still
converge) on a procedural, download-free task: the data set, the small ResNet and ViT, the training
of each setting at fp32 or at a target average of bits, and the run directory of its rows. The
task, the models and how a setting runs: docs/design.md §3 ("Checking compressed training").
"""

from __future__ import annotations

import datetime as _dt
import dataclasses
import functools
import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from actbench.schema import error_line
from actbench.store.accuracy_rows import (ROW_COLUMNS, ROWS_FILE, TABLE_FILE, AccuracyRow,  # noqa: F401 (public)
                                           AccuracyStore, accuracy_row_problem, find_accuracy_runs,
                                           setting_label)
from actbench.studies.accuracy_task import (MODELS, VIT_FIELDS, CifarResNet,  # noqa: F401 (CifarResNet: public)
                                            build_cifar_resnet, build_small_vit, make_gratings)

if TYPE_CHECKING:
    from actbench.execution.executors import Executor

log = logging.getLogger(__name__)

#: test images come from this seed offset, so train and test never share a generator stream
TEST_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class AccuracyConfig:
    """One accuracy-vs-bits experiment. ``bits``: target average bits per saved value (fp32 always added).

    ``model``: ``resnet`` (CIFAR ResNet-``model_depth``, base width ``width``) or ``vit`` (a ViT of
    ``model_depth`` encoder blocks of ``width`` channels, ``heads`` attention heads, MLP of
    ``mlp_dim``, square patches of ``patch_size`` pixels).
    """

    bits: tuple[float, ...] = (8, 4, 3, 2, 1.5, 1.25)
    include_fp32: bool = True
    steps: int = 600
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    model_depth: int = 8
    width: int = 16
    model: str = "resnet"
    heads: int = 4
    patch_size: int = 4
    mlp_dim: int = 128
    num_classes: int = 8
    image_size: int = 24
    train_size: int = 4096
    test_size: int = 1024
    noise_std: float = 0.6
    group_size: int = 256
    seed: int = 0
    #: intra-op CPU threads while training (restored afterwards). 1 by default: on a small shared
    #: machine, small convolutions run faster single-threaded than oversubscribed (docs/design.md §3).
    threads: int = 1

    def __post_init__(self) -> None:
        for b in self.bits:
            if not 1 <= b <= 8:
                raise ValueError(f"accuracy: bits must lie in 1..8 (a mixed-precision target), got {b}")
        if self.model not in MODELS:
            raise ValueError(f"accuracy: model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.model == "vit":
            for name in ("model_depth", "heads", "patch_size", "mlp_dim"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"accuracy: {name} must be > 0 for a vit, got {getattr(self, name)}")
            if self.width % self.heads:
                raise ValueError(f"accuracy: a vit's width must be a multiple of heads, got {self.width} and {self.heads}")
            if self.image_size % self.patch_size:
                raise ValueError(f"accuracy: a vit's image_size must be a multiple of patch_size, got "
                                 f"{self.image_size} and {self.patch_size}")
        for name in ("steps", "batch_size", "train_size", "test_size", "width", "threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"accuracy: {name} must be > 0, got {getattr(self, name)}")
        if self.num_classes < 2:
            raise ValueError(f"accuracy: num_classes must be >= 2, got {self.num_classes}")
        if self.image_size < 8:
            raise ValueError(f"accuracy: image_size must be >= 8 pixels, got {self.image_size}")
        for name in ("lr", "momentum", "weight_decay", "noise_std"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
                raise ValueError(f"accuracy: {name} must be a finite number {'> 0' if name == 'lr' else '>= 0'}, "
                                 f"got {value}")
        if not self.bits and not self.include_fp32:
            raise ValueError("accuracy: nothing to train (no bits and include_fp32 = false)")

    def settings(self) -> tuple[float | None, ...]:
        """``None`` is fp32; then each target, in the order given."""
        return ((None,) if self.include_fp32 else ()) + tuple(float(b) for b in dict.fromkeys(self.bits))

    def identity(self) -> dict[str, Any]:
        """What makes results differ, except the list of settings (a setting is a row's key)."""
        data = asdict(self)
        for name in ("bits", "include_fp32", "threads"):  # threads change speed, not results
            data.pop(name)
        if self.model == "resnet":  # a ResNet keeps the identity it had before other models existed
            for name in ("model",) + VIT_FIELDS:
                data.pop(name)
        return {"command": "accuracy", **data}

    def model_tag(self) -> str:
        """``resnet8``, ``vit3x64p6`` (blocks x width, patch size): in run names and descriptions."""
        if self.model == "vit":
            return f"vit{self.model_depth}x{self.width}p{self.patch_size}"
        return f"resnet{self.model_depth}"

    def row_model(self) -> str:
        """The ``model`` column of its rows."""
        return f"cifar_resnet{self.model_depth}" if self.model == "resnet" else f"small_{self.model_tag()}"

    def build_model(self) -> nn.Module:
        """The network, initialised from ``seed``."""
        if self.model == "vit":
            return build_small_vit(self.model_depth, self.num_classes, self.width, self.heads, self.patch_size,
                                   self.mlp_dim, self.image_size, self.seed)
        return build_cifar_resnet(self.model_depth, self.num_classes, self.width, self.seed)

    def run_name(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return f"accuracy_{self.model_tag()}_{self.image_size}px_{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def setting_key(cfg: AccuracyConfig, bits: float | None) -> str:
    blob = json.dumps({**cfg.identity(), "target_bits": bits}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- training ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainOutcome:
    train_loss_final: float
    train_accuracy_final: float
    test_loss: float
    test_accuracy: float
    mean_bits: float | None


@dataclass(frozen=True)
class Data:
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def make_data(cfg: AccuracyConfig) -> Data:
    tx, ty = make_gratings(cfg.train_size, cfg.num_classes, cfg.image_size, cfg.seed, cfg.noise_std)
    vx, vy = make_gratings(cfg.test_size, cfg.num_classes, cfg.image_size, cfg.seed + TEST_SEED_OFFSET, cfg.noise_std)
    return Data(tx, ty, vx, vy)


def _level(cfg: AccuracyConfig, bits: float):
    from actbench.actnn import level_config

    # L3's per-sample and per-layer mixed precision, with the target moved: 3 and 1.5 bits are not
    # packable widths, so only the mixed-precision path reaches them (as an average). Every compressed
    # tensor has the target (docs/design.md §3): conv/linear inputs, normalised inputs and the rest
    # (activation derivatives, softmax, attention's V, hook-packed tensors: a ViT's bulk), except
    # attention's Q and K, which never go below L3's qk_bits (their error biases the gradient). The
    # row's mean_bits is the average over everything compressed, Q and K included.
    l3 = level_config("L3")
    return l3.replace(conv_bits=bits, bn_bits=bits, act_bits=bits, qk_bits=max(bits, l3.qk_bits),
                      group_size=cfg.group_size, name=f"L3@{bits:g}b")


def train_and_evaluate(cfg: AccuracyConfig, bits: float | None, data: Data | None = None) -> TrainOutcome:
    """Train one setting for ``cfg.steps`` SGD steps (same init, same batches for every setting)."""
    from actbench.training.step import logits_and_loss

    data = make_data(cfg) if data is None else data
    model: nn.Module = cfg.build_model()
    controller = None
    if bits is not None:
        from actbench.actnn import convert

        conversion = convert(model, _level(cfg, bits), generator=torch.Generator().manual_seed(cfg.seed + 17),
                             strict=True)
        model, controller = conversion.model, conversion.controller
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.15)
    order = torch.Generator().manual_seed(cfg.seed + 1)
    n = data.train_x.shape[0]
    tail = max(1, cfg.steps // 10)  # "final" train loss = mean over the last 10% of steps
    losses: list[float] = []
    correct: list[float] = []
    bits_seen: list[float] = []
    perm = torch.randperm(n, generator=order)
    pos = 0
    model.train()
    for step in range(cfg.steps):
        if pos + cfg.batch_size > n:
            perm, pos = torch.randperm(n, generator=order), 0
        idx = perm[pos:pos + cfg.batch_size]
        pos += cfg.batch_size
        x, y = data.train_x[idx], data.train_y[idx]
        logits, loss = logits_and_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step >= cfg.steps - tail:
            losses.append(loss.item())
            correct.append((logits.argmax(1) == y).float().mean().item())
            if controller is not None:
                mb = controller.network_mean_bits()
                if mb is not None:
                    bits_seen.append(float(mb))
    model.eval()
    with torch.no_grad():
        test_loss, test_correct = 0.0, 0
        for i in range(0, data.test_x.shape[0], 256):
            logits = model(data.test_x[i:i + 256])
            test_loss += F.cross_entropy(logits, data.test_y[i:i + 256], reduction="sum").item()
            test_correct += int((logits.argmax(1) == data.test_y[i:i + 256]).sum())
    m = data.test_x.shape[0]
    return TrainOutcome(
        train_loss_final=sum(losses) / len(losses), train_accuracy_final=sum(correct) / len(correct),
        test_loss=test_loss / m, test_accuracy=test_correct / m,
        mean_bits=(sum(bits_seen) / len(bits_seen)) if bits_seen else None,
    )


def train_setting_task(args: dict[str, Any]) -> dict[str, Any]:
    """The executor task "accuracy-setting": train one setting (``args``: config fields, ``bits``).

    Runs with ``cfg.threads`` intra-op threads (restored afterwards); returns the TrainOutcome's fields.
    """
    config = dict(args["config"])
    config["bits"] = tuple(config["bits"])
    cfg = AccuracyConfig(**config)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return dataclasses.asdict(train_and_evaluate(cfg, args["bits"], _cached_data(cfg)))
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def _cached_data(cfg: AccuracyConfig) -> Data:
    """The data set of ``cfg``, made once for all of its settings in one process."""
    return make_data(cfg)


def run_accuracy(cfg: AccuracyConfig, out_dir: Path,
                 on_event: Callable[[str, str, AccuracyRow | None], None] | None = None,
                 executor: "Executor | None" = None) -> tuple[Path, list[AccuracyRow]]:
    """Train every setting of ``cfg`` into ``out_dir/<run>/``; settings already recorded are resumed.

    Each setting's training is a task on ``executor`` (default: this process). A failing setting
    becomes a row with status ``error`` (and the message), not a dead run. Returns the run
    directory and its rows in setting order.
    """
    from actbench.execution.executors import InProcessExecutor

    from actbench.measure.environment import capture_environment, environment_id
    from actbench.core.devices import profile
    from actbench.store.outputs import atomic_write_text

    run_dir = out_dir / cfg.run_name()
    store = AccuracyStore(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    if not config_path.exists():
        atomic_write_text(config_path, json.dumps({**cfg.identity(), "bits": list(cfg.bits),
                                                   "include_fp32": cfg.include_fp32}, indent=2) + "\n")
    env_path = run_dir / "env.json"
    if not env_path.exists():
        env = capture_environment(profile("cpu"))
        atomic_write_text(env_path, json.dumps({"env_id": environment_id(env), **env}, indent=2) + "\n")
    emit = on_event or (lambda *_: None)
    done = {r.key: r for r in store.read_rows()}
    rows = _run_settings(cfg, store, done, emit, executor or InProcessExecutor())
    store.write_table()
    return run_dir, rows


def _run_settings(cfg: AccuracyConfig, store: AccuracyStore, done: dict[str, AccuracyRow],
                  emit: Callable[[str, str, AccuracyRow | None], None], executor: "Executor") -> list[AccuracyRow]:
    from actbench.execution.executors import Task

    run_dir = store.run_dir
    rows = []
    for bits in cfg.settings():
        key = setting_key(cfg, bits)
        label = setting_label(bits)
        if key in done:
            emit("cached", label, done[key])
            rows.append(done[key])
            continue
        emit("start", label, None)
        t0 = time.perf_counter()
        base = dict(key=key, run_id=run_dir.name, setting=label, target_bits=bits, chance_accuracy=1 / cfg.num_classes,
                    steps=cfg.steps, batch_size=cfg.batch_size, image_size=cfg.image_size,
                    num_classes=cfg.num_classes, model=cfg.row_model(), seed=cfg.seed)
        try:
            res = TrainOutcome(**executor.call(Task("accuracy-setting", {"config": dataclasses.asdict(cfg),
                                                                          "bits": bits})))
        except Exception as exc:  # one failing setting is a row, not a dead experiment
            log.exception("accuracy: %s failed", label)
            row = AccuracyRow(status="error", message=error_line(exc), mean_bits=None,
                              train_loss_final=None, train_accuracy_final=None, test_loss=None,
                              test_accuracy=None, elapsed_s=time.perf_counter() - t0, **base)
        else:
            finite = all(math.isfinite(v) for v in (res.train_loss_final, res.test_loss))
            row = AccuracyRow(status="ok" if finite else "diverged", message="" if finite else "non-finite loss",
                              mean_bits=res.mean_bits, train_loss_final=res.train_loss_final,
                              train_accuracy_final=res.train_accuracy_final, test_loss=res.test_loss,
                              test_accuracy=res.test_accuracy, elapsed_s=round(time.perf_counter() - t0, 2), **base)
        row.finished_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        store.append(row)
        store.write_table()
        emit("done", label, row)
        rows.append(row)
    return rows


__all__ = [
    "AccuracyConfig", "AccuracyRow", "AccuracyStore", "CifarResNet", "MODELS", "TrainOutcome", "build_cifar_resnet",
    "build_small_vit",
    "find_accuracy_runs", "make_data", "make_gratings", "run_accuracy", "setting_label", "train_and_evaluate",
]
