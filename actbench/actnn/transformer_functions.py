"""Autograd functions of attention blocks: softmax, self-attention and ConvNeXt's layer scale.

They keep what their backward reads compressed, as the functions in ``functions.py`` do (whose
:func:`~actbench.actnn.functions.save` marks what a twin keeps); the attention's reasons for what
it keeps are in docs/design.md §3.
"""

from __future__ import annotations

import torch

from actbench.core import compat

from actbench.actnn.controller import LayerSlot
from actbench.actnn.functions import save


class SoftmaxFunction(torch.autograd.Function):
    """Softmax along ``dim`` keeping its output compressed (what aten's backward reads)."""

    @staticmethod
    def forward(ctx, x, dim: int, slot: LayerSlot):
        y = torch.softmax(x, dim)
        tensors, spec = slot.save_input(y)
        save(ctx, *tensors)
        ctx.slot, ctx.spec, ctx.dim, ctx.dtype = slot, spec, dim, x.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        slot = ctx.slot
        slot.record_grad(grad)
        y = slot.load_input(tuple(ctx.saved_tensors), ctx.spec).to(grad.dtype)
        return compat.softmax_backward(grad, y, ctx.dim, ctx.dtype), None, None


class AttentionFunction(torch.autograd.Function):
    """Self-attention over a packed projection qkv [N, L, 3E] (nn.MultiheadAttention's in_proj
    output): output [N, L, E] = softmax(q k^T * scale + mask) v per head, heads concatenated.

    Only Q, K and V are kept: backward recomputes the attention from them (scaled_dot_product_attention
    under autograd) instead of keeping its output and log-sum-exp, as the fused kernels would, which
    costs one attention forward in backward and no saved bytes. Q and K are packed apart from V, in
    their own slot (``qk_bits``): the recomputed softmax is not linear in them, so their rounding
    error would bias the gradients rather than only add variance, as it does for V. Attention
    dropout is not supported here (the layer falls back to torch's path, where the hook path
    compresses).
    """

    @staticmethod
    def forward(ctx, qkv, heads: int, attn_mask, is_causal: bool, qk_slot: LayerSlot, v_slot: LayerSlot):
        q, k, v = _split_heads(qkv, heads)
        with torch.no_grad():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        embed = qkv.shape[-1] // 3
        qk_tensors, qk_spec = qk_slot.save_input(qkv[..., :2 * embed].contiguous())
        v_tensors, v_spec = v_slot.save_input(qkv[..., 2 * embed:].contiguous())
        save(ctx, *qk_tensors, *v_tensors)
        ctx.slots, ctx.specs, ctx.split = (qk_slot, v_slot), (qk_spec, v_spec), len(qk_tensors)
        ctx.heads, ctx.is_causal = heads, is_causal
        ctx.attn_mask = attn_mask  # a constant (no gradient flows to it)
        return _merge_heads(out)

    @staticmethod
    def backward(ctx, grad):
        qk_slot, v_slot = ctx.slots
        qk_slot.record_grad(grad)
        v_slot.record_grad(grad)
        saved = tuple(ctx.saved_tensors)
        qk = qk_slot.load_input(saved[:ctx.split], ctx.specs[0])
        v = v_slot.load_input(saved[ctx.split:], ctx.specs[1])
        qkv = torch.cat((qk, v), dim=-1).to(grad.dtype).detach().requires_grad_(True)
        with torch.enable_grad():
            q, k, v = _split_heads(qkv, ctx.heads)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ctx.attn_mask,
                                                                   is_causal=ctx.is_causal)
            (gqkv,) = torch.autograd.grad(_merge_heads(out), (qkv,), grad)
        return gqkv, None, None, None, None, None


def _split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, length, three_e = qkv.shape
    d = three_e // (3 * heads)
    q, k, v = qkv.view(n, length, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # each [N, heads, L, d]
    return q, k, v


def _merge_heads(out: torch.Tensor) -> torch.Tensor:
    n, heads, length, d = out.shape
    return out.transpose(1, 2).reshape(n, length, heads * d)


class LayerScaleFunction(torch.autograd.Function):
    """y = x * gamma with a learned per-channel gamma [C, 1, 1] (ConvNeXt's layer scale).

    x only feeds gamma's gradient (sum over N, H, W of grad * x), like a depthwise 1x1 conv's input,
    so it is compressed as one (conv bits, shared budget); gamma's own contribution is exact.
    """

    @staticmethod
    def forward(ctx, x, gamma, slot: LayerSlot):
        out = x * gamma
        tensors, spec = slot.save_input(x)
        save(ctx, *tensors, gamma)
        ctx.slot, ctx.spec = slot, spec
        return out

    @staticmethod
    def backward(ctx, grad):
        *tensors, gamma = ctx.saved_tensors
        slot = ctx.slot
        slot.record_grad(grad)
        gx = grad * gamma.to(grad.dtype) if ctx.needs_input_grad[0] else None
        gg = None
        if ctx.needs_input_grad[1]:
            x = slot.load_input(tuple(tensors), ctx.spec).to(grad.dtype)
            gg = (grad * x).sum_to_size(gamma.shape)
        return gx, gg, None
