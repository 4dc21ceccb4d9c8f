"""The step-time model: a predicted time for every op of one training step, on a device model.

An :class:`OpRecorder`, the live-storage tracker's observer, writes each op of a step down in
device-independent terms (FLOPs, DRAM bytes, dtype, host copy or not); :func:`predict_step` prices
that record on a :class:`~actbench.planning.device_models.DeviceModel`. How each op is priced:
docs/design.md §11.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from actbench.core.compat import op_bytes_moved, op_flops
from actbench.planning.device_models import DeviceModel
from actbench.schema import MAX_COLUMN_VALUE, number_problem

if TYPE_CHECKING:
    from actbench.strategies import Strategy

log = logging.getLogger(__name__)

#: Op kinds of a record: a device kernel, a copy between device and host (serial or overlapped), host-only,
#: and a call of a strategy's own Python (an ActNN layer, a checkpoint segment), named by what it is.
KERNEL, COPY, OVERLAPPED_COPY, HOST_ONLY, STRATEGY_CALL = "kernel", "copy", "overlapped_copy", "host", "strategy"
#: The operator namespace of the extension's ops (csrc/registration.cpp)
EXTENSION_NAMESPACE = "actbench"
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_CONVOLUTIONS = frozenset(("convolution", "convolution_backward", "_convolution", "cudnn_convolution"))


@dataclass(frozen=True)
class OpCost:
    """One op of a step, device-independent: what it computes and moves, in which dtype."""

    name: str
    kind: str
    flops: int = 0
    bytes_moved: int = 0
    dtype: str = "fp32"
    convolution: bool = False
    #: a backward kernel (its FLOP/s are the device model's ``backward_efficiency`` of a forward one's)
    backward: bool = False
    #: one of the extension's own ops (``actbench::``), priced at the model's ``extension_bytes_per_s``
    extension: bool = False
    #: a convolution's GEMM rows (its batch's output positions, N x H x W) and whether its kernel is 1x1:
    #: what a calibrated model's convolution rates are looked up by (0: not a batched convolution)
    rows: int = 0
    pointwise: bool = False

    @property
    def conv_curve(self) -> str:
        """The device model's convolution rate curve for this op (``DeviceModel.conv_rates``)."""
        return ("pointwise" if self.pointwise else "spatial") + ("_backward" if self.backward else "")


def host_copy_kind(strategy: str) -> str:
    """The strategy-call kind of one host copy a strategy's saved-tensor hook makes (swap's and
    save_on_cpu's Python per saved tensor, which a per-ATen-op host cost does not see)."""
    return f"host_copy:{strategy}"


@dataclass
class OpRecorder:
    """The tracker's observer: writes each op down as an :class:`OpCost` (one pass, the measured step).

    ``overlaps_copies``: the strategy's host copies run on a side stream (L4/L5's offloader).
    ``copy_call_kind``: each host copy also records one :data:`STRATEGY_CALL` of this kind, the Python
    of the saved-tensor hook that made it (:func:`host_copy_kind`; None: none recorded).
    """

    overlaps_copies: bool = False
    copy_call_kind: str | None = None
    ops: list[OpCost] = field(default_factory=list)
    _hook: Any = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def for_strategy(cls, strategy: "Strategy") -> "OpRecorder":
        """The recorder of a step trained under ``strategy``: its copies on a
        side stream where it offloads from its layers, a call beside each copy its own hook makes."""
        return cls(overlaps_copies=strategy.overlaps_host_copies,
                   copy_call_kind=host_copy_kind(strategy.name) if strategy.copies_from_a_hook else None)

    def start(self) -> None:
        """Also write down the strategy's own Python calls until :meth:`stop`: a module with a
        ``strategy_host_calls(args)`` method (ActNN's layers, checkpoint's segments) answers, on each call
        under autograd, (kind, count), recorded as ``count`` :data:`STRATEGY_CALL` entries named ``kind``."""
        if self._hook is None:
            self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._module_called)

    def stop(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _module_called(self, module: torch.nn.Module, args: tuple) -> None:
        calls = getattr(module, "strategy_host_calls", None)
        if calls is None or not torch.is_grad_enabled():
            return
        kind, count = calls(args)
        self.ops.extend(OpCost(kind, STRATEGY_CALL) for _ in range(count))

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any, copy: bool) -> None:
        """Record one op; ``copy``: it moves bytes between device and host storages."""
        name = getattr(getattr(func, "overloadpacket", func), "__name__", None) or str(func)
        outputs = _tensors(out)
        if copy:
            kind = OVERLAPPED_COPY if self.overlaps_copies else COPY
            self.ops.append(OpCost(name, kind, bytes_moved=sum(t.untyped_storage().nbytes() for t in outputs)))
            if self.copy_call_kind is not None:
                self.ops.append(OpCost(self.copy_call_kind, STRATEGY_CALL))
            return
        if not outputs:  # a query (its device, a size): no kernel runs
            self.ops.append(OpCost(name, HOST_ONLY))
            return
        inputs = _tensors(args) + _tensors(tuple(kwargs.values()))
        moved = op_bytes_moved(func, inputs, outputs)
        flops = op_flops(func, args, kwargs, out)
        if not moved and not flops:
            self.ops.append(OpCost(name, HOST_ONLY))
            return
        dtype = next((_DTYPES[t.dtype] for t in outputs if t.dtype in _DTYPES), "fp32")
        convolution = name in _CONVOLUTIONS
        rows, pointwise = _gemm_rows(name, args, outputs) if convolution else (0, False)
        self.ops.append(OpCost(name, KERNEL, flops, moved, dtype, convolution, name.endswith("_backward"),
                               getattr(func, "namespace", None) == EXTENSION_NAMESPACE, rows, pointwise))


def _gemm_rows(name: str, args: tuple, outputs: list[torch.Tensor]) -> tuple[int, bool]:
    """(GEMM rows, 1x1 kernel) of a convolution op: the output's positions over the batch (forward), the
    incoming gradient's (backward, whose first argument it is); (0, False) for an unbatched one."""
    output = args[0] if name == "convolution_backward" else (outputs[0] if outputs else None)
    weight = args[2] if name == "convolution_backward" else args[1]
    if not isinstance(output, torch.Tensor) or not isinstance(weight, torch.Tensor) or output.dim() < 3:
        return 0, False
    return output.numel() // max(output.shape[1], 1), all(k == 1 for k in weight.shape[2:])


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or outputs (nested in tuples and lists); a cheaper walk than
    pytree's for every op of a step."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


@dataclass(frozen=True)
class StepPrediction:
    """A step's predicted seconds and where they go (each part on its own, before overlap)."""

    step_s: float
    device_s: float
    host_s: float
    compute_bound_s: float
    memory_bound_s: float
    copy_s: float
    overlapped_copy_s: float
    launch_s: float
    ops: int
    #: host seconds of the strategy's own Python (:data:`STRATEGY_CALL` entries; part of ``host_s``)
    strategy_host_s: float = 0.0

    def samples_per_s(self, batch_size: int) -> float:
        return batch_size / self.step_s if self.step_s > 0 else float("inf")


def kernel_seconds(op: OpCost, model: DeviceModel) -> tuple[float, float]:
    """(compute seconds, memory seconds) of one kernel on ``model``, launch not included."""
    dtype = "tf32" if op.dtype == "fp32" and op.convolution and model.conv_fp32_as_tf32 else op.dtype
    measured = model.conv_rate(op.dtype, op.conv_curve, op.rows) if op.convolution else None
    rate = measured or (model.peak_for(dtype) * model.efficiency_for(dtype)
                        * (model.backward_efficiency if op.backward else 1.0))
    compute = op.flops / rate if op.flops else 0.0
    if op.extension and model.extension_bytes_per_s is not None:
        return compute, op.bytes_moved / model.extension_bytes_per_s
    if op.name in model.op_bytes_per_s:
        return compute, op.bytes_moved / model.op_bytes_per_s[op.name]
    memory = op.bytes_moved / (model.dram_bytes_per_s * model.memory_efficiency)
    return compute, memory


def copy_seconds(op: OpCost, model: DeviceModel) -> float:
    """Seconds of one host<->device copy (the slower direction's bandwidth: a step copies both ways)."""
    return op.bytes_moved / min(model.h2d_bytes_per_s, model.d2h_bytes_per_s)


def predict_step(ops: list[OpCost], model: DeviceModel) -> StepPrediction:
    """The step time of the recorded ``ops`` on ``model`` (docs/design.md §11: how each op is priced)."""
    compute_bound = memory_bound = serial = copies = overlapped = launches = strategy = 0.0
    dispatched = 0
    for op in ops:
        if op.kind == STRATEGY_CALL:
            strategy += model.strategy_call_seconds(op.name)
            continue
        dispatched += 1
        if op.kind == HOST_ONLY:
            continue
        launches += model.launch_s
        if op.kind == KERNEL:
            compute, memory = kernel_seconds(op, model)
            serial += max(compute, memory) + model.launch_s
            if compute >= memory:
                compute_bound += compute
            else:
                memory_bound += memory
        elif op.kind == OVERLAPPED_COPY and model.async_copies:
            overlapped += copy_seconds(op, model) + model.launch_s
        else:
            copies += copy_seconds(op, model)
            serial += copy_seconds(op, model) + model.launch_s
    device = max(serial, overlapped)
    host = dispatched * model.host_op_s + strategy
    step = max(device, host) if model.host_overlaps_device else device + host
    return StepPrediction(step, device, host, compute_bound, memory_bound, copies, overlapped, launches, dispatched,
                          strategy)


def fill_prediction(result: Any, ops: list[OpCost] | tuple[OpCost, ...], model: DeviceModel | None,
                    batch_size: int) -> None:
    """Set a measurement's ``predicted_step_s``, ``predicted_samples_per_s`` and ``device_model`` from
    ``ops`` priced on ``model`` (None: no model, the columns stay empty). A prediction a row cannot hold
    (not finite, as ``schema.number_problem`` checks every row read back, which skips a row with
    ``Infinity`` in it) leaves the columns empty, with a warning."""
    if model is None or not ops:
        return
    prediction = predict_step(list(ops), model)
    rate = prediction.samples_per_s(batch_size)
    problem = (number_problem("predicted_step_s", prediction.step_s, 0, MAX_COLUMN_VALUE)
               or number_problem("predicted_samples_per_s", rate, 0, MAX_COLUMN_VALUE))
    if problem is not None:
        log.warning("device model %s: %s; the predicted columns are left empty", model.name, problem)
        return
    result.predicted_step_s = prediction.step_s
    result.predicted_samples_per_s = rate
    result.device_model = model.name


@dataclass(frozen=True)
class StrategyChoice:
    """One strategy at one batch on a named GPU: whether it fits, its predicted bytes and speed."""

    strategy: str
    status: str
    peak_alloc_bytes: int | None
    reserved_bytes: int | None
    predicted_samples_per_s: float | None
    message: str

    @property
    def fits(self) -> bool:
        return self.status == "ok"


def fastest_first(choices: list[StrategyChoice]) -> list[StrategyChoice]:
    """Those that fit, fastest first, then those that do not (in the order given)."""
    fitting = sorted((c for c in choices if c.fits), key=lambda c: -(c.predicted_samples_per_s or 0.0))
    return fitting + [c for c in choices if not c.fits]
