"""ActNN levels L0-L5 (docs/design.md §3) as frozen configs, passed explicitly to every layer.

Upstream kept its level in a global singleton and class attributes, so two models at different
levels in one process corrupted each other; here a level is a value, and a converted model carries
its own config and controller.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from actbench.kernels import ops

from actbench.schema import LEVEL_NAMES  # noqa: E402  (spelled once, in the torch-free schema)
UNIFORM_BITS: tuple[int, ...] = (1, 2, 4, 8)
# What L4/L5 move to the host (LevelConfig.swap_scope): packed codes only, or every saved tensor.
SWAP_SCOPES: tuple[str, ...] = ("codes", "all")


@dataclass(frozen=True)
class LevelConfig:
    """What a converted model compresses, and how.

    ``conv_bits`` / ``bn_bits``: bits per value kept for conv/linear (and ConvNeXt's layer scale)
    inputs and for normalisation layers' normalised inputs (BatchNorm, LayerNorm); ``None`` keeps
    that input in full precision. ``act_bits``: bits for every other floating saved activation — the
    derivatives kept by GELU/SiLU/Sigmoid/Hardswish, softmax outputs, attention's Q, K and V, and
    whatever the general saved-tensor hook path (``saved_tensor_hooks``, docs/design.md §3) packs:
    floating tensors of at least ``hook_min_elements`` values that no twin handles (parameters and
    their views, integer and boolean tensors are never touched). ``qk_bits``: attention's queries and
    keys, kept apart from V because backward recomputes the softmax from them: an error there passes
    through ``exp`` and biases every gradient of the block, which stochastic rounding cannot undo
    (V, like every other saved tensor, enters backward linearly). With ``mixed_precision`` the bits become a target average
    (per-sample and per-layer allocation by :class:`~actbench.actnn.controller.Controller`), any
    value in 1..8; otherwise they must be 1, 2, 4 or 8. ReLU/Dropout masks (1 bit) and MaxPool
    argmax (int8) are lossless, so they are kept compressed at every level (``masks``).
    ``swap`` moves saved activations to (pinned) CPU memory after forward, and ``swap_scope``
    says which: ``"codes"`` (the default, as the original ActNN did) moves only the packed codes
    of conv/linear/BatchNorm inputs — the bulk of the bytes — and keeps their bf16 ``lo``/``scale``
    metadata, per-sample bit widths, ReLU/Dropout masks and MaxPool argmax on the device;
    ``"all"`` moves every saved tensor a converted layer keeps (less device memory, more and
    smaller host copies). ``cuda_alloc_conf`` is the ``PYTORCH_CUDA_ALLOC_CONF`` the harness sets
    in the child process before CUDA starts.
    """

    name: str = "custom"
    conv_bits: float | None = 2
    bn_bits: float | None = 2
    act_bits: float | None = 2
    qk_bits: float | None = 4
    mixed_precision: bool = False
    group_size: int = ops.DEFAULT_GROUP_SIZE
    masks: bool = True
    swap: bool = False
    swap_scope: str = "codes"
    prefetch_depth: int = 2
    cuda_alloc_conf: str | None = None
    backend: str = "extension"
    min_bits: int = 1
    max_bits: int = 8
    saved_tensor_hooks: bool = True
    hook_min_elements: int = 2048

    def __post_init__(self) -> None:
        if self.backend not in ops.BACKENDS:
            raise ValueError(f"LevelConfig.backend must be one of {', '.join(ops.BACKENDS)}, got {self.backend!r}")
        if self.group_size <= 0 or self.group_size % 8:
            raise ValueError(f"LevelConfig.group_size must be a positive multiple of 8, got {self.group_size}")
        if not 1 <= self.min_bits <= self.max_bits <= 8:
            raise ValueError(f"LevelConfig: need 1 <= min_bits <= max_bits <= 8, got {self.min_bits}, {self.max_bits}")
        if self.hook_min_elements < 1:
            raise ValueError(f"LevelConfig.hook_min_elements must be >= 1, got {self.hook_min_elements}")
        for field in ("conv_bits", "bn_bits", "act_bits", "qk_bits"):
            bits = getattr(self, field)
            if bits is None:
                continue
            if self.mixed_precision:
                if not self.min_bits <= bits <= self.max_bits:
                    raise ValueError(
                        f"LevelConfig.{field}: a mixed-precision target must lie in "
                        f"{self.min_bits}..{self.max_bits}, got {bits}"
                    )
            elif bits not in UNIFORM_BITS:
                raise ValueError(
                    f"LevelConfig.{field} must be 1, 2, 4 or 8 (or None for full precision) without "
                    f"mixed_precision, got {bits}"
                )
        if self.swap_scope not in SWAP_SCOPES:
            raise ValueError(f"LevelConfig.swap_scope must be one of {', '.join(SWAP_SCOPES)}, got {self.swap_scope!r}")
        if self.prefetch_depth < 0:
            raise ValueError(f"LevelConfig.prefetch_depth must be >= 0, got {self.prefetch_depth}")

    def replace(self, **changes) -> "LevelConfig":
        """A copy with some fields changed (e.g. ``level_config("L3").replace(backend="oracle")``)."""
        return dataclasses.replace(self, **changes)


def _presets() -> dict[str, LevelConfig]:
    l3 = LevelConfig("L3", conv_bits=2, bn_bits=2, act_bits=2, mixed_precision=True)
    return {
        "L0": LevelConfig("L0", conv_bits=None, bn_bits=None, act_bits=None, qk_bits=None),
        "L1": LevelConfig("L1", conv_bits=4, bn_bits=None, act_bits=4),
        "L2": LevelConfig("L2", conv_bits=4, bn_bits=4, act_bits=4),
        "L3": l3,
        "L4": l3.replace(name="L4", swap=True),
        # The forked defragmenting allocator of upstream L5 is unavailable: expandable segments is
        # PyTorch's own answer to the same fragmentation (docs/design.md §3, a documented substitution).
        "L5": l3.replace(name="L5", swap=True, cuda_alloc_conf="expandable_segments:True"),
    }


def level_config(name: str, **overrides) -> LevelConfig:
    """The preset for level ``name`` ("L0".."L5"), optionally with fields overridden."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"unknown ActNN level {name!r}; allowed levels: {', '.join(LEVEL_NAMES)}")
    config = presets[name]
    return config.replace(**overrides) if overrides else config


def resolve(level: str | LevelConfig) -> LevelConfig:
    """A level name or a config -> a config (the one place that accepts both)."""
    if isinstance(level, LevelConfig):
        return level
    if isinstance(level, str):
        return level_config(level)
    raise TypeError(f"level must be a level name ({', '.join(LEVEL_NAMES)}) or a LevelConfig, got {type(level).__name__}")
