"""ActNN levels L0..L5: saved activations compressed by actbench's quantization extension (docs/design.md §3).

One class stands for the six levels; each level is one registered instance whose behaviour comes
from its :class:`~actbench.actnn.levels.LevelConfig` (bits, mixed precision, swap).
"""

from __future__ import annotations

from actbench.schema import LEVEL_NAMES, one_line
from actbench.strategies.registry import PreparedModel, Strategy, add

# Every floating saved activation is compressed at L1-L5, by a twin or the saved-tensor hook path
# (docs/design.md §3); columns conv_bits / bn_bits / act_bits of actbench/actnn/levels.py.
_DESCRIPTIONS = {
    "L0": "ActNN L0: every saved activation in full precision (twins and saved-tensor hooks), "
          "but ReLU/dropout masks (1 bit) and max-pool argmax (int8), both lossless",
    "L1": "ActNN L1: every floating saved activation at 4 bits (conv/linear inputs, activation derivatives, "
          "softmax, attention Q/K/V, hook-packed tensors) but normalised inputs (BatchNorm, LayerNorm), kept in full",
    "L2": "ActNN L2: every floating saved activation at 4 bits, normalised inputs (BatchNorm, LayerNorm) included",
    "L3": "ActNN L3: every floating saved activation at 2 bits on average, attention Q/K at 4; mixed precision "
          "per sample and per layer for conv/linear inputs (one shared budget), per sample for the rest (twin or hook)",
    "L4": "ActNN L4: L3, packed codes swapped to (pinned) host memory",
    "L5": "ActNN L5: L4 with expandable allocator segments (cuda)",
}
_COLOURS = {"L0": "#1f77b4", "L1": "#17becf", "L2": "#2ca02c", "L3": "#bcbd22", "L4": "#ff7f0e", "L5": "#e377c2"}


class ActNNLevel(Strategy):
    """One ActNN level; :meth:`prepare` converts the model's layers to their ActNN twins."""

    is_actnn_level = True

    def __init__(self, level: str, order: int, uses_host_memory: bool, cuda_alloc_conf: str | None,
                 same_on_meta_as: str | None) -> None:
        self.name = level
        self.description = _DESCRIPTIONS[level]
        self.order = order
        self.colour = _COLOURS[level]
        self.uses_host_memory = uses_host_memory
        self.cuda_alloc_conf = cuda_alloc_conf
        self.same_on_meta_as = same_on_meta_as

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        import functools

        from actbench.actnn import convert, loss_scope

        # In place: the model is the point's own (Strategy.prepare); a converted copy would leave the
        # caller's fp32 original alive on the device, counted in every cuda row of the level.
        conversion = convert(model, self.name, inplace=True)
        note = one_line(conversion.report.summary())
        # forward and the task's loss in one scope: a loss computed after the model (a map's cross-entropy)
        # is compressed like the layers (actnn/loss_functions.py)
        return PreparedModel(model=conversion.model, forward_context=functools.partial(loss_scope, conversion.model),
                             note=note)


# The declarations below must agree with actbench/actnn/levels.py's presets (a test checks it):
# L4/L5 swap, L5 runs with expandable segments and is L4 on meta (the allocator is all that differs).
for _i, _level in enumerate(LEVEL_NAMES):
    add(ActNNLevel(
        _level, order=100 + _i, uses_host_memory=_level in ("L4", "L5"),
        cuda_alloc_conf="expandable_segments:True" if _level == "L5" else None,
        same_on_meta_as="L4" if _level == "L5" else None,
    ))
