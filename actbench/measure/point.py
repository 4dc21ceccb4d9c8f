"""Measuring one point on a real device: one model, one strategy, one batch size, one resolution.

Runs inside the worker child process (``actbench.worker``), never in the CLI process, so an
out-of-memory or a crash costs one row, not the sweep. What each number means is in
:mod:`actbench.measure.accounting`; how each device measures it is its profile
(:mod:`actbench.core.devices`). Predicted points (``meta``) are :mod:`actbench.measure.meta`'s.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from typing import Callable, Iterator

import torch

from actbench.core.devices import DeviceProfile, exact_steps
from actbench.measure.accounting import (check_budget, check_host_budget, classified, count_flops, file_offloads_as_host,
                                         model_breakdown, tracked_memory_step, with_census)
from actbench.measure.tracker import LiveStorageTracker, OpObserver
from actbench.training.models import real_depth
from actbench.planning.point import Point
from actbench.planning.step_time import OpRecorder, fill_prediction
from actbench.schema import Measurement
from actbench.strategies import StrategyOptions
from actbench.training.step import TrainingStep, build_training_step

log = logging.getLogger(__name__)


def measure_point(point: Point, alloc_conf: str | None = None,
                  fault: Callable[[], None] | None = None) -> Measurement:
    """Measure ``point`` in this process; OOM and over-budget become statuses, other errors raise."""
    prof = point.device
    if prof.predicts:
        raise ValueError(f"device {prof.name} predicts; its points are measured by actbench.measure.meta")
    return classified(lambda result: _measure_into(point, prof, result, fault), alloc_conf)


def _quartiles(values: list[float]) -> tuple[float, float | None]:
    median = statistics.median(values)
    if len(values) < 2:
        return median, None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q3 - q1


def spread(values: list[float]) -> float | None:
    """IQR ÷ median of ``values`` (None with fewer than 4: too few to say)."""
    if len(values) < 4:
        return None
    median, iqr = _quartiles(values)
    return None if iqr is None or not median else iqr / median


def timing_done(times: list[float], timed: int, prof: DeviceProfile, exact: bool = False) -> bool:
    """Whether timing may stop: at least ``timed`` steps, then the profile's minimum time and a settled
    spread (IQR within ``settle_iqr_fraction`` of the median), or one of its bounds reached.
    ``exact`` (``ACTBENCH_EXACT_STEPS=1``): after exactly ``timed`` steps."""
    if timed <= 0:
        return True
    if len(times) < timed:
        return False
    if exact:
        return True
    total = sum(times)
    if len(times) >= max(timed, prof.max_timed_steps) or total >= prof.max_timed_seconds:
        return True
    if total < prof.min_timed_seconds:
        return False
    s = spread(times)
    return s is not None and s <= prof.settle_iqr_fraction


def _time_steps(step: TrainingStep, images: torch.Tensor, targets: torch.Tensor, device: torch.device,
                prof: DeviceProfile, warmup: int, timed: int, clock: "StepClock") -> list[float]:
    """Seconds of each timed step: at least ``timed`` of them, more until :func:`timing_done`."""
    with clock.timing(device):
        for _ in range(warmup):
            step(images, targets)
    clock.count += warmup
    times: list[float] = []
    exact = exact_steps()
    while not timing_done(times, timed, prof, exact):
        prof.synchronize(device)
        start = time.perf_counter()
        step(images, targets)
        prof.synchronize(device)
        times.append(time.perf_counter() - start)
    clock.count += len(times)
    clock.seconds += sum(times)
    return times


class StepClock:
    """Every training step a point runs and their wall seconds (rows: ``steps_run``, ``steps_s``).

    Warm-up, the memory step and the timed steps all count: what a point costs beyond them (building
    the model, counting FLOPs, a child's start) is the harness's own cost, ``elapsed_s − steps_s``.
    """

    def __init__(self, prof: DeviceProfile) -> None:
        self.prof, self.count, self.seconds = prof, 0, 0.0

    @contextlib.contextmanager
    def timing(self, device: torch.device) -> Iterator[None]:
        """Add the block's synchronised wall seconds (its steps are counted by the caller)."""
        self.prof.synchronize(device)
        start = time.perf_counter()
        yield
        self.prof.synchronize(device)
        self.seconds += time.perf_counter() - start

    def record(self, result: Measurement) -> None:
        result.steps_run, result.steps_s = self.count, round(self.seconds, 3)


def _measure_into(point: Point, prof: DeviceProfile, result: Measurement,
                  fault: Callable[[], None] | None) -> None:
    device = prof.torch_device()
    torch.manual_seed(point.seed)
    prof.prepare(device, point.budget_bytes)
    model = _built_and_counted(point, device, result, fault)
    speed_model = point.speed_model
    recorder = OpRecorder.for_strategy(point.strategy)
    tracker = None if prof.has_caching_allocator else LiveStorageTracker(
        observer=recorder if speed_model is not None else None)
    host_scope = tracker.host_allocations if tracker is not None else contextlib.nullcontext
    step, note = build_training_step(
        point.strategy, model, device, StrategyOptions(checkpoint_segments=point.checkpoint_segments), host_scope,
        precision=point.precision, task=point.task,
    )
    result.strategy_note = note
    del model  # handed over (Strategy.prepare): on cuda every live tensor counts, so keep only step.model
    if tracker is not None:
        file_offloads_as_host(step.model, tracker)
    images, targets = point.task.batch(point.model, point.batch_size, point.size, device, point.seed + 1)

    # Warm-up first so optimizer state exists and the measured step is a steady-state step.
    warmup_before = max(1, point.warmup_steps) if prof.measures_after_all_warmup else 1
    clock = StepClock(prof)
    with clock.timing(device):
        for _ in range(warmup_before):
            step(images, targets)
        settled = step.settle_loss_scale(images, targets)  # fp16: until the gradient scaler stops skipping steps
        step.zero_grad()
        if tracker is None:
            with OpObserver(recorder) if speed_model is not None else contextlib.nullcontext():
                prof.allocator_memory_step(step, images, targets, device, result)
        else:
            tracked_memory_step(step, images, targets, tracker, result)
    clock.count += warmup_before + settled + 1  # + the memory step
    clock.record(result)
    _describe_memory_step(step, note, result)
    fill_prediction(result, recorder.ops, speed_model, point.batch_size)  # the memory step's ops, priced
    check_budget(result, point.budget_bytes)
    check_host_budget(result.host_bytes, point.host_budget_bytes, "host_bytes at the end of forward")
    if point.timed_steps > 0:
        _time_into(point, prof, step, images, targets, max(0, point.warmup_steps - warmup_before), clock, result)


def _built_and_counted(point: Point, device: torch.device, result: Measurement,
                       fault: Callable[[], None] | None) -> torch.nn.Module:
    """The point's model on ``device``, with its size, depth and FLOPs per sample recorded in ``result``."""
    with device:  # parameters are created (and initialised) on the device: fast for grown ResNets
        model = point.task.build(point.model, point.size)
    model = model.to(device)
    result.num_params = sum(p.numel() for p in model.parameters())
    result.depth = real_depth(model)
    if fault is not None:
        fault()
    # FLOPs on the unmodified model, batch 2 (BatchNorm in train mode needs > 1 value per channel).
    f_images, f_targets = point.task.batch(point.model, 2, point.size, device, point.seed)
    fwd, total = count_flops(model, f_images, f_targets, point.task)
    result.forward_flops_per_sample, result.flops_per_sample = fwd / 2, total / 2
    return model


def _describe_memory_step(step, note: str | None, result: Measurement) -> None:
    """The memory step's notes (census, precision) and the model's bytes, into ``result``."""
    result.strategy_note = with_census(note, step.model)  # what the measured forward left uncompressed, as on meta
    precision_note = step.precision_note()
    if precision_note is not None:
        result.strategy_note = "; ".join(n for n in (result.strategy_note, precision_note) if n)
    for name, value in model_breakdown(step).items():
        setattr(result, name, value)


def _time_into(point: Point, prof: DeviceProfile, step, images: torch.Tensor, targets: torch.Tensor,
               warmup: int, clock: StepClock, result: Measurement) -> None:
    """Timed steps after ``warmup`` more: samples/s median and IQR, step time, a noisy-spread message."""
    device = prof.torch_device()
    times = _time_steps(step, images, targets, device, prof, warmup, point.timed_steps, clock)
    clock.record(result)
    rates = [point.batch_size / t for t in times]
    result.samples_per_s_median, result.samples_per_s_iqr = _quartiles(rates)
    result.step_time_s_median = statistics.median(times)
    if result.samples_per_s_iqr is not None and result.samples_per_s_iqr > prof.settle_iqr_fraction * result.samples_per_s_median:
        result.message = (f"noisy: IQR {result.samples_per_s_iqr / result.samples_per_s_median:.0%} of median "
                          f"over {len(times)} steps ({sum(times):.1f} s)")
        log.warning("%s", result.message)
