"""The ``meta`` device: a training step sized on fake tensors (no compute, no memory).

A meta point runs the cpu protocol and op set on fake tensors that claim to be on the CPU, with the
same :class:`LiveStorageTracker`; its rows are predictions and carry no throughput. A
:class:`MetaSessions` keeps the last built model, so a search's further batch sizes cost one tracked
step each. The protocol, what is reused and what mixed precision does there: docs/design.md §4.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager

import torch

from actbench.core import compat
from actbench.measure.accounting import (OverBudget, check_budget, check_host_budget, classified, count_flops,
                                         file_offloads_as_host, model_breakdown, tracked_memory_step, with_census)
from actbench.planning.allocator_model import AllocatorConfig, pinned_host_peak, replay_steps
from actbench.measure.tracker import LiveStorageTracker
from actbench.planning.device_models import DeviceModel
from actbench.planning.point import Point
from actbench.planning.step_time import OpCost, OpRecorder, fill_prediction
from actbench.training.models import grown_resnet152_layers, real_depth
from actbench.schema import GROWABLE_MODEL, Measurement, PointConfig
from actbench.strategies import StrategyOptions
from actbench.training.step import TrainingStep, build_training_step

#: The device fake tensors claim to be on: the CPU, so a meta step runs the very op set (and saves
#: the very tensors) of a ``cpu`` measurement, which tests hold it against.
META_FAKE_DEVICE = torch.device("cpu")


class _CurrentHostScope:
    """swap's host scope, bound once at build time, forwarding to the tracker of the current step."""

    def __init__(self) -> None:
        self.tracker: LiveStorageTracker | None = None

    def __call__(self) -> ContextManager[None]:
        return self.tracker.host_allocations() if self.tracker is not None else contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class StepTrace:
    """A meta step's allocations in order (docs/design.md §10): the adopted state (parameters,
    optimizer state, batch), the step's device events, and its host events."""

    persistent: tuple[tuple[int, int], ...]
    step: tuple[tuple[int, int], ...]
    host: tuple[tuple[int, int], ...]
    #: handles allocated on CUDA's side stream (L4/L5's prefetched copies)
    side_stream: frozenset[int] = frozenset()
    #: the step's ops for the step-time model (actbench/planning/step_time.py)
    ops: tuple[OpCost, ...] = ()

    @classmethod
    def of(cls, tracker: LiveStorageTracker) -> "StepTrace":
        events = tracker.device_events or []
        ops = tuple(tracker.observer.ops) if isinstance(tracker.observer, OpRecorder) else ()
        return cls(tuple(events[:tracker.step_start]), tuple(events[tracker.step_start:]),
                   tuple(tracker.host_events or ()), frozenset(tracker.side_stream_serials), ops)


#: Traces kept for points a twin strategy may reuse (L5 replays L4's step with its own allocator setting).
_TRACES_KEPT = 16


@dataclasses.dataclass
class _Session:
    mode: Any
    step: TrainingStep
    host_scope: _CurrentHostScope
    note: str | None
    num_params: int
    depth: int | None
    #: the parameters a real step trains (None: all), for the warm-up (:func:`_warm_optimizer_state`)
    trained: tuple[torch.Tensor, ...] | None = None


class MetaSessions:
    """Measures ``meta`` points, reusing the last built model when only the batch size changes."""

    def __init__(self, speed_model: DeviceModel | None = None) -> None:
        #: the device model every point's step time is priced on (None: the point's own)
        self.speed_model = speed_model
        self._key: PointConfig | None = None
        self._session: _Session | None = None
        self._flops: dict[tuple, tuple[float, float]] = {}
        self._trained: dict[tuple, frozenset[str] | None] = {}  # names of parameters a step trains (None: all)
        self._done: dict[PointConfig, Measurement] = {}  # sizes of points already stepped
        self._traces: dict[PointConfig, StepTrace] = {}  # their allocation traces, the latest few

    def measure_point(self, point: Point, fault: Callable[[], None] | None = None) -> Measurement:
        """Predict ``point``; over-budget (and an out-of-memory raised by a fault) become statuses."""
        return classified(lambda result: self.measure(point, result, fault))

    def measure(self, point: Point, result: Measurement, fault: Callable[[], None] | None = None) -> None:
        """Fill ``result`` for ``point``; raises OverBudget, or whatever the fake step raised.

        A strategy whose step is another's on meta (``Strategy.same_on_meta_as``: L5 is L4 with an
        allocator setting meta does not model) reuses that strategy's sizes.
        """
        if not point.device.predicts:
            raise ValueError(f"MetaSessions predicts points of a predicting device, got device '{point.device.name}'")
        twin_name = point.strategy.same_on_meta_as or point.strategy.name
        twin = dataclasses.replace(point.config, strategy=twin_name, budget_bytes=None, gpu=None,
                                   host_budget_bytes=None)
        speed_model = self.speed_model or point.speed_model
        # the op record is made only when a device model will price it (docs/design.md §11)
        priced = speed_model is None or (twin in self._traces and bool(self._traces[twin].ops))
        if twin in self._done and fault is None and twin in self._traces and priced:
            for f in dataclasses.fields(Measurement):
                if f.name not in ("status", "message", "elapsed_s", "alloc_conf"):
                    setattr(result, f.name, getattr(self._done[twin], f.name))
            result.strategy_note = self._done[twin].strategy_note
        else:
            trace = self._measure(point, result, fault, record_ops=speed_model is not None)
            self._done[twin] = dataclasses.replace(result)
            self._traces[twin] = trace
            while len(self._traces) > _TRACES_KEPT:
                del self._traces[next(iter(self._traces))]
        predict_reserved(point, result, self._traces[twin])
        fill_prediction(result, self._traces[twin].ops, speed_model, point.batch_size)
        check_budget(result, point.budget_bytes, predicted=True)
        check_host_budget(pinned_host_peak(self._traces[twin].host), point.host_budget_bytes,
                          "predicted: power-of-two pinned blocks, cached per size")

    def _measure(self, point: Point, result: Measurement, fault: Callable[[], None] | None,
                 record_ops: bool = False) -> StepTrace:
        key = dataclasses.replace(point.config, batch_size=0, budget_bytes=None, warmup_steps=0, timed_steps=0, gpu=None,
                                  host_budget_bytes=None)
        torch.manual_seed(point.seed)
        session = self._session if key == self._key else None
        if session is None:
            self._key = self._session = None  # a failed build must not leave a half-made session
            session = self._build(point, result, fault)
        elif fault is not None:
            fault()
        result.num_params, result.depth, result.strategy_note = session.num_params, session.depth, session.note
        with session.mode, META_FAKE_DEVICE:
            result.forward_flops_per_sample, result.flops_per_sample = self._count_flops(point, session.mode)
            images, targets = point.task.batch(point.model, point.batch_size, point.size, META_FAKE_DEVICE,
                                               point.seed + 1)
            if key != self._key:
                _warm_optimizer_state(session.step, session.trained)
            session.step.zero_grad()
            recorder = OpRecorder.for_strategy(point.strategy)
            tracker = LiveStorageTracker(record=True, observer=recorder if record_ops else None)
            session.host_scope.tracker = tracker
            file_offloads_as_host(session.step.model, tracker)
            tracked_memory_step(session.step, images, targets, tracker, result)
            del images, targets
            result.strategy_note = with_census(session.note, session.step.model)
            for name, value in model_breakdown(session.step).items():
                setattr(result, name, value)
        self._key, self._session = key, session
        return StepTrace.of(tracker)

    def _build(self, point: Point, result: Measurement, fault: Callable[[], None] | None) -> _Session:
        mode = compat.fake_tensor_mode()
        model = _build_fake_model(point, mode)
        with mode, META_FAKE_DEVICE:
            num_params = sum(p.numel() for p in model.parameters())
            depth = real_depth(model)
            if fault is not None:
                fault()
            self._count_flops(point, mode, model)
            names = self._trained[(point.model, point.size, point.seed)]
            trained = None if names is None else tuple(p for n, p in model.named_parameters() if n in names)
            options = StrategyOptions(checkpoint_segments=point.checkpoint_segments)
            host_scope = _CurrentHostScope()
            assumed = point.task.meta_note(model)  # detection: its data-dependent counts at their upper bounds
            step, note = build_training_step(point.strategy, model, META_FAKE_DEVICE, options, host_scope,
                                             precision=point.precision, task=point.task)
            note = "; ".join(n for n in (note, assumed) if n) or None
        return _Session(mode, step, host_scope, note, num_params, depth, trained)

    def _count_flops(self, point: Point, mode: Any, model: torch.nn.Module | None = None) -> tuple[float, float]:
        """Per-sample (forward, forward+backward) FLOPs of the unmodified model, once per model and size.

        A grown ResNet-152 past :data:`FLOP_BASIS` gets them from the counts at those few extra blocks
        (:func:`grown_flops`, exact): a depth search's probes of thousands of layers skip a fake step
        that cost about a sixth of each probe.
        """
        key = (point.model, point.size, point.seed)
        if key not in self._flops and point.model.name == GROWABLE_MODEL and point.model.extra_blocks > max(FLOP_BASIS):
            basis = [dataclasses.replace(point, config=dataclasses.replace(
                point.config, model=dataclasses.replace(point.model, extra_blocks=k))) for k in FLOP_BASIS]
            counts = [self._count_flops(p, mode) for p in basis]
            trained = [self._trained[(p.model, p.size, p.seed)] for p in basis]
            if all(t is None for t in trained):  # every parameter trains: so it does at any depth
                self._flops[key] = grown_flops(point.model.extra_blocks, counts)
                self._trained[key] = None
        if key not in self._flops:
            if model is None:
                model = _build_fake_model(point, mode)
            images, targets = point.task.batch(point.model, 2, point.size, META_FAKE_DEVICE, point.seed)
            # The same backward tells which parameters a step reaches (GoogLeNet's and Inception's
            # auxiliary heads are not in the loss): only those get optimizer state in the warm-up.
            reached: set[int] = set()
            handles = [p.register_post_accumulate_grad_hook(lambda p: reached.add(id(p)))
                       for p in model.parameters() if p.requires_grad]
            try:
                fwd, total = count_flops(model, images, targets, point.task)
            finally:
                for handle in handles:
                    handle.remove()
            self._flops[key] = (fwd / 2, total / 2)
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            self._trained[key] = (None if all(id(p) in reached for _, p in named)
                                  else frozenset(n for n, p in named if id(p) in reached))
        return self._flops[key]


#: Extra blocks at which a grown ResNet-152's FLOPs are counted; beyond them they are derived (grown_flops).
FLOP_BASIS: tuple[int, ...] = (0, 1, 3)


def grown_flops(extra_blocks: int, basis_counts: list[tuple[float, float]]) -> tuple[float, float]:
    """FLOPs of ResNet-152 grown by ``extra_blocks``, from its counts at :data:`FLOP_BASIS`.

    Extra blocks are plain Bottlenecks appended to stages 2 and 3 (``models.grown_resnet152_layers``),
    all alike within a stage, so FLOPs are affine in the two stage sizes: F = F0 + a·Δs2 + b·Δs3. The
    counts at 1 and 3 extra blocks (stage growth (0, 1) and (1, 2)) give a and b exactly; a test holds
    the result to a direct count.
    """
    base = grown_resnet152_layers(0)
    growth = [tuple(s - b for s, b in zip(grown_resnet152_layers(k), base)) for k in FLOP_BASIS]
    (u2, u3), (v2, v3) = growth[1][1:3], growth[2][1:3]
    det = u2 * v3 - u3 * v2
    if growth[0] != (0, 0, 0, 0) or det == 0 or any(g[0] or g[3] for g in growth):
        raise ValueError(f"FLOP_BASIS {FLOP_BASIS} does not determine the per-block FLOPs of stages 2 and 3")
    s2, s3 = (s - b for s, b in zip(grown_resnet152_layers(extra_blocks)[1:3], base[1:3]))
    result = []
    for f0, f1, f3 in zip(*basis_counts):
        d1, d3 = f1 - f0, f3 - f0
        a, b = (d1 * v3 - d3 * u3) / det, (u2 * d3 - v2 * d1) / det  # per block of stage 2, of stage 3
        result.append(f0 + a * s2 + b * s3)
    return result[0], result[1]


def predict_reserved(point: Point, result: Measurement, trace: StepTrace) -> None:
    """Fill ``reserved_bytes`` from the caching-allocator model; with a GPU spec, decide on it.

    The trace is replayed as a training run does it (persistent state, a warm-up step, the measured
    step) under the strategy's allocator configuration (L5: expandable segments), with at most
    ``point.budget_bytes`` reserved, as a GPU capped at the budget would (docs/design.md §10). A step
    the capped replay cannot complete gets the reserved bytes of an unbounded replay (what it would
    need, above the budget). With ``--budget`` alone the decision stays on the peak; with a GPU spec
    (``point.gpu``) the replay also holds cuBLAS's and cuBLASLt's workspaces, and a request it cannot
    reserve is a predicted out-of-memory: ``over_budget``.
    """
    config = AllocatorConfig.parse(point.strategy.cuda_alloc_conf)
    gpu = point.gpu
    persistent = trace.persistent
    if gpu is not None:
        persistent = tuple((-1 - i, n) for i, n in enumerate(gpu.workspace_allocations())) + persistent
    bounded = replay_steps(persistent, trace.step, config, capacity=point.budget_bytes, side_stream=trace.side_stream)
    if not bounded.oom:
        result.reserved_bytes = bounded.reserved_peak
        return
    result.reserved_bytes = replay_steps(persistent, trace.step, config, side_stream=trace.side_stream).reserved_peak
    if gpu is not None:
        raise OverBudget(f"predicted reserved {result.reserved_bytes} B > {point.budget_bytes} B usable on "
                         f"{gpu.describe()}: the caching-allocator model could not reserve a {bounded.oom_request} B "
                         f"request ({bounded.reserved_at_oom} B reserved)")


def _build_fake_model(point: Point, mode: Any) -> torch.nn.Module:
    """``point``'s model with fake parameters and buffers on :data:`META_FAKE_DEVICE`.

    The constructor runs outside fake mode with its parameters on the ``meta`` device
    (``compat.parameters_on_meta``): constructors that read data — ``trunc_normal_``'s rejection
    sampling (ViT, Swin, ConvNeXt, MaxViT, GoogLeNet), RegNet's widths computed with ``.tolist()`` —
    ended in ``DataDependentOutputException`` under fake tensors. Parameters are then fake tensors of
    the same shapes, strides and dtypes, and buffers fake copies of the real ones
    (``compat.fake_module``): the storages, hence every byte count, are those of a model built
    inside fake mode.
    """
    with compat.dispatch_modes_disabled(), compat.parameters_on_meta(), META_FAKE_DEVICE:
        model = point.task.build(point.model, point.size)  # outside any fake mode, also when called in one
    with compat.dispatch_modes_disabled():  # its buffers are real tensors until converted
        return compat.fake_module(model, mode, META_FAKE_DEVICE)


def _warm_optimizer_state(step: TrainingStep, trained: tuple[torch.Tensor, ...] | None = None) -> None:
    """What a warm-up step leaves behind, without its forward and backward (docs/design.md §4).

    An optimizer step on zero gradients creates the optimizer state (SGD's momentum buffers) with
    the shapes a real step gives; gradients are then dropped, as before every measured step. Only
    the parameters a real backward reaches (``trained``: those the FLOP count's backward reached on
    the unmodified model; None: all) get a gradient: a parameter outside the loss (an auxiliary
    head) gets no momentum in a real warm-up either. They are matched by identity: a strategy
    changes the model it is handed in place (``Strategy.prepare``), so the unmodified model's
    parameters are the step's, whatever names a wrapper gives them (checkpoint's ``inner``). The
    ActNN controller's per-step statistics (a few floats per layer and sample) are not created: a
    bounded, tiny difference from the cpu protocol, inside the tolerance tests hold meta to.
    """
    params = [p for p in step.model.parameters() if p.requires_grad]
    if trained is not None:
        chosen = {id(p) for p in trained}
        params = [p for p in params if id(p) in chosen]
        if not params:
            raise RuntimeError("the prepared model has none of the parameters it was built with: a strategy "
                               "must change the model it is handed in place (Strategy.prepare), not copy it")
    for param in params:
        param.grad = torch.zeros_like(param)
    step.optimizer.step()
    step.zero_grad()
