"""Measuring one point: one model, one strategy, one batch size, one resolution, on one device.

Runs inside the worker child process (``actbench.worker``), never in the CLI process, so an
out-of-memory or a crash costs one row, not the sweep. Definitions (DESIGN.md §4):

- activation_bytes: device bytes allocated by forward + loss and still alive when backward starts.
- peak_alloc_bytes: device peak over one whole step (forward, backward, optimizer step), model included.
- reserved_bytes: peak bytes the CUDA caching allocator held during that step (None on cpu).
- model_bytes: parameters + gradients + optimizer state (distinct storages).
- samples_per_s_*: batch / step time over timed steps after warm-up, clock read after synchronize.
- flops_per_sample: FlopCounterMode FLOPs of forward + backward of the *unmodified* model, per sample
  (a property of the model, identical across strategies; checkpoint's recompute is not included).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from actbench.measure.tracker import LiveStorageTracker, unique_storage_bytes
from actbench.models import ModelSpec, build_model, logits_of, real_depth
from actbench.strategies import StrategyOptions, TrainingStep, build_training_step

log = logging.getLogger(__name__)

STATUSES = ("ok", "oom", "over_budget", "error", "timeout")
#: statuses that mean "does not fit": what bounds a search (error and timeout say nothing about memory)
MEMORY_FAILURES = ("oom", "over_budget")
NOISY_IQR_FRACTION = 0.10


@dataclass(frozen=True)
class PointConfig:
    """Everything that determines one measurement; its hash is the row's ``key``."""

    model: ModelSpec
    strategy: str
    batch_size: int
    image_size: int
    device: str
    budget_bytes: int | None = None
    warmup_steps: int = 1
    timed_steps: int = 3
    checkpoint_segments: int | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PointConfig":
        data = dict(data)
        data["model"] = ModelSpec(**data["model"])
        return cls(**data)

    def key(self) -> str:
        """Stable 16-hex-digit hash of the configuration (resume matches rows by it)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.model.label()} {self.strategy} b{self.batch_size} {self.image_size}px {self.device}"


@dataclass
class Measurement:
    """What a child reports. ``None`` means "not measured", never zero."""

    status: str
    message: str = ""
    activation_bytes: int | None = None
    peak_alloc_bytes: int | None = None
    reserved_bytes: int | None = None
    model_bytes: int | None = None
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    host_bytes: int | None = None
    samples_per_s_median: float | None = None
    samples_per_s_iqr: float | None = None
    step_time_s_median: float | None = None
    flops_per_sample: float | None = None
    forward_flops_per_sample: float | None = None
    num_params: int | None = None
    depth: int | None = None
    strategy_note: str | None = None
    alloc_conf: str | None = None
    elapsed_s: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class OverBudget(Exception):
    """The step's peak exceeded the budget on a device where nothing enforces it (cpu)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_flops(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(forward, forward+backward) FLOPs of one step of ``model`` on this batch (no optimizer step)."""
    criterion = torch.nn.CrossEntropyLoss()
    with FlopCounterMode(display=False) as fwd_counter:
        loss = criterion(logits_of(model(images)), targets)
    with FlopCounterMode(display=False) as bwd_counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    fwd = fwd_counter.get_total_flops()
    return fwd, fwd + bwd_counter.get_total_flops()


def synthetic_batch(batch: int, image_size: int, num_classes: int, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [batch, 3, H, W] float32 and labels [batch] int64, made on ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    images = torch.randn(batch, 3, image_size, image_size, generator=gen).to(device)
    targets = torch.randint(0, num_classes, (batch,), generator=gen).to(device)
    return images, targets


def _quartiles(values: list[float]) -> tuple[float, float | None]:
    median = statistics.median(values)
    if len(values) < 2:
        return median, None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q3 - q1


def _time_steps(step: TrainingStep, images: torch.Tensor, targets: torch.Tensor, device: torch.device,
                warmup: int, timed: int) -> list[float]:
    for _ in range(warmup):
        step(images, targets)
    _sync(device)
    times: list[float] = []
    for _ in range(timed):
        _sync(device)
        start = time.perf_counter()
        step(images, targets)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _model_breakdown(step: TrainingStep) -> dict[str, int]:
    params = list(step.model.parameters())
    param_b = unique_storage_bytes(params)
    grad_b = unique_storage_bytes(p.grad for p in params if p.grad is not None)
    opt_b = unique_storage_bytes(step.optimizer_state_tensors())
    return {"param_bytes": param_b, "grad_bytes": grad_b, "optimizer_state_bytes": opt_b,
            "model_bytes": param_b + grad_b + opt_b}


def measure_point(point: PointConfig, alloc_conf: str | None = None,
                  fault: Callable[[], None] | None = None, meta_sessions: Any = None) -> Measurement:
    """Measure ``point`` in this process; OOM and over-budget become statuses, other errors raise.

    ``meta_sessions`` (an :class:`actbench.measure.meta.MetaSessions`) lets ``meta`` points of one
    search reuse a built model; without it each meta point builds its own.
    """
    started = time.perf_counter()
    result = Measurement(status="ok", alloc_conf=alloc_conf)
    try:
        if point.device == "meta":
            from actbench.measure.meta import MetaSessions

            (meta_sessions or MetaSessions()).measure(point, result, fault)
        else:
            _measure_into(point, result, fault)
    except torch.OutOfMemoryError as exc:
        result.status = "oom"
        result.message = " ".join(str(exc).split())[:200]
    except RuntimeError as exc:
        # cuDNN/cuBLAS report allocation failures as plain RuntimeErrors on some paths.
        if "out of memory" not in str(exc).lower() and "CUDNN_STATUS_ALLOC_FAILED" not in str(exc):
            raise
        result.status = "oom"
        result.message = " ".join(str(exc).split())[:200]
    except OverBudget as exc:
        result.status = "over_budget"
        result.message = str(exc)
    result.elapsed_s = round(time.perf_counter() - started, 3)
    return result


def resolve_device(name: str) -> torch.device:
    """``cuda`` -> ``cuda:<current>``: set_device and set_per_process_memory_fraction need an index,
    and tensors report an indexed device (``cuda:0 != cuda`` as torch.device values)."""
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _measure_into(point: PointConfig, result: Measurement, fault: Callable[[], None] | None) -> None:
    device = resolve_device(point.device)
    torch.manual_seed(point.seed)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if point.budget_bytes is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, point.budget_bytes / total), device)
    with device:  # parameters are created (and initialised) on the device: fast for grown ResNets
        model = build_model(point.model, point.image_size)
    model = model.to(device)
    result.num_params = sum(p.numel() for p in model.parameters())
    result.depth = real_depth(model)
    if fault is not None:
        fault()

    # FLOPs on the unmodified model, batch 2 (BatchNorm in train mode needs > 1 value per channel).
    f_images, f_targets = synthetic_batch(2, point.image_size, point.model.num_classes, device, point.seed)
    fwd, total = count_flops(model, f_images, f_targets)
    result.forward_flops_per_sample, result.flops_per_sample = fwd / 2, total / 2
    del f_images, f_targets

    tracker = LiveStorageTracker() if device.type == "cpu" else None
    host_scope = tracker.host_allocations if tracker is not None else contextlib.nullcontext
    step, note = build_training_step(
        point.strategy, model, device, StrategyOptions(checkpoint_segments=point.checkpoint_segments), host_scope
    )
    result.strategy_note = note
    if tracker is not None:
        _file_offloads_as_host(step.model, tracker)
    images, targets = synthetic_batch(point.batch_size, point.image_size, point.model.num_classes, device, point.seed + 1)

    # Warm-up first so optimizer state exists and the measured step is a steady-state step.
    warmup_before = max(1, point.warmup_steps) if device.type == "cuda" else 1
    for _ in range(warmup_before):
        step(images, targets)
    step.zero_grad()
    if tracker is not None:
        _memory_step_cpu(step, images, targets, tracker, result)
    else:
        _memory_step_cuda(step, images, targets, device, result)
    for name, value in _model_breakdown(step).items():
        setattr(result, name, value)
    if point.budget_bytes is not None and result.peak_alloc_bytes is not None \
            and result.peak_alloc_bytes > point.budget_bytes:
        raise OverBudget(f"peak {result.peak_alloc_bytes} B > budget {point.budget_bytes} B")

    if point.timed_steps > 0:
        remaining_warmup = max(0, point.warmup_steps - warmup_before)
        times = _time_steps(step, images, targets, device, remaining_warmup, point.timed_steps)
        rates = [point.batch_size / t for t in times]
        result.samples_per_s_median, result.samples_per_s_iqr = _quartiles(rates)
        result.step_time_s_median = statistics.median(times)
        if result.samples_per_s_iqr is not None and result.samples_per_s_iqr > NOISY_IQR_FRACTION * result.samples_per_s_median:
            result.message = f"noisy: IQR {result.samples_per_s_iqr / result.samples_per_s_median:.0%} of median"
            log.warning("%s", result.message)


def _file_offloads_as_host(model: torch.nn.Module, tracker: LiveStorageTracker) -> None:
    """L4/L5 off CUDA: their "host" copies are plain tensors; make the tracker file them as host."""
    for module in model.modules():
        slot = module.__dict__.get("_actnn_slot")
        offloader = getattr(getattr(slot, "controller", None), "offloader", None)
        if offloader is not None:
            offloader.host_scope = tracker.host_allocations


def _memory_step_cpu(step: TrainingStep, images: torch.Tensor, targets: torch.Tensor,
                     tracker: LiveStorageTracker, result: Measurement) -> None:
    tracker.adopt(step.state_tensors())
    tracker.adopt([images, targets])
    with tracker:
        tracker.reset_peak()
        before = tracker.live_bytes
        loss = step.forward_loss(images, targets)
        result.activation_bytes = tracker.live_bytes - before
        result.host_bytes = tracker.host_live_bytes
        step.backward_and_update(loss)
        del loss
    result.peak_alloc_bytes = tracker.peak_bytes
    result.reserved_bytes = None  # no caching allocator on cpu


def pinned_host_bytes() -> int | None:
    """Bytes of pinned host memory handed out by torch's host allocator now; None if torch cannot say.

    swap's and L4/L5's host copies are pinned (``pin_memory=True``), so the growth over a forward
    is what they keep in CPU memory. The allocator rounds blocks up to powers of two: this is the
    pinned memory actually held, not the tensors' exact sizes. Newer torch names the handed-out
    part ``active_bytes``; older only ``allocated_bytes`` (handed out, or cached for reuse).
    """
    try:
        stats = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        return None
    for key in ("active_bytes.current", "allocated_bytes.current"):
        if key in stats:
            return int(stats[key])
    return None


def _memory_step_cuda(step: TrainingStep, images: torch.Tensor, targets: torch.Tensor,
                      device: torch.device, result: Measurement) -> None:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    host_before = pinned_host_bytes()
    loss = step.forward_loss(images, targets)
    torch.cuda.synchronize(device)
    result.activation_bytes = torch.cuda.memory_allocated(device) - before
    host_after = pinned_host_bytes()
    if host_before is not None and host_after is not None:
        result.host_bytes = max(0, host_after - host_before)
    step.backward_and_update(loss)
    del loss
    torch.cuda.synchronize(device)
    result.peak_alloc_bytes = torch.cuda.max_memory_allocated(device)
    result.reserved_bytes = torch.cuda.max_memory_reserved(device)
