"""Twins of attention blocks: softmax, torchvision's self-attention and ConvNeXt's block (layer scale)."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.convnext import CNBlock

from actbench.actnn.functions import LinearFunction
from actbench.actnn.layers import KIND_ACT, KIND_CONV, KIND_LINEAR, KIND_QK, ActNNModule
from actbench.actnn.transformer_functions import AttentionFunction, LayerScaleFunction, SoftmaxFunction


class QSoftmax(ActNNModule, nn.Softmax):
    actnn_kind = KIND_ACT

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input) or self.dim is None:
            return super().forward(input)
        return SoftmaxFunction.apply(input, self.dim, self.actnn_slot)


# ---------------------------------------------------------------------------------------------
# Attention, layer scale
# ---------------------------------------------------------------------------------------------


class QMultiheadAttention(ActNNModule, nn.MultiheadAttention):
    """Self-attention (query is key is value, batch_first, packed in-projection, no attention
    dropout, masks or bias_k/v; torchvision's ViT) as three compressing pieces: the in-projection
    (its input, a linear layer's), attention keeping only Q, K and V (:class:`AttentionFunction`;
    Q and K in a slot of their own, at ``qk_bits``) and the out-projection (its input). Any other
    call runs torch's own path, where the saved-tensor hook path compresses what it keeps."""

    actnn_kind = KIND_ACT
    actnn_covers_children = True  # out_proj's weight is used here, as torch's F.multi_head_attention does

    def actnn_extra_slots(self) -> tuple[tuple[str, str, float], ...]:
        return (("in_proj", KIND_LINEAR, 1.0), ("out_proj", KIND_LINEAR, 1.0), ("qk", KIND_QK, 1.0))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        simple = (
            query is key and key is value and self.batch_first and query.dim() == 3
            and self._qkv_same_embed_dim and self.in_proj_weight is not None
            and self.bias_k is None and self.bias_v is None and not self.add_zero_attn
            and key_padding_mask is None and attn_mask is None and not is_causal and not need_weights
            and (self.dropout == 0.0 or not self.training)
        )
        if not simple or not self._compressing(query, self.in_proj_weight):
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)
        qkv = LinearFunction.apply(query, self.in_proj_weight, self.in_proj_bias, self.extra_slot("in_proj"))
        out = AttentionFunction.apply(qkv, self.num_heads, None, False, self.extra_slot("qk"), self.actnn_slot)
        out = LinearFunction.apply(out, self.out_proj.weight, self.out_proj.bias, self.extra_slot("out_proj"))
        return out, None


class QCNBlock(ActNNModule, CNBlock):
    """ConvNeXt's block with its layer scale compressed: gamma * block(x) keeps block(x) for gamma's
    gradient only, like a depthwise 1x1 conv's input (conv bits, the shared budget)."""

    actnn_kind = KIND_CONV

    def actnn_cost_factor(self) -> float:
        return 1.0 / self.layer_scale.shape[0]  # a depthwise 1x1 "conv": k / groups = 1 / C

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._compressing(input, self.layer_scale):
            return super().forward(input)
        result = LayerScaleFunction.apply(self.block(input), self.layer_scale, self.actnn_slot)
        result = self.stochastic_depth(result)
        result += input
        return result
