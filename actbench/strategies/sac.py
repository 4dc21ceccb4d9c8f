"""sac: selective activation checkpointing — keep conv/matmul outputs, recompute pointwise ops in backward."""

from __future__ import annotations

from actbench.strategies.registry import PreparedModel, Strategy, register


@register
class SelectiveCheckpoint(Strategy):
    name = "sac"
    description = ("selective activation checkpointing: per block, keeps the outputs of convolutions, matrix "
                   "products and attention, recomputes BatchNorm/activations/adds in backward "
                   "(torch.utils.checkpoint.create_selective_checkpoint_contexts)")
    order = 200
    colour = "#637939"

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        from actbench.strategies.mechanics.selective import apply_selective_checkpointing

        made = apply_selective_checkpointing(model, options.checkpoint_segments)
        return PreparedModel(model=model, note=f"{made} selective checkpoint segments (keep conv/matmul outputs)")
