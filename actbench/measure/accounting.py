"""What one training step costs, shared by measured points (``point.py``) and predicted ones (``meta.py``).

Definitions (docs/design.md §4):

- activation_bytes: device bytes allocated by forward + loss and still alive when backward starts.
- peak_alloc_bytes: device peak over one whole step (forward, backward, optimizer step), model included.
- reserved_bytes: peak bytes a caching allocator held during that step (None where there is none).
- model_bytes: parameters + gradients + optimizer state (distinct storages).
- host_bytes: host memory holding saved tensors moved off the device (swap, L4/L5).
- flops_per_sample: FlopCounterMode FLOPs of forward + backward of the *unmodified* model, per sample
  (a property of the model, identical across strategies; checkpoint's recompute is not included).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from actbench.measure.tracker import LiveStorageTracker, unique_storage_bytes
from actbench.schema import MESSAGE_LIMIT, Measurement, error_line, one_line
from actbench.training.step import TrainingStep, training_loss
from actbench.training.tasks import Task


class OverBudget(Exception):
    """The step's peak exceeded the budget on a device where nothing enforces it (cpu, meta)."""


class HostOverBudget(Exception):
    """The step fitted on the device, but the pinned host memory it needs exceeds ``--host-budget``."""


def check_host_budget(pinned_bytes: int | None, host_budget_bytes: int | None, how: str) -> None:
    """Raise HostOverBudget when ``pinned_bytes`` (host memory held for swapped tensors) passes the budget."""
    if host_budget_bytes is not None and pinned_bytes is not None and pinned_bytes > host_budget_bytes:
        raise HostOverBudget(f"pinned host {pinned_bytes} B ({how}) > host budget {host_budget_bytes} B")


def check_budget(result: Measurement, budget_bytes: int | None, predicted: bool = False) -> None:
    if budget_bytes is not None and result.peak_alloc_bytes is not None and result.peak_alloc_bytes > budget_bytes:
        what = "predicted peak" if predicted else "peak"
        raise OverBudget(f"{what} {result.peak_alloc_bytes} B > budget {budget_bytes} B")


#: What allocation failures say when they are not a ``torch.OutOfMemoryError``: cuDNN's, and the host
#: allocator's on cpu ("[enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't allocate
#: memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)").
_OOM_TEXTS = ("out of memory", "cudnn_status_alloc_failed", "can't allocate memory", "cannot allocate memory",
              "defaultcpuallocator: not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OOM, or the plain RuntimeError cuDNN/cuBLAS or the CPU allocator raise when an allocation fails."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(t in text for t in _OOM_TEXTS)


def classified(fill: Callable[[Measurement], None], alloc_conf: str | None = None) -> Measurement:
    """Run ``fill`` on a fresh measurement; out-of-memory and over-budget become statuses, other errors raise."""
    started = time.perf_counter()
    result = Measurement(status="ok", alloc_conf=alloc_conf)
    try:
        fill(result)
    except OverBudget as exc:
        result.status, result.message = "over_budget", str(exc)
    except HostOverBudget as exc:
        result.status, result.message = "host_over_budget", str(exc)
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        result.status, result.message = "oom", error_line(exc)
    result.elapsed_s = round(time.perf_counter() - started, 3)
    return result


def count_flops(model: torch.nn.Module, inputs: Any, targets: Any, task: Task) -> tuple[int, int]:
    """(forward, forward+backward) FLOPs of one step of ``model`` on this batch, training ``task``'s loss
    (no optimizer step)."""
    with FlopCounterMode(display=False) as fwd_counter:
        loss = training_loss(model, inputs, targets, task=task)
    with FlopCounterMode(display=False) as bwd_counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    fwd = fwd_counter.get_total_flops()
    return fwd, fwd + bwd_counter.get_total_flops()


def model_breakdown(step: TrainingStep) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state (distinct storages), and their sum."""
    params = list(step.model.parameters())
    param_b = unique_storage_bytes(params)
    grad_b = unique_storage_bytes(p.grad for p in params if p.grad is not None)
    opt_b = unique_storage_bytes(step.optimizer_state_tensors())
    return {"param_bytes": param_b, "grad_bytes": grad_b, "optimizer_state_bytes": opt_b,
            "model_bytes": param_b + grad_b + opt_b}


def file_offloads_as_host(model: torch.nn.Module, tracker: LiveStorageTracker) -> None:
    """L4/L5 off CUDA: their "host" copies are plain tensors; make the tracker file them as host."""
    from actbench.actnn import set_host_scope

    set_host_scope(model, tracker.host_allocations, tracker.side_stream_allocations)


def batch_tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor of a batch: a tensor, or lists, tuples and dicts of them (detection's targets)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return [t for item in items for t in batch_tensors(item)]


def tracked_memory_step(step: TrainingStep, images: Any, targets: Any,
                        tracker: LiveStorageTracker, result: Measurement) -> None:
    """One step under the live-storage tracker: activation, peak and host bytes (cpu and meta)."""
    tracker.adopt(step.state_tensors())
    tracker.adopt(batch_tensors((images, targets)))
    tracker.step_start = len(tracker.device_events or ())  # what was adopted is the persistent state
    with tracker:
        tracker.reset_peak()
        before = tracker.live_bytes
        loss = step.forward_loss(images, targets)
        result.activation_bytes = tracker.live_bytes - before
        result.host_bytes = tracker.host_live_bytes
        step.backward_and_update(loss)
        del loss
    result.peak_alloc_bytes = tracker.peak_bytes
    result.reserved_bytes = None  # no caching allocator here


def with_census(note: str | None, model: torch.nn.Module) -> str | None:
    """``note`` plus, for an ActNN model, what its measured forward left uncompressed, by category and
    owner, as a share of the saved bytes (``actbench.actnn.last_forward_census``; docs/design.md §3)."""
    from actbench.actnn import last_forward_census

    census = last_forward_census(model)
    if census is None or not census.total_bytes:
        return note
    return one_line("; ".join(n for n in (note, census.describe_uncompressed(top=2)) if n), 2 * MESSAGE_LIMIT)
