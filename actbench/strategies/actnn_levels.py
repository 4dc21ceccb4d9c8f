"""ActNN levels L0..L5: saved activations compressed by actbench's quantization extension (docs/design.md §3).

One class stands for the six levels; each level is one registered instance whose behaviour comes
from its :class:`~actbench.actnn.levels.LevelConfig` (bits, mixed precision, swap).
"""

from __future__ import annotations

from actbench.schema import LEVEL_NAMES
from actbench.strategies.registry import PreparedModel, Strategy, add

_DESCRIPTIONS = {
    "L0": "ActNN L0: ActNN layers, nothing compressed but ReLU masks and max-pool indices",
    "L1": "ActNN L1: conv/linear inputs at 4 bits",
    "L2": "ActNN L2: conv/linear and BatchNorm inputs at 4 bits",
    "L3": "ActNN L3: 2 bits on average, per-sample and per-layer mixed precision",
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
        from actbench.actnn import convert

        conversion = convert(model, self.name)
        note = " ".join(conversion.report.summary().split())[:300]
        return PreparedModel(model=conversion.model, note=note)


# The declarations below must agree with actbench/actnn/levels.py's presets (a test checks it):
# L4/L5 swap, L5 runs with expandable segments and is L4 on meta (the allocator is all that differs).
for _i, _level in enumerate(LEVEL_NAMES):
    add(ActNNLevel(
        _level, order=100 + _i, uses_host_memory=_level in ("L4", "L5"),
        cuda_alloc_conf="expandable_segments:True" if _level == "L5" else None,
        same_on_meta_as="L4" if _level == "L5" else None,
    ))
