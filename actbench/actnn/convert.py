"""convert(model, level) -> Conversion: swap supported modules for their ActNN twins, in place of a copy.

Conversion changes only each module's class (and attaches its slot): parameters, buffers, hooks and
module names stay as they were, so state_dicts round-trip and nothing is re-initialised (upstream
rebuilt layers and lost their weights, and turned AvgPool into MaxPool; here an AvgPool2d stays an
AvgPool2d — its ActNN twin is a subclass that saves only the input's shape, where aten's own
autograd saves the whole input).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
from torch import nn
from torchvision.models.convnext import CNBlock, LayerNorm2d
from torchvision.models.maxvit import SwapAxes, WindowDepartition, WindowPartition
from torchvision.models.optical_flow.raft import CorrBlock
from torchvision.models.video.resnet import Conv3DNoTemporal, Conv3DSimple
from torchvision.ops import StochasticDepth
from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork
from torchvision.ops.misc import Permute

from actbench.actnn import hooks
from actbench.actnn.controller import Controller
from actbench.actnn.correlation import QCorrBlock
from actbench.actnn.pyramid import QFeaturePyramidNetwork
from actbench.actnn import layers as L
from actbench.actnn.layers import ActNNModule, QMaxPool2d, QMaxPool3d, maxpool_supported
from actbench.actnn.transformer_layers import QCNBlock, QMultiheadAttention, QSoftmax
from actbench.actnn.levels import LevelConfig, resolve
from actbench.actnn.memory import SavedCensus, SavedGroup, saved_tensor_census

log = logging.getLogger(__name__)

# Exact torch type -> ActNN twin (subclasses of these with their own forward are not converted).
REPLACEMENTS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv1d: L.QConv1d,
    nn.Conv2d: L.QConv2d,
    nn.Conv3d: L.QConv3d,
    nn.ConvTranspose1d: L.QConvTranspose1d,
    nn.ConvTranspose2d: L.QConvTranspose2d,
    nn.ConvTranspose3d: L.QConvTranspose3d,
    nn.Linear: L.QLinear,
    nn.BatchNorm1d: L.QBatchNorm1d,
    nn.BatchNorm2d: L.QBatchNorm2d,
    nn.BatchNorm3d: L.QBatchNorm3d,
    nn.ReLU: L.QReLU,
    nn.ReLU6: L.QReLU6,
    nn.Hardtanh: L.QHardtanh,
    nn.Dropout: L.QDropout,
    nn.MaxPool2d: L.QMaxPool2d,
    nn.MaxPool3d: L.QMaxPool3d,
    nn.AvgPool2d: L.QAvgPool2d,
    nn.LayerNorm: L.QLayerNorm,
    LayerNorm2d: L.QLayerNorm2d,
    nn.GELU: L.QGELU,
    nn.SiLU: L.QSiLU,
    nn.Hardswish: L.QHardswish,
    nn.Sigmoid: L.QSigmoid,
    nn.Tanh: L.QTanh,
    nn.Hardsigmoid: L.QHardsigmoid,
    StochasticDepth: L.QStochasticDepth,
    nn.Softmax: QSoftmax,
    nn.MultiheadAttention: QMultiheadAttention,
    CNBlock: QCNBlock,
    # ResNet-3D's convs (r3d_18, mc3_18): nn.Conv3d's forward, plus a stride helper used only when built
    Conv3DSimple: L.QConv3d,
    Conv3DNoTemporal: L.QConv3d,
}

# Exact torch type -> a subclass whose forward computes the same values while keeping less: no
# slot (it rounds nothing), its submodules converted as usual, what it saves through the hook path.
LEAN_FORWARDS: dict[type[nn.Module], type[nn.Module]] = {
    CorrBlock: QCorrBlock,  # RAFT: sampling centres kept instead of sampling grids (correlation.py)
    FeaturePyramidNetwork: QFeaturePyramidNetwork,  # detectors: top-down temporaries freed (pyramid.py)
}

# Leaf modules that keep no activation worth compressing (at most a shape, or a small input at
# the network's end, which the census then reports with its bytes).
KEPT_AS_IS: tuple[type[nn.Module], ...] = (
    Permute,  # torchvision's reshaping modules (ConvNeXt, Swin, MaxViT) and an empty Sequential save nothing
    WindowPartition,
    WindowDepartition,
    SwapAxes,
    nn.Sequential,
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
)


class UnsupportedModuleError(ValueError):
    """Raised by ``convert(..., strict=True)`` when a module with saved state cannot be converted."""


@dataclass(frozen=True)
class ModuleEntry:
    name: str
    torch_type: str
    actnn_type: str | None  # None when left as is


@dataclass(frozen=True)
class ConversionReport:
    """What convert did: converted, kept, hooked and unsupported modules, and (when measured) saved bytes.

    ``hooked``: leaf modules without a twin whose saved tensors go through the saved-tensor hook
    path (``LevelConfig.saved_tensor_hooks``, docs/design.md §3). ``unsupported``: leaf modules
    left as they are that keep activations nothing compresses (only without the hook path). Both
    are measured when ``example_input`` was given (a leaf that saved nothing moves to ``kept``),
    otherwise every unconverted leaf outside :data:`KEPT_AS_IS`.

    ``census`` is None unless ``example_input`` was given to :func:`convert`; it lists every saved
    activation storage of one training forward by owner and category (see
    :class:`~actbench.actnn.memory.SavedGroup`), including what stays uncompressed and why.
    """

    level: str
    converted: tuple[ModuleEntry, ...]
    kept: tuple[ModuleEntry, ...]
    unsupported: tuple[ModuleEntry, ...]
    census: SavedCensus | None = None
    hooked: tuple[ModuleEntry, ...] = ()

    @property
    def uncompressed(self) -> tuple[SavedGroup, ...] | None:
        """Saved tensors that stay uncompressed, largest first (None without a census)."""
        return None if self.census is None else self.census.uncompressed

    def summary(self) -> str:
        """Counts, then (with a census) the share of saved bytes left uncompressed by category and owner."""
        lines = [
            f"ActNN {self.level}: {len(self.converted)} modules converted, {len(self.kept)} kept as is, "
            f"{len(self.hooked)} through the saved-tensor hook path, {len(self.unsupported)} unsupported"
        ]
        if self.census is not None:
            lines.append("  " + self.census.describe_uncompressed())
        for e in self.unsupported:
            lines.append(f"  unsupported: {e.name} ({e.torch_type})")
        if self.census is not None:
            total = self.census.total_bytes or 1
            for cat, b in sorted(self.census.bytes_by_category().items()):
                lines.append(f"  saved {cat}: {b / 2**20:.2f} MiB ({b / total:.1%})")
            for g in self.census.uncompressed:
                lines.append(f"  uncompressed: {g.owner} ({g.owner_type}) via {g.saved_by}, {g.category}: "
                             f"{g.nbytes} B in {g.count} tensors ({g.nbytes / total:.1%})")
        return "\n".join(lines)


@dataclass(frozen=True)
class Conversion:
    """The converted model, its report, and the controller holding all of its adaptive state."""

    model: nn.Module
    report: ConversionReport
    controller: Controller
    config: LevelConfig


def _has_own_state(m: nn.Module) -> bool:
    return not any(True for _ in m.children())


def convert(
    model: nn.Module,
    level: str | LevelConfig,
    *,
    example_input: torch.Tensor | tuple | None = None,
    inplace: bool = False,
    strict: bool = False,
    generator: torch.Generator | None = None,
) -> Conversion:
    """Convert ``model`` to ActNN at ``level`` (a name "L0".."L5" or a :class:`LevelConfig`).

    ``example_input``: measure what one training forward saves (bytes in the report).
    ``strict``: raise :class:`UnsupportedModuleError` instead of reporting unsupported leaf modules.
    ``generator``: CPU generator for the stochastic rounding (torch's default when None).
    """
    config = resolve(level)
    if not inplace:
        model = copy.deepcopy(model)
    controller = Controller(config, generator=generator)
    converted, kept, unsupported = _swap_in_twins(model, controller)
    hooked: list[ModuleEntry] = []
    if config.saved_tensor_hooks:
        hooks.install(controller, model)
        hooked, unsupported = unsupported, []
    census = None
    if example_input is not None:
        census = saved_tensor_census(model, example_input)
        controller.after_backward()  # the measuring forward was not a training step
        # Measured: a leaf that saved nothing (e.g. a Permute) is kept, not unsupported.
        saving = {g.owner for g in census.groups}
        kept += [e for e in unsupported + hooked if e.name not in saving]
        unsupported = [e for e in unsupported if e.name in saving]
        hooked = [e for e in hooked if e.name in saving]
    if unsupported:
        listing = ", ".join(f"{e.name} ({e.torch_type})" for e in unsupported)
        if strict:
            raise UnsupportedModuleError(
                f"actnn.convert: {len(unsupported)} module(s) keep activations actbench cannot compress: {listing}"
            )
        log.warning("actnn.convert: left uncompressed (unsupported): %s", listing)
    report = ConversionReport(config.name, tuple(converted), tuple(kept), tuple(unsupported), census, tuple(hooked))
    return Conversion(model, report, controller, config)


def _swap_in_twins(model: nn.Module, controller: Controller
                   ) -> tuple[list[ModuleEntry], list[ModuleEntry], list[ModuleEntry]]:
    """Give every module with a twin the twin's class (in place) and a slot of ``controller``;
    returns the converted, the kept-as-is and the unsupported modules."""
    converted, kept, unsupported = [], [], []
    covered: list[str] = []  # twins that use their submodules' parameters themselves (attention)
    for name, module in model.named_modules():
        if isinstance(module, ActNNModule):
            raise ValueError(f"actnn.convert: module {name or '<root>'} ({type(module).__name__}) is already converted")
        if any((name.startswith(prefix + ".") if prefix else name) for prefix in covered):
            kept.append(ModuleEntry(name, type(module).__name__, None))
            continue
        lean = LEAN_FORWARDS.get(type(module))
        if lean is not None:
            converted.append(ModuleEntry(name, type(module).__name__, lean.__name__))
            module.__class__ = lean
            continue
        twin = REPLACEMENTS.get(type(module))
        if twin in (QMaxPool2d, QMaxPool3d) and not maxpool_supported(module):
            twin = None
        if twin is not None:
            module.__class__ = twin
            module.attach(controller.register(name, twin.actnn_kind, module.actnn_cost_factor()))
            for suffix, kind, factor in module.actnn_extra_slots():
                module.attach_extra(suffix, controller.register(f"{name}.{suffix}", kind, factor))
            if twin.actnn_covers_children:
                covered.append(name)
            converted.append(ModuleEntry(name, _torch_name(twin), twin.__name__))
        elif _has_own_state(module):
            entry = ModuleEntry(name, type(module).__name__, None)
            (kept if isinstance(module, KEPT_AS_IS) else unsupported).append(entry)
    return converted, kept, unsupported


def _torch_name(twin: type[nn.Module]) -> str:
    for base, q in REPLACEMENTS.items():
        if q is twin:
            return base.__name__
    return twin.__name__


def set_host_scope(model: nn.Module, scope: Callable[[], ContextManager[None]] | None,
                   side_stream_scope: Callable[[], ContextManager[None]] | None = None) -> int:
    """Make every L4/L5 host copy of ``model``'s converted layers be made inside ``scope()``.

    Off CUDA the offloader's "host" copies are ordinary tensors; a measurement passes a context
    (e.g. ``LiveStorageTracker.host_allocations``) so they are counted as host, not device, memory
    (docs/design.md §4, ``host_bytes``). ``None`` restores the default (no scope). Returns the
    number of offloaders changed: 0 when ``model`` has no converted layer that swaps.
    ``side_stream_scope``: the context prefetched device copies are made in (what CUDA allocates on
    its side stream; docs/design.md §10), None for none.
    """
    offloaders = {}
    for module in model.modules():
        slot = module.attached_slot if isinstance(module, ActNNModule) else None
        offloader = slot.controller.offloader if slot is not None else None
        if offloader is not None:
            offloaders[id(offloader)] = offloader
    for offloader in offloaders.values():
        offloader.host_scope = scope if scope is not None else contextlib.nullcontext
        offloader.side_stream_scope = side_stream_scope if side_stream_scope is not None else contextlib.nullcontext
    return len(offloaders)
