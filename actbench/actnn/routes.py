"""Which functional calls the hook path reroutes to a twin's autograd function, and how.

The rerouting ``TorchFunctionMode`` of ``hooks.py`` looks each torch function it sees up in
:func:`routes`; a route returns the twin's output, or ``NotImplemented`` to let torch run the call
as it is (a level that keeps it exact, an option the twin does not compute, a tensor too small to be
worth one). What each twin keeps and why: docs/design.md §3 ("The saved-tensor hook path").
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from actbench.core import compat
from actbench.actnn.controller import Controller, LayerSlot
from actbench.actnn.functions import (AvgPool2dFunction, ClampFunction, DerivativeFunction, DropoutFunction,
                                      MaskScaleFunction, MaxPool2dFunction, NormalizeFunction, PoolParams)
from actbench.actnn.loss_functions import AbsFunction, DenseCrossEntropyFunction, dense_cross_entropy_applies
from actbench.actnn.pool3d import MaxPool3dFunction, Pool3dParams, triple


class Packer(Protocol):
    """What a route asks of the hook path's packer (``hooks.SavedTensorPacker``)."""

    controller: Controller

    @property
    def in_model(self) -> bool: ...

    def functional_slot(self, what: str, kind: str) -> LayerSlot: ...


def _arg(args: tuple, kwargs: dict, position: int, name: str, default):
    return args[position] if len(args) > position else kwargs.get(name, default)


def _clamp(lo: float | None, hi: float | None, inplace_default: bool, what: str, inplace_at: int = 0,
           bounds_at: int | None = None):
    def route(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
        if not packer.controller.config.masks:
            return NotImplemented
        low, high = lo, hi
        if bounds_at is not None:  # F.hardtanh(x, min_val, max_val, inplace)
            low = float(_arg(args, kwargs, bounds_at, "min_val", -1.0))
            high = float(_arg(args, kwargs, bounds_at + 1, "max_val", 1.0))
            inplace = bool(_arg(args, kwargs, bounds_at + 2, "inplace", False))
        else:
            inplace = inplace_default or bool(_arg(args, kwargs, inplace_at, "inplace", False))
        if inplace and x.is_leaf:
            return NotImplemented  # torch raises for in-place on a leaf that requires grad
        return ClampFunction.apply(x, low, high, packer.functional_slot(what, "mask"), inplace)
    return route


def _dropout(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    p = float(_arg(args, kwargs, 0, "p", 0.5))
    training = bool(_arg(args, kwargs, 1, "training", True))
    inplace = bool(_arg(args, kwargs, 2, "inplace", False))
    if not training or inplace or not 0.0 < p < 1.0 or not packer.controller.config.masks:
        return NotImplemented
    return DropoutFunction.apply(x, p, packer.functional_slot("dropout", "mask"))


def _hardsigmoid(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    inplace = bool(_arg(args, kwargs, 0, "inplace", False))
    if not packer.controller.config.masks or (inplace and x.is_leaf):
        return NotImplemented
    return MaskScaleFunction.apply(x, "hardsigmoid", 0.0, "", packer.functional_slot("hardsigmoid", "mask"), inplace)


def _smooth(kind: str, inplace_at: int | None = None, inplace_default: bool = False):
    def route(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
        config = packer.controller.config
        if config.act_bits is None or x.numel() < config.hook_min_elements:
            return NotImplemented  # L0: torch's own saving (exact); small: not worth a twin
        approximate = "none"
        if kind == "gelu":
            approximate = str(_arg(args, kwargs, 0, "approximate", "none"))
        inplace = inplace_default or (inplace_at is not None and bool(_arg(args, kwargs, inplace_at, "inplace", False)))
        if inplace and x.is_leaf:
            return NotImplemented
        return DerivativeFunction.apply(x, kind, approximate, inplace, packer.functional_slot(kind, "act"))
    return route


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[-1]))


def _max_pool2d(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    """F.max_pool2d -> an int8 argmax (aten keeps the input and int64 indices)."""
    kernel = _arg(args, kwargs, 0, "kernel_size", None)
    stride = _arg(args, kwargs, 1, "stride", None)
    padding = _arg(args, kwargs, 2, "padding", 0)
    dilation = _arg(args, kwargs, 3, "dilation", 1)
    ceil_mode = bool(_arg(args, kwargs, 4, "ceil_mode", False))
    if (not packer.controller.config.masks or kernel is None or _arg(args, kwargs, 5, "return_indices", False)
            or x.dim() not in (3, 4)):
        return NotImplemented
    k = _pair(kernel)
    if k[0] * k[1] > 128:
        return NotImplemented
    s = _pair(stride) if stride not in (None, [], ()) else k
    p = PoolParams(k, s, _pair(padding), _pair(dilation), ceil_mode)
    return MaxPool2dFunction.apply(x, p, packer.functional_slot("max_pool2d", "pool"))


def _max_pool3d(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    """F.max_pool3d -> int8 window offsets, as the MaxPool3d twin (aten keeps the input and int64 indices)."""
    kernel = _arg(args, kwargs, 0, "kernel_size", None)
    stride = _arg(args, kwargs, 1, "stride", None)
    if (not packer.controller.config.masks or kernel is None or _arg(args, kwargs, 5, "return_indices", False)
            or x.dim() not in (4, 5)):
        return NotImplemented
    k = triple(kernel)
    if math.prod(k) > 128:
        return NotImplemented
    p = Pool3dParams(k, triple(stride) if stride not in (None, [], ()) else k,
                     triple(_arg(args, kwargs, 2, "padding", 0)), triple(_arg(args, kwargs, 3, "dilation", 1)),
                     bool(_arg(args, kwargs, 4, "ceil_mode", False)))
    return MaxPool3dFunction.apply(x, p, packer.functional_slot("max_pool3d", "pool"))


def _avg_pool2d(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    """F.avg_pool2d -> keeps only the input's shape (aten keeps the whole input)."""
    kernel = _arg(args, kwargs, 0, "kernel_size", None)
    if kernel is None or x.dim() not in (3, 4):
        return NotImplemented
    stride = _arg(args, kwargs, 1, "stride", None)
    k = _pair(kernel)
    s = _pair(stride) if stride not in (None, [], ()) else k
    return AvgPool2dFunction.apply(
        x, list(k), list(s), list(_pair(_arg(args, kwargs, 2, "padding", 0))),
        bool(_arg(args, kwargs, 3, "ceil_mode", False)), bool(_arg(args, kwargs, 4, "count_include_pad", True)),
        _arg(args, kwargs, 5, "divisor_override", None), packer.functional_slot("avg_pool2d", "pool"),
    )


def _normalize(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    """F.normalize(x, p=2) -> its output and per-row denominator (:class:`NormalizeFunction`)."""
    config = packer.controller.config
    p = float(_arg(args, kwargs, 0, "p", 2.0))
    if (p != 2.0 or _arg(args, kwargs, 3, "out", None) is not None or config.act_bits is None
            or x.numel() < config.hook_min_elements):
        return NotImplemented  # L0: torch's own saving (exact); small: not worth a twin
    dim = _arg(args, kwargs, 1, "dim", 1)
    eps = float(_arg(args, kwargs, 2, "eps", 1e-12))
    return NormalizeFunction.apply(x, dim, eps, packer.functional_slot("normalize", "act"))


def _cross_entropy(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    """F.cross_entropy over a map of classes -> its gradient direction at ``act_bits`` (loss_functions.py)."""
    config = packer.controller.config
    target = _arg(args, kwargs, 0, "target", None)
    reduction = str(_arg(args, kwargs, 5, "reduction", "mean"))
    if (config.act_bits is None or x.numel() < config.hook_min_elements or not dense_cross_entropy_applies(
            x, target, _arg(args, kwargs, 1, "weight", None), reduction,
            float(_arg(args, kwargs, 6, "label_smoothing", 0.0)),
            (_arg(args, kwargs, 2, "size_average", None), _arg(args, kwargs, 4, "reduce", None)),
            inside_model=bool(packer.in_model))):
        return NotImplemented  # L0, a classifier's logits, or an option the twin does not compute
    ignore_index = int(_arg(args, kwargs, 3, "ignore_index", -100))
    return DenseCrossEntropyFunction.apply(x, target, ignore_index, reduction,
                                           packer.functional_slot("cross_entropy", "act"),
                                           packer.functional_slot("cross_entropy_counted", "mask"))


def _abs(packer: Packer, x: torch.Tensor, args: tuple, kwargs: dict):
    """|x| -> a 1-bit sign mask (loss_functions.py)."""
    if not packer.controller.config.masks or args or kwargs:
        return NotImplemented
    return AbsFunction.apply(x, packer.functional_slot("abs", "mask"))


_ROUTES: dict = {}


def routes() -> dict:
    """torch function -> route (built once: the table names torch functions and Tensor methods)."""
    if not _ROUTES:
        F = torch.nn.functional
        relu = _clamp(None, None, False, "relu")
        relu_ = _clamp(None, None, True, "relu")
        _ROUTES.update({
            F.relu: relu, torch.relu: relu, torch.Tensor.relu: relu,
            torch.relu_: relu_, torch.Tensor.relu_: relu_, F.relu_: relu_,
            F.relu6: _clamp(0.0, 6.0, False, "relu6"),
            F.hardtanh: _clamp(None, None, False, "hardtanh", bounds_at=0),
            F.dropout: _dropout,
            F.hardsigmoid: _hardsigmoid,
            F.gelu: _smooth("gelu"),
            F.silu: _smooth("silu", inplace_at=0),
            F.hardswish: _smooth("hardswish", inplace_at=0),
            F.max_pool2d: _max_pool2d,
            F.max_pool3d: _max_pool3d,
            F.normalize: _normalize,
            F.avg_pool2d: _avg_pool2d, compat.builtin_avg_pool2d(): _avg_pool2d,
            F.cross_entropy: _cross_entropy,
            torch.abs: _abs, torch.Tensor.abs: _abs,
            torch.tanh: _smooth("tanh"), torch.Tensor.tanh: _smooth("tanh"), F.tanh: _smooth("tanh"),
            torch.sigmoid: _smooth("sigmoid"), torch.Tensor.sigmoid: _smooth("sigmoid"), F.sigmoid: _smooth("sigmoid"),
        })
    return _ROUTES
