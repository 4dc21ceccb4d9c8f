"""Autograd functions: forward in full precision, compressed state for backward.

Everything kept for backward goes through ``ctx.save_for_backward`` (so saved-tensor hooks and
memory accounting see it); ``ctx`` attributes hold only shapes, flags and the layer's slot.
Backward dequantizes and calls PyTorch's own backward ops, so the arithmetic matches fp32
training exactly when nothing is lossy (level L0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actbench import ops
from actbench.actnn.controller import LayerSlot


@dataclass(frozen=True)
class ConvParams:
    """aten.convolution's non-tensor arguments."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int


class ConvFunction(torch.autograd.Function):
    """(Transposed) N-d convolution keeping its input compressed; input [N, C, *spatial]."""

    @staticmethod
    def forward(ctx, x, weight, bias, slot: LayerSlot, p: ConvParams):
        out = torch.ops.aten.convolution(
            x, weight, bias, p.stride, p.padding, p.dilation, p.transposed, p.output_padding, p.groups
        )
        tensors, spec = slot.save_input(x)
        ctx.save_for_backward(*tensors, weight)
        ctx.slot, ctx.spec, ctx.p = slot, spec, p
        ctx.bias_sizes = None if bias is None else list(bias.shape)
        return out

    @staticmethod
    def backward(ctx, grad):
        *tensors, weight = ctx.saved_tensors
        slot, p = ctx.slot, ctx.p
        slot.record_grad(grad)
        # Casting to grad's dtype keeps autocast forwards working (autograd casts grads back).
        x = slot.load_input(tuple(tensors), ctx.spec).to(grad.dtype)
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.bias_sizes is not None and ctx.needs_input_grad[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            grad, x, weight.to(grad.dtype), ctx.bias_sizes, p.stride, p.padding, p.dilation, p.transposed, p.output_padding, p.groups, mask
        )
        return gx, gw, gb, None, None


class LinearFunction(torch.autograd.Function):
    """y = x W^T + b for x of any rank [..., in]; the input gradient keeps x's shape."""

    @staticmethod
    def forward(ctx, x, weight, bias, slot: LayerSlot):
        out = torch.nn.functional.linear(x, weight, bias)
        tensors, spec = slot.save_input(x)
        ctx.save_for_backward(*tensors, weight)
        ctx.slot, ctx.spec, ctx.has_bias = slot, spec, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        *tensors, weight = ctx.saved_tensors
        slot = ctx.slot
        slot.record_grad(grad if grad.dim() > 1 else grad.unsqueeze(0))
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = grad.matmul(weight.to(grad.dtype))
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            g2 = grad.reshape(-1, grad.shape[-1])
            if ctx.needs_input_grad[1]:
                x = slot.load_input(tuple(tensors), ctx.spec)
                gw = g2.t().matmul(x.reshape(-1, x.shape[-1]).to(g2.dtype))
            if ctx.has_bias and ctx.needs_input_grad[2]:
                gb = g2.sum(0)
        return gx, gw, gb, None


class BatchNormFunction(torch.autograd.Function):
    """Training-mode batch norm (batch statistics) keeping its *normalised* input compressed.

    What is quantized is x_n = (x - mean) * invstd, not x: every channel of x_n has unit variance,
    so a quantization group spanning channels of very different scales (e.g. 256 channels of a 1x1
    map) no longer drowns the small channels in the large ones' rounding noise; their error is
    multiplied by invstd in backward, and quantizing raw x made gradients explode by 1e10 on a
    ResNet-18 at 32 px. Backward calls aten's own batch-norm backward with mean 0, invstd 1 and
    weight * invstd, which is algebraically the same formula evaluated on x_n.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum: float, eps: float, slot: LayerSlot):
        out, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
            x, weight, bias, running_mean, running_var, True, momentum, eps
        )
        shape = (1, -1) + (1,) * (x.dim() - 2)
        # One full-size temporary, normalised in place: (x - mean), then *= invstd, gives the same
        # values as the out-of-place product, which was a second full-size buffer. With x and the
        # output alive, that buffer set the forward's peak; on meta it, not the stored activations,
        # bounded the predicted maximum batch of L2-L5 (docs/design.md §3 BatchNorm, §4 meta).
        x_norm = torch.sub(x, save_mean.reshape(shape).to(x.dtype))
        x_norm.mul_(save_invstd.reshape(shape).to(x.dtype))
        tensors, spec = slot.save_input(x_norm)
        ctx.save_for_backward(*tensors, weight, save_invstd)
        ctx.slot, ctx.spec, ctx.eps = slot, spec, eps
        return out

    @staticmethod
    def backward(ctx, grad):
        *tensors, weight, save_invstd = ctx.saved_tensors
        slot = ctx.slot
        slot.record_grad(grad)
        x_norm = slot.load_input(tuple(tensors), ctx.spec)
        affine = weight is not None
        scale = save_invstd * weight if affine else save_invstd
        mask = [ctx.needs_input_grad[0], affine and ctx.needs_input_grad[1], affine and ctx.needs_input_grad[2]]
        zeros, ones = torch.zeros_like(save_invstd), torch.ones_like(save_invstd)
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            grad.contiguous(), x_norm, scale.to(grad.dtype), None, None, zeros, ones, True, ctx.eps, mask
        )
        return gx, gw, gb, None, None, None, None, None


class ClampFunction(torch.autograd.Function):
    """ReLU / ReLU6 / Hardtanh: y = clamp(x, lo, hi); keeps a 1-bit mask of where grad flows.

    Matches PyTorch's subgradients: ReLU passes the gradient where y > 0 (threshold_backward),
    Hardtanh where lo < x < hi (hardtanh_backward).
    """

    @staticmethod
    def forward(ctx, x, lo: float | None, hi: float | None, slot: LayerSlot):
        if hi is None:
            out = torch.relu(x)
            mask = out > 0
        else:
            out = torch.clamp(x, lo, hi)
            mask = (x > lo) & (x < hi)
        tensors, spec = slot.save_mask(mask)
        ctx.save_for_backward(*tensors)
        ctx.slot, ctx.spec = slot, spec
        return out

    @staticmethod
    def backward(ctx, grad):
        slot = ctx.slot
        slot.after_backward()
        mask = slot.load_mask(tuple(ctx.saved_tensors), ctx.spec)
        return grad * mask, None, None, None


class DropoutFunction(torch.autograd.Function):
    """Dropout with probability p (0 < p < 1); keeps the 1-bit keep-mask."""

    @staticmethod
    def forward(ctx, x, p: float, slot: LayerSlot):
        keep = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)
        scale = 1.0 / (1.0 - p)
        out = x * keep * scale
        tensors, spec = slot.save_mask(keep)
        ctx.save_for_backward(*tensors)
        ctx.slot, ctx.spec, ctx.scale = slot, spec, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        slot = ctx.slot
        slot.after_backward()
        keep = slot.load_mask(tuple(ctx.saved_tensors), ctx.spec)
        return grad * keep * ctx.scale, None, None


@dataclass(frozen=True)
class PoolParams:
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool


class MaxPool2dFunction(torch.autograd.Function):
    """2-D max pool keeping the int8 argmax inside each window (x [N, C, H, W] or [C, H, W])."""

    @staticmethod
    def forward(ctx, x, p: PoolParams, slot: LayerSlot):
        out, argmax = ops.max_pool2d_with_argmax(x, p.kernel_size, p.stride, p.padding, p.dilation, p.ceil_mode)
        tensors, spec = slot.save_argmax(argmax, x.shape)
        ctx.save_for_backward(*tensors)
        ctx.slot, ctx.spec, ctx.p = slot, spec, p
        return out

    @staticmethod
    def backward(ctx, grad):
        slot, p = ctx.slot, ctx.p
        slot.after_backward()
        argmax = slot.load_argmax(tuple(ctx.saved_tensors), ctx.spec)
        gx = ops.max_pool2d_backward(grad.contiguous(), argmax, ctx.spec.shape, p.kernel_size, p.stride, p.padding, p.dilation)
        return gx, None, None


class AvgPool2dFunction(torch.autograd.Function):
    """2-D average pool that keeps nothing but the input's shape.

    aten's avg_pool2d autograd saves the whole input although its backward reads only the input's
    sizes; DenseNet's transitions kept about a fifth of its L3 bytes that way. Backward passes an
    uninitialised tensor of the right shape (a temporary of backward, not saved state).
    """

    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, ceil_mode: bool, count_include_pad: bool, divisor_override, slot: LayerSlot):
        slot.controller.before_save()
        ctx.args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        ctx.shape, ctx.dtype, ctx.device = x.shape, x.dtype, x.device
        ctx.slot = slot
        return torch.ops.aten.avg_pool2d(x, *ctx.args)

    @staticmethod
    def backward(ctx, grad):
        ctx.slot.after_backward()
        like = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
        return torch.ops.aten.avg_pool2d_backward(grad.contiguous(), like, *ctx.args), None, None, None, None, None, None, None
