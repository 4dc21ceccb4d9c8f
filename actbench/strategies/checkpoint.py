"""checkpoint: keep only segment inputs; recompute each segment's forward in backward (non-reentrant)."""

from __future__ import annotations

from actbench.strategies.registry import PreparedModel, Strategy, register


@register
class Checkpoint(Strategy):
    name = "checkpoint"
    description = "keeps only each block's input; recomputes the block in backward (non-reentrant checkpoint)"
    order = 20
    colour = "#9467bd"

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        from actbench.strategies.mechanics.checkpointing import apply_checkpointing

        made = apply_checkpointing(model, options.checkpoint_segments)
        return PreparedModel(model=model, note=f"{made} checkpoint segments")
