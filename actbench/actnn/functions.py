"""Autograd functions: forward in full precision, compressed state for backward.

Everything kept for backward goes through ``ctx.save_for_backward`` (so saved-tensor hooks and
memory accounting see it), through :func:`save`, which marks each tensor as already handled: the
general saved-tensor hook path (``actbench.actnn.hooks``) passes marked tensors through untouched
(a twin's bf16 metadata or its full-precision input at L0/L1 must not be quantized again).
``ctx`` attributes hold only shapes, flags and the layer's slot.
Backward dequantizes and calls PyTorch's own backward ops, so the arithmetic matches fp32
training exactly when nothing is lossy (level L0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actbench.kernels import ops
from actbench.actnn.controller import ROLE_STATISTICS, SAVED_ROLE, LayerSlot, saved_role


def save(ctx, *tensors: torch.Tensor | None) -> None:
    """``ctx.save_for_backward(*tensors)``, each tensor marked as kept by an ActNN layer.

    What a slot returned is already marked (compressed, or full precision by level); anything else
    but parameters (BatchNorm's invstd, LayerNorm's per-token rstd) is marked as layer statistics.
    """
    for t in tensors:
        # the role first: isinstance(t, nn.Parameter) runs a Python __instancecheck__
        if t is not None and saved_role(t) is None and not isinstance(t, torch.nn.Parameter):
            setattr(t, SAVED_ROLE, ROLE_STATISTICS)
    ctx.save_for_backward(*tensors)


def kept_by_twin(t: torch.Tensor) -> bool:
    return saved_role(t) is not None


def save_mask(ctx, slot: LayerSlot, mask: torch.Tensor) -> None:
    """Pack a mask to 1 bit per value for backward: the mask twins (clamp, dropout, hardsigmoid,
    stochastic depth) keep nothing else, so they share this and :func:`load_mask`. ``mask`` is a
    bool tensor or a ReLU's float output (its bits: value > 0, taken by the kernel in one pass)."""
    tensors, spec = slot.save_mask(mask)
    save(ctx, *tensors)
    ctx.slot, ctx.spec = slot, spec


def load_mask(ctx) -> torch.Tensor:
    """The mask :func:`save_mask` packed, unpacked; tells the slot its backward ran."""
    slot = ctx.slot
    slot.after_backward()
    return slot.load_mask(tuple(ctx.saved_tensors), ctx.spec)


def save_argmax(ctx, slot: LayerSlot, argmax: torch.Tensor, shape: torch.Size, params: object) -> None:
    """Keep a max pool's int8 window offsets, its input's shape and its ``params`` for backward: the
    2-D and 3-D pool twins keep nothing else, so they share this and :func:`load_argmax`."""
    tensors, spec = slot.save_argmax(argmax, shape)
    save(ctx, *tensors)
    ctx.slot, ctx.spec, ctx.p = slot, spec, params


def load_argmax(ctx) -> torch.Tensor:
    """The offsets :func:`save_argmax` kept; tells the slot its backward ran."""
    ctx.slot.after_backward()
    return ctx.slot.load_argmax(tuple(ctx.saved_tensors), ctx.spec)


def masked_grad(ctx, grad: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """grad * scale where the mask :func:`save_mask` packed is set, else 0, in one kernel pass
    (no bool tensor, no type-promoting multiply); tells the slot its backward ran."""
    slot = ctx.slot
    slot.after_backward()
    return slot.masked_grad(tuple(ctx.saved_tensors), ctx.spec, grad, scale)


def autocast_active(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``; False for a type autocast does not know (meta),
    where asking ``torch.is_autocast_enabled`` raises."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def autocast_like_torch(x: torch.Tensor, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``(x, *tensors)`` cast as autocast casts torch's own conv and linear: when autocast is on for
    x's device type, every float32/float16/bfloat16 tensor goes to autocast's dtype (float64 stays).

    A twin's forward calls this, so it computes and saves in the precision torch's layer would
    (docs/design.md §1 precision): cpu autocast, which meta's fake tensors use too, lowers
    ``aten.conv2d`` but not the ``aten.convolution`` the conv twin calls, and lowers ``F.linear``
    only after the linear twin has kept its input in fp32. Weights are cast for the computation
    only: twins keep the fp32 parameter and cast it in backward.
    """
    kind = x.device.type
    if not autocast_active(kind):
        return (x, *tensors)
    dtype = torch.get_autocast_dtype(kind)
    return tuple(t if t is None or not t.is_floating_point() or t.dtype in (dtype, torch.float64) else t.to(dtype)
                 for t in (x, *tensors))


def fp32_statistics(t: torch.Tensor) -> torch.Tensor:
    """Normalisation statistics (BatchNorm's invstd, LayerNorm's mean and rstd) in fp32 for a 16-bit
    input, as the cpu and cuda kernels return them; torch's fake kernels return the input's dtype, so
    without this meta kept half the statistics bytes cpu keeps (docs/design.md §4 meta)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


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
        x, w, b = autocast_like_torch(x, weight, bias)
        # torch.convolution, not torch.ops.aten.convolution: the same aten op, but torch's generated binding
        # parses the arguments 4-5 µs faster than an op packet, host time every layer pays (docs/design.md §2)
        out = torch.convolution(x, w, b, p.stride, p.padding, p.dilation, p.transposed, p.output_padding, p.groups)
        del w, b  # a cast copy lives for the forward only; backward casts the saved parameter
        tensors, spec = slot.save_input(x)
        save(ctx, *tensors, weight)
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
        x, w, b = autocast_like_torch(x, weight, bias)
        out = torch.nn.functional.linear(x, w, b)
        del w, b
        tensors, spec = slot.save_input(x)
        save(ctx, *tensors, weight)
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
        out, save_mean, save_invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        # One full-size temporary, normalised in place: (x - mean), then *= invstd, gives the same
        # values as the out-of-place product, which was a second full-size buffer. With x and the
        # output alive, that buffer set the forward's peak; on meta it, not the stored activations,
        # bounded the predicted maximum batch of L2-L5 (docs/design.md §3 BatchNorm, §4 meta).
        x_norm = torch.sub(x, save_mean.reshape(shape).to(x.dtype))
        x_norm.mul_(save_invstd.reshape(shape).to(x.dtype))
        tensors, spec = slot.save_input(x_norm)
        save_invstd = fp32_statistics(save_invstd)
        save(ctx, *tensors, weight, save_invstd)
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
        # Weight, mean and invstd in one dtype (invstd's: fp32 under autocast), the mixed-type call torch's
        # own BatchNorm makes with a 16-bit input; a 16-bit weight beside fp32 statistics is refused on cpu.
        zeros, ones = torch.zeros_like(save_invstd), torch.ones_like(save_invstd)
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            grad.contiguous(), x_norm, scale.to(save_invstd.dtype), None, None, zeros, ones, True, ctx.eps, mask
        )
        return gx, gw, gb, None, None, None, None, None


class ClampFunction(torch.autograd.Function):
    """ReLU / ReLU6 / Hardtanh: y = clamp(x, lo, hi); keeps a 1-bit mask of where grad flows.

    Matches PyTorch's subgradients: ReLU passes the gradient where y > 0 (threshold_backward),
    Hardtanh where lo < x < hi (hardtanh_backward). ``inplace`` clamps x itself (the functional
    ``F.relu(x, inplace=True)`` the hook path routes here); the modules return a new tensor.
    """

    @staticmethod
    def forward(ctx, x, lo: float | None, hi: float | None, slot: LayerSlot, inplace: bool):
        if hi is None:
            out = torch.relu_(x) if inplace else torch.relu(x)
            # y > 0 exactly where x > 0: the kernel reads the bits from the output itself
            mask = out if out.dtype in ops.PACKABLE_DTYPES else out > 0
        else:
            mask = (x > lo) & (x < hi)
            out = x.clamp_(lo, hi) if inplace else torch.clamp(x, lo, hi)
        if inplace:
            ctx.mark_dirty(x)
        save_mask(ctx, slot, mask)
        return out

    @staticmethod
    def backward(ctx, grad):
        return masked_grad(ctx, grad), None, None, None, None


class DropoutFunction(torch.autograd.Function):
    """Dropout with probability p (0 < p < 1); keeps the 1-bit keep-mask."""

    @staticmethod
    def forward(ctx, x, p: float, slot: LayerSlot):
        keep = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)
        scale = 1.0 / (1.0 - p)
        out = x * keep * scale
        save_mask(ctx, slot, keep)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        return masked_grad(ctx, grad, ctx.scale), None, None


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
        save_argmax(ctx, slot, argmax, x.shape, p)
        return out

    @staticmethod
    def backward(ctx, grad):
        p, argmax = ctx.p, load_argmax(ctx)
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


# ---------------------------------------------------------------------------------------------
# Normalisation, activations, attention (docs/design.md §3: every floating saved activation)
# ---------------------------------------------------------------------------------------------


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dims keeping its *normalised* input, as BatchNorm does.

    x_n = (x - mean) * rstd is what is quantized (unit scale per token, so a group spanning
    tokens of very different scales loses nothing), with the per-token rstd (tiny) and the weight.
    Backward calls aten's layer-norm backward on x_n with mean 0 and rstd 1 and multiplies the
    input gradient by the real rstd: the same formula as aten's on x. ``channels_first``: x is a
    permuted view [N, H, W, C] of an NCHW tensor (ConvNeXt's LayerNorm2d); x_n is quantized in
    NCHW order, where it is contiguous.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps: float, channels_first: bool, slot: LayerSlot):
        out, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
        mean, rstd = fp32_statistics(mean), fp32_statistics(rstd)
        # one full-size temporary in x's dtype (fp32 statistics would promote it), normalised in place (as BatchNorm)
        x_norm = torch.sub(x, mean.to(x.dtype))
        x_norm.mul_(rstd.to(x.dtype))
        tensors, spec = slot.save_input(x_norm.permute(0, 3, 1, 2) if channels_first else x_norm)
        del x_norm
        save(ctx, *tensors, weight, bias, rstd)
        ctx.slot, ctx.spec, ctx.shape, ctx.channels_first = slot, spec, list(normalized_shape), channels_first
        return out

    @staticmethod
    def backward(ctx, grad):
        *tensors, weight, bias, rstd = ctx.saved_tensors
        slot = ctx.slot
        slot.record_grad(grad)
        x_norm = slot.load_input(tuple(tensors), ctx.spec).to(grad.dtype)
        if ctx.channels_first:
            x_norm = x_norm.permute(0, 2, 3, 1)
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                bias is not None and ctx.needs_input_grad[2]]
        zeros, ones = torch.zeros_like(rstd), torch.ones_like(rstd)
        gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
            grad, x_norm, ctx.shape, zeros, ones, weight, bias, mask
        )
        if gx is not None:
            gx = gx * rstd.to(gx.dtype)
        return gx, gw, gb, None, None, None, None


#: Elementwise activations whose backward is grad * f'(x): name -> (forward, derivative from x or y).
def _derivative(kind: str, x: torch.Tensor, y: torch.Tensor, approximate: str) -> torch.Tensor:
    one = x.new_ones(()).expand(x.shape)  # a broadcast 1: no full-size temporary
    if kind == "gelu":
        return torch.ops.aten.gelu_backward(one, x, approximate=approximate)
    if kind == "silu":
        return torch.ops.aten.silu_backward(one, x)
    if kind == "hardswish":
        return torch.ops.aten.hardswish_backward(one, x)
    if kind == "sigmoid":
        return torch.ops.aten.sigmoid_backward(one, y)
    if kind == "tanh":
        return torch.ops.aten.tanh_backward(one, y)
    raise ValueError(f"no ActNN derivative for activation {kind!r}")


def _activation(kind: str, x: torch.Tensor, approximate: str, inplace: bool) -> torch.Tensor:
    if kind == "gelu":
        return torch.nn.functional.gelu(x, approximate=approximate)
    if kind == "silu":
        return torch.nn.functional.silu(x, inplace=inplace)
    if kind == "hardswish":
        return torch.nn.functional.hardswish(x, inplace=inplace)
    if kind == "sigmoid":
        return x.sigmoid_() if inplace else torch.sigmoid(x)
    if kind == "tanh":
        return x.tanh_() if inplace else torch.tanh(x)
    raise ValueError(f"no ActNN twin for activation {kind!r}")


class DerivativeFunction(torch.autograd.Function):
    """y = f(x) elementwise keeping f'(x) compressed: backward is grad * f'(x).

    Keeping the derivative instead of x (GELU, SiLU, Hardswish) or y (Sigmoid, Tanh) costs the
    same bytes and makes the input gradient *linear* in what was quantized, so stochastic rounding
    keeps it unbiased (quantizing x would give f'(x_hat), biased wherever f' is curved). The
    derivative is computed and packed before the output exists, so the forward holds at most two
    full-size tensors besides the input; ``inplace`` overwrites the input as torch's module would.
    """

    @staticmethod
    def forward(ctx, x, kind: str, approximate: str, inplace: bool, slot: LayerSlot):
        if kind in ("sigmoid", "tanh"):
            y = _activation(kind, x, approximate, inplace)
            d = _derivative(kind, x, y, approximate)
        else:
            d = _derivative(kind, x, x, approximate)
            y = None
        tensors, spec = slot.save_input(d)
        del d
        if y is None:
            y = _activation(kind, x, approximate, inplace)
        if inplace:
            ctx.mark_dirty(x)
        save(ctx, *tensors)
        ctx.slot, ctx.spec = slot, spec
        return y

    @staticmethod
    def backward(ctx, grad):
        slot = ctx.slot
        slot.record_grad(grad)
        d = slot.load_input(tuple(ctx.saved_tensors), ctx.spec)
        return grad * d.to(grad.dtype), None, None, None, None


class MaskScaleFunction(torch.autograd.Function):
    """y = f(x) whose gradient is ``scale`` where a 1-bit mask is set, else 0 (lossless).

    Hardsigmoid: y = relu6(x + 3) / 6, gradient 1/6 on -3 < x < 3. StochasticDepth: y = x * keep /
    survival with a per-row (or whole-batch) keep mask, gradient keep / survival.
    """

    @staticmethod
    def forward(ctx, x, kind: str, p: float, mode: str, slot: LayerSlot, inplace: bool = False):
        if kind == "hardsigmoid":
            mask, scale = (x > -3) & (x < 3), 1.0 / 6.0
            out = torch.nn.functional.hardsigmoid(x, inplace=inplace)
            if inplace:
                ctx.mark_dirty(x)
        else:  # stochastic depth
            size = [x.shape[0]] + [1] * (x.dim() - 1) if mode == "row" else [1] * x.dim()
            mask = torch.empty(size, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)
            scale = 1.0 / (1.0 - p)
            out = x * (mask * scale).to(x.dtype)
        save_mask(ctx, slot, mask)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * (load_mask(ctx) * ctx.scale).to(grad.dtype), None, None, None, None, None


class NormalizeFunction(torch.autograd.Function):
    """y = x / max(||x||_2, eps) along ``dim``, keeping y (|y| <= 1: compressed at ``act_bits``) and the
    per-row denominator (layer statistics, full precision) instead of x and the norm.

    Backward: (g - y <g, y>) / denom on rows whose norm exceeds eps, g / eps on clamped rows (there
    the denominator is a constant), as torch's. Quadratic in y: second-order biased, like LayerNorm.
    """

    @staticmethod
    def forward(ctx, x, dim, eps: float, slot: LayerSlot):
        denom = torch.linalg.vector_norm(x, 2, dim, keepdim=True).clamp_min(eps)
        y = x / denom
        tensors, spec = slot.save_input(y)
        save(ctx, denom, *tensors)
        ctx.slot, ctx.spec, ctx.dim, ctx.eps = slot, spec, dim, eps
        return y

    @staticmethod
    def backward(ctx, grad):
        slot = ctx.slot
        slot.record_grad(grad)
        denom, *packed = ctx.saved_tensors
        y = slot.load_input(tuple(packed), ctx.spec).to(grad.dtype)
        inside = (denom > ctx.eps).to(grad.dtype)
        return (grad - inside * y * (grad * y).sum(ctx.dim, keepdim=True)) / denom, None, None, None
