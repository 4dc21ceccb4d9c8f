"""ActNN modules: subclasses of their PyTorch twins (same constructor, forward and state_dict keys).

In training with gradients flowing they run the compressing functions of
:mod:`actbench.actnn.functions`; in eval mode or without gradients they are exactly the torch
module (nothing is compressed when nothing is saved). Each module keeps a :class:`LayerSlot`
(its controller and index); :func:`actbench.actnn.convert` attaches it. A module that was never
converted (built directly, or re-classed by hand) has no level and no controller: compressing with
it raises :class:`NotConvertedError` instead of guessing a level for it.
"""

from __future__ import annotations

import collections.abc
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.convnext import LayerNorm2d
from torchvision.ops import StochasticDepth

from actbench.actnn.controller import ROLE_FULL_PRECISION, SAVED_ROLE, LayerSlot
from actbench.actnn.pool3d import MaxPool3dFunction, Pool3dParams, triple
from actbench.actnn.functions import (
    BatchNormFunction,
    ClampFunction,
    ConvFunction,
    ConvParams,
    DerivativeFunction,
    DropoutFunction,
    LayerNormFunction,
    LinearFunction,
    AvgPool2dFunction,
    MaskScaleFunction,
    MaxPool2dFunction,
    PoolParams,
    autocast_active,
)

KIND_CONV, KIND_LINEAR, KIND_BN, KIND_MASK, KIND_POOL = "conv", "linear", "bn", "mask", "pool"
KIND_NORM, KIND_ACT, KIND_QK = "norm", "act", "qk"


def _pair_of(value: Any) -> tuple:
    """A kernel size, stride, padding or dilation as (height, width): pooling layers take either form."""
    return tuple(value) if isinstance(value, collections.abc.Iterable) else (value, value)


class NotConvertedError(RuntimeError):
    """An ActNN layer compressed without a controller: it was not made by ``actbench.actnn.convert``."""


class ActNNModule:
    """Mixin: the slot, and the rule for when to compress."""

    actnn_kind: str = ""
    #: convert leaves this layer's submodules alone: the twin's forward uses their parameters itself
    actnn_covers_children: bool = False

    def attach(self, slot: LayerSlot) -> None:
        """Bind this layer to a controller (done by convert)."""
        object.__setattr__(self, "_actnn_slot", slot)

    def actnn_extra_slots(self) -> tuple[tuple[str, str, float], ...]:
        """Further tensors this layer compresses: (name suffix, kind, cost factor) each; convert
        registers them after the layer's own slot and attaches them with :meth:`attach_extra`."""
        return ()

    def attach_extra(self, suffix: str, slot: LayerSlot) -> None:
        self.__dict__.setdefault("_actnn_extra", {})[suffix] = slot

    def extra_slot(self, suffix: str) -> LayerSlot:
        self.actnn_slot  # raises NotConvertedError for a layer convert never saw
        return self.__dict__["_actnn_extra"][suffix]

    @property
    def attached_slot(self) -> LayerSlot | None:
        """The slot convert attached, or None for a layer that was never converted."""
        return self.__dict__.get("_actnn_slot")

    @property
    def actnn_slot(self) -> LayerSlot:
        slot = self.attached_slot
        if slot is None:
            # A silent private controller would train at a level nobody chose, outside the model's
            # bit budget and swap (the level lives in the model's one Controller, levels.py).
            raise NotConvertedError(
                f"ActNN layer {type(self).__name__} ({self.extra_repr()}) was never converted, so it has no "
                f"level or controller; build ActNN models with actbench.actnn.convert(model, level) instead of "
                f"constructing ActNN layers directly"
            )
        return slot

    #: whether this twin's forward asks :meth:`_runs_as_torch` (conv, linear, BatchNorm)
    can_run_as_torch = False

    def strategy_host_calls(self, args: tuple = ()) -> tuple[str, int]:
        """For the step-time model: a call is one ActNN layer of this level (its Python forward and
        backward, priced per level by the device model's ``strategy_call_s``), or none where it will
        run as torch's own layer (``args``: the call's arguments, as a forward pre-hook sees them)."""
        slot = self.attached_slot
        kind = f"actnn_layer:{slot.config.name}" if slot is not None else "actnn_layer"
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        return kind, 0 if self.can_run_as_torch and x is not None and self._torch_keeps_the_same(x) else 1

    def actnn_cost_factor(self) -> float:
        """Scale of this layer's weight-gradient variance per unit of range^2 * ||grad||^2.

        1 for linear layers (the controller divides by the input's token count); convs return
        their kernel area over their groups (the controller divides by the input's spatial size,
        see Controller._cost_factor). The common 1/4 of docs/design.md §2 is dropped.
        """
        return 1.0

    def _torch_keeps_the_same(self, input: torch.Tensor) -> bool:
        """Whether torch's own layer would keep what this twin keeps: its level keeps the input in
        full precision, nothing goes to the host and autocast is off."""
        c = self.actnn_slot.controller
        return c.offloader is None and c.target_bits(self.actnn_kind) is None and not autocast_active(input.device.type)

    def _runs_as_torch(self, input: torch.Tensor) -> bool:
        """Whether this conv/linear (or BatchNorm) twin runs as torch's own layer
        (:meth:`_torch_keeps_the_same`): torch's autograd saves what the twin would keep (BatchNorm: its
        batch mean besides), and the twin's Python (about 0.07 ms a layer on the host, docs/design.md
        §2) buys nothing. Then ``input`` is marked full precision, as ``LayerSlot.save_input`` marks
        it, and the hook path leaves torch's saved copy alone. Under autocast torch would save a cast
        copy the mark does not reach.
        """
        if not self._torch_keeps_the_same(input):
            return False
        setattr(input, SAVED_ROLE, ROLE_FULL_PRECISION)
        return True

    def _compressing(self, *tensors: torch.Tensor | None) -> bool:
        if not (self.training and torch.is_grad_enabled()):
            return False
        for t in tensors:  # a loop, not any(...): this runs for every twin call
            if t is not None and t.requires_grad:
                return True
        return False


# ---------------------------------------------------------------------------------------------
# Convolutions
# ---------------------------------------------------------------------------------------------


class _QConvNd(ActNNModule):
    actnn_kind = KIND_CONV
    can_run_as_torch = True
    _nd = 2

    def actnn_cost_factor(self) -> float:
        # Each output position reads C_in / groups channels of a k-window (Controller._cost_factor).
        return float(math.prod(self.kernel_size)) / self.groups

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input, self.weight, self.bias) or self._runs_as_torch(input):
            return super().forward(input)
        x, padding = input, self.padding
        if isinstance(padding, str) or self.padding_mode != "zeros":
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=mode)
            padding = (0,) * self._nd
        unbatched = x.dim() == self._nd + 1
        if unbatched:
            x = x.unsqueeze(0)
        p = ConvParams(tuple(self.stride), tuple(padding), tuple(self.dilation), False, (0,) * self._nd, self.groups)
        out = ConvFunction.apply(x, self.weight, self.bias, self.actnn_slot, p)
        return out.squeeze(0) if unbatched else out


class QConv1d(_QConvNd, nn.Conv1d):
    _nd = 1


class QConv2d(_QConvNd, nn.Conv2d):
    _nd = 2


class QConv3d(_QConvNd, nn.Conv3d):
    _nd = 3


class _QConvTransposeNd(ActNNModule):
    actnn_kind = KIND_CONV
    can_run_as_torch = True
    _nd = 2

    def actnn_cost_factor(self) -> float:
        # Each output position reads C_in / groups channels of a k-window (Controller._cost_factor).
        return float(math.prod(self.kernel_size)) / self.groups

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if (not self._compressing(input, self.weight, self.bias) or self.padding_mode != "zeros"
                or self._runs_as_torch(input)):
            return super().forward(input, output_size)  # torch raises for non-zero padding modes
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, self._nd, self.dilation
        )
        x = input
        unbatched = x.dim() == self._nd + 1
        if unbatched:
            x = x.unsqueeze(0)
        p = ConvParams(
            tuple(self.stride), tuple(self.padding), tuple(self.dilation), True, tuple(output_padding), self.groups
        )
        out = ConvFunction.apply(x, self.weight, self.bias, self.actnn_slot, p)
        return out.squeeze(0) if unbatched else out


class QConvTranspose1d(_QConvTransposeNd, nn.ConvTranspose1d):
    _nd = 1


class QConvTranspose2d(_QConvTransposeNd, nn.ConvTranspose2d):
    _nd = 2


class QConvTranspose3d(_QConvTransposeNd, nn.ConvTranspose3d):
    _nd = 3


# ---------------------------------------------------------------------------------------------
# Linear, BatchNorm
# ---------------------------------------------------------------------------------------------


class QLinear(ActNNModule, nn.Linear):
    actnn_kind = KIND_LINEAR
    can_run_as_torch = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input, self.weight, self.bias) or self._runs_as_torch(input):
            return super().forward(input)
        return LinearFunction.apply(input, self.weight, self.bias, self.actnn_slot)


class _QBatchNorm(ActNNModule):
    actnn_kind = KIND_BN
    can_run_as_torch = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input, self.weight, self.bias) or self._runs_as_torch(input):
            return super().forward(input)
        self._check_input_dim(input)
        _check_values_per_channel(input)
        # Same running-statistics bookkeeping as torch.nn.modules.batchnorm._BatchNorm.forward.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        rm = self.running_mean if self.track_running_stats else None
        rv = self.running_var if self.track_running_stats else None
        return BatchNormFunction.apply(input, self.weight, self.bias, rm, rv, factor, self.eps, self.actnn_slot)

    def _torch_keeps_the_same(self, input: torch.Tensor) -> bool:
        """As a conv's, and only where the hook path keeps every other saved tensor exact (L0):
        torch's batch norm also saves its batch mean and invstd, which at L1's ``act_bits`` the
        hook path would quantize."""
        config = self.actnn_slot.config
        if config.act_bits is not None and config.saved_tensor_hooks:
            return False
        return super()._torch_keeps_the_same(input)


def _check_values_per_channel(input: torch.Tensor) -> None:
    """torch's training-mode check (F.batch_norm): one value per channel has no batch variance.

    Without it aten normalises by the variance 0 (invstd = 1/sqrt(eps)) where torch raises; the
    message is torch's own, so callers that catch it see no difference.
    """
    size = input.size()
    if math.prod(size[2:]) * size[0] == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {size}")


class QBatchNorm1d(_QBatchNorm, nn.BatchNorm1d):
    pass


class QBatchNorm2d(_QBatchNorm, nn.BatchNorm2d):
    pass


class QBatchNorm3d(_QBatchNorm, nn.BatchNorm3d):
    pass


# ---------------------------------------------------------------------------------------------
# Masks: ReLU, ReLU6, Hardtanh, Dropout; MaxPool2d (int8 argmax)
# ---------------------------------------------------------------------------------------------


class _MaskModule(ActNNModule):
    actnn_kind = KIND_MASK

    def _masking(self, input: torch.Tensor) -> bool:
        return self._compressing(input) and self.actnn_slot.config.masks


class QReLU(_MaskModule, nn.ReLU):
    """ReLU keeping a 1-bit mask; ``inplace`` is accepted but the output is a new tensor."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input):
            return super().forward(input)
        return ClampFunction.apply(input, None, None, self.actnn_slot, False)


class QHardtanh(_MaskModule, nn.Hardtanh):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input):
            return super().forward(input)
        return ClampFunction.apply(input, float(self.min_val), float(self.max_val), self.actnn_slot, False)


class QReLU6(_MaskModule, nn.ReLU6):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input):
            return super().forward(input)
        return ClampFunction.apply(input, 0.0, 6.0, self.actnn_slot, False)


class QDropout(_MaskModule, nn.Dropout):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input) or not 0.0 < self.p < 1.0:
            return super().forward(input)
        return DropoutFunction.apply(input, float(self.p), self.actnn_slot)


class QMaxPool2d(_MaskModule, nn.MaxPool2d):
    """Max pool keeping an int8 argmax; only windows of at most 128 positions (convert checks)."""

    actnn_kind = KIND_POOL

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input) or self.return_indices:
            return super().forward(input)
        p = PoolParams(
            _pair_of(self.kernel_size),
            _pair_of(self.stride if self.stride is not None else self.kernel_size),
            _pair_of(self.padding),
            _pair_of(self.dilation),
            bool(self.ceil_mode),
        )
        return MaxPool2dFunction.apply(input, p, self.actnn_slot)


class QMaxPool3d(_MaskModule, nn.MaxPool3d):
    """3-D max pool keeping an int8 offset inside each window (``pool3d.py``); windows of at most
    128 positions (convert checks)."""

    actnn_kind = KIND_POOL

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input) or self.return_indices:
            return super().forward(input)
        p = Pool3dParams(triple(self.kernel_size), triple(self.stride if self.stride is not None else self.kernel_size),
                         triple(self.padding), triple(self.dilation), bool(self.ceil_mode))
        return MaxPool3dFunction.apply(input, p, self.actnn_slot)


class QAvgPool2d(_MaskModule, nn.AvgPool2d):
    """Average pool (still an AvgPool: upstream turned it into a MaxPool) keeping only a shape."""

    actnn_kind = KIND_POOL

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input):
            return super().forward(input)
        k = _pair_of(self.kernel_size)
        stride = _pair_of(self.stride) if self.stride is not None and self.stride != [] else k
        return AvgPool2dFunction.apply(
            input, list(k), list(stride), list(_pair_of(self.padding)), bool(self.ceil_mode),
            bool(self.count_include_pad), self.divisor_override, self.actnn_slot,
        )


# ---------------------------------------------------------------------------------------------
# LayerNorm (and ConvNeXt's channels-first LayerNorm2d): the normalised input, as BatchNorm
# ---------------------------------------------------------------------------------------------


class QLayerNorm(ActNNModule, nn.LayerNorm):
    actnn_kind = KIND_NORM

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input, self.weight, self.bias):
            return super().forward(input)
        return LayerNormFunction.apply(input, self.weight, self.bias, tuple(self.normalized_shape), self.eps, False,
                                       self.actnn_slot)


class QLayerNorm2d(ActNNModule, LayerNorm2d):
    """ConvNeXt's LayerNorm over the channels of an NCHW map (torch's permute, norm, permute back)."""

    actnn_kind = KIND_NORM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._compressing(x, self.weight, self.bias) or x.dim() != 4:
            return super().forward(x)
        y = LayerNormFunction.apply(x.permute(0, 2, 3, 1), self.weight, self.bias, tuple(self.normalized_shape),
                                    self.eps, True, self.actnn_slot)
        return y.permute(0, 3, 1, 2)


# ---------------------------------------------------------------------------------------------
# Smooth activations keep their derivative; Hardsigmoid and StochasticDepth a 1-bit mask
# ---------------------------------------------------------------------------------------------


class _DerivativeModule(ActNNModule):
    actnn_kind = KIND_ACT
    _activation = ""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input) or input.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return super().forward(input)
        approximate = getattr(self, "approximate", "none")
        return DerivativeFunction.apply(input, self._activation, approximate, bool(getattr(self, "inplace", False)),
                                        self.actnn_slot)


class QGELU(_DerivativeModule, nn.GELU):
    _activation = "gelu"


class QSiLU(_DerivativeModule, nn.SiLU):
    _activation = "silu"


class QHardswish(_DerivativeModule, nn.Hardswish):
    _activation = "hardswish"


class QSigmoid(_DerivativeModule, nn.Sigmoid):
    _activation = "sigmoid"


class QTanh(_DerivativeModule, nn.Tanh):
    _activation = "tanh"


class QHardsigmoid(_MaskModule, nn.Hardsigmoid):
    """Gradient 1/6 inside (-3, 3), else 0: a 1-bit mask (lossless); the output is a new tensor."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input):
            return super().forward(input)
        return MaskScaleFunction.apply(input, "hardsigmoid", 0.0, "", self.actnn_slot, False)


class QStochasticDepth(_MaskModule, StochasticDepth):
    """torchvision's StochasticDepth keeping its keep-mask (per row, or one for the batch) as 1 bit."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._masking(input) or not 0.0 < self.p < 1.0 or self.mode not in ("row", "batch"):
            return super().forward(input)
        return MaskScaleFunction.apply(input, "stochastic_depth", float(self.p), self.mode, self.actnn_slot, False)


def maxpool_supported(m: nn.MaxPool2d | nn.MaxPool3d) -> bool:
    """int8 argmax fits windows of up to 128 positions; return_indices needs torch's own indices."""
    window = triple(m.kernel_size) if isinstance(m, nn.MaxPool3d) else _pair_of(m.kernel_size)
    return not m.return_indices and math.prod(window) <= 128
