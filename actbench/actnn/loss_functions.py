"""Loss twins: what a loss keeps for backward, in a form its backward reads without bias.

A task's loss is computed after the model's forward, so the hook path sees it only inside
:meth:`~actbench.actnn.hooks.SavedTensorPacker.covering_loss` (the ActNN levels' training step, or a
user's loop through :func:`actbench.actnn.loss_scope`). There, two losses are rerouted here:

- **Cross-entropy over a map** (segmentation: logits [N, C, *spatial], a class per pixel). torch keeps
  the fp32 log-probabilities, and backward exponentiates them: rounded, they would bias the gradient.
  The twin keeps the gradient's direction instead, softmax(x) - onehot(target) (divided by the mean's
  count), at ``act_bits``, and a 1-bit mask of the pixels that count (an ignored one gets exactly 0). Backward only scales it by the incoming
  scalar, a linear use, so stochastic rounding leaves the gradient unbiased. A cross-entropy inside
  a model's forward (a detector's box classifier) is rerouted too, whatever its shape: there the hook
  path would otherwise round its log-probabilities. A classifier's [N, C] logits after the model keep
  torch's own saving: one row per sample, as the ActNN paper left them.
- **|x|** (optical flow's L1 sequence loss) keeps a 1-bit sign mask instead of x. It is exact except
  at x == 0 exactly, where it takes the subgradient -1 (torch: 0).
"""

from __future__ import annotations

import torch

from actbench.actnn.controller import LayerSlot
from actbench.actnn.functions import masked_grad, save, save_mask


class DenseCrossEntropyFunction(torch.autograd.Function):
    """Mean (or summed) cross-entropy of logits [N, C, ...] against class indices [N, ...], keeping its
    gradient direction compressed and a 1-bit mask of the pixels counted (see the module doc)."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index: int, reduction: str, slot: LayerSlot, mask_slot: LayerSlot):
        log_probs = torch.log_softmax(logits, 1)
        loss = torch.nn.functional.nll_loss(log_probs, target, ignore_index=ignore_index, reduction=reduction)
        direction = log_probs.exp_()  # the softmax, in the log-probabilities' storage
        del log_probs
        kept = target != ignore_index
        classes = torch.where(kept, target, 0).unsqueeze(1)
        direction.scatter_add_(1, classes, torch.full(classes.shape, -1.0, dtype=direction.dtype,
                                                      device=direction.device))
        if reduction == "mean":
            direction.div_(kept.sum())
        # An ignored pixel's direction is rounded like the rest (0 need not be a level of its group);
        # the mask puts its gradient back to exactly 0 in backward.
        tensors, spec = slot.save_input(direction, whole_rows=True)  # a detector's [K, 91] without padding
        del direction
        mask_tensors, mask_spec = mask_slot.save_mask(kept)
        save(ctx, *tensors, *mask_tensors)
        ctx.slots, ctx.specs, ctx.split = (slot, mask_slot), (spec, mask_spec), len(tensors)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        slot, mask_slot = ctx.slots
        spec, mask_spec = ctx.specs
        saved = ctx.saved_tensors
        slot.after_backward()
        direction = slot.load_input(tuple(saved[:ctx.split]), spec)
        kept = mask_slot.load_mask(tuple(saved[ctx.split:]), mask_spec)
        return (direction.mul_(kept.unsqueeze(1)) * grad).to(ctx.dtype), None, None, None, None, None


class AbsFunction(torch.autograd.Function):
    """|x| keeping the 1-bit mask x > 0: backward is grad where it is set, -grad elsewhere."""

    @staticmethod
    def forward(ctx, x, slot: LayerSlot):
        save_mask(ctx, slot, x > 0)
        return x.abs()

    @staticmethod
    def backward(ctx, grad):
        return masked_grad(ctx, grad, 2.0) - grad, None


def dense_cross_entropy_applies(logits: torch.Tensor, target: object, weight: object, reduction: str,
                                label_smoothing: float, legacy: tuple, inside_model: bool) -> bool:
    """Whether a ``F.cross_entropy`` call is one :class:`DenseCrossEntropyFunction` computes and should:
    a map of classes (spatial dims), or any logits inside a model's forward (a detector's box and
    keypoint classifiers, whose log-probabilities the hook path would otherwise round); integer
    targets of its shape, no class weights, no label smoothing, a mean or a sum, no legacy
    ``size_average``/``reduce``."""
    return ((logits.dim() > 2 or (inside_model and logits.dim() == 2))
            and isinstance(target, torch.Tensor) and not target.is_floating_point()
            and target.dim() == logits.dim() - 1 and weight is None and reduction in ("mean", "sum")
            and label_smoothing == 0.0 and all(a is None for a in legacy))
