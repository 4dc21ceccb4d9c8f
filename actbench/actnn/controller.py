"""Per-model adaptive state: the L3 bit allocator, the swap offloader, and the step boundary.

One :class:`Controller` per converted model, held by its :class:`~actbench.actnn.convert.Conversion`
and reached by each converted layer through a :class:`LayerSlot`, so no state is global. Once a
step, with one host round trip, it turns last step's statistics (gradient norms, group ranges) into
per-layer and per-sample bit widths, which each layer hands out by current range on the device. The
cost model, the budgets and why: docs/design.md §2 ("Cost model"); the levels: §3.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import torch

from actbench.core import compat

from actbench.kernels import ops
from actbench.actnn.levels import UNIFORM_BITS, LevelConfig
from actbench.actnn.offload import Offloader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerInfo:
    """A compressing layer known to the controller; ``cost_factor`` scales its variance estimate."""

    name: str
    kind: str  # "conv" | "linear" (shared budget), "bn" | "norm" | "act" | "qk" | "hook" (own budgets), "mask" | "pool"
    cost_factor: float


@dataclass(frozen=True)
class LayerAllocation:
    """Bits of one layer in one step: per-sample widths (sorted, widest first) and their mean."""

    name: str
    bits_desc: tuple[int, ...]
    elements_per_sample: int

    @property
    def mean_bits(self) -> float:
        return sum(self.bits_desc) / len(self.bits_desc)


@dataclass(frozen=True)
class PackSpec:
    """How a saved activation was stored (no tensors: those go through save_for_backward)."""

    kind: str  # "raw" | "packed" | "mask" | "argmax"
    shape: torch.Size
    dtype: torch.dtype
    bits: int | None = None  # uniform bits; None when raw or per-sample
    mixed: bool = False
    group_size: int = ops.DEFAULT_GROUP_SIZE
    view_shape: torch.Size | None = None  # original shape when a 0/1-D input was packed as [1, F]
    offload: tuple[int, int] | None = None  # the offloader's handle when some tensors went to the host
    offloaded: tuple[int, ...] = ()  # positions, among the saved tensors, of those host copies
    device: torch.device | None = None


def uniform_bits(n: int, target: float, min_bits: int = 1, max_bits: int = 8) -> list[int]:
    """max(n, floor(target * n)) sample-bits spread evenly over n samples, widest first."""
    total = min(max(n * min_bits, math.floor(target * n)), n * max_bits)
    base, extra = divmod(total, n)
    return [base + 1] * extra + [base] * (n - extra)


class Controller:
    """Adaptive state of one converted model (docs/design.md §2, "Cost model")."""

    def __init__(self, config: LevelConfig, generator: torch.Generator | None = None) -> None:
        self.config = config
        self.generator = generator
        self.layers: list[LayerInfo] = []
        self.offloader = Offloader(config.prefetch_depth) if config.swap else None
        self.step = 0  # counts forward passes that started after a backward
        self._backward_seen = True
        #: per layer: last step's ||grad_output||^2 (a 0-d tensor on the device) and its sample count
        self._grad_sq: dict[int, tuple[torch.Tensor, int]] = {}
        self._range_sq: dict[int, torch.Tensor] = {}
        self._seeds: list[list[int]] = []  # this step's Philox (seed, offset) pairs not yet used
        self._elements: dict[int, int] = {}
        #: per layer: (step, its forward calls in that step); a layer run several times in one forward
        #: (a recurrent unit's convolutions) saves an input per call
        self._calls: dict[int, tuple[int, int]] = {}
        self._positions: dict[int, int] = {}
        self._allocation: dict[int, LayerAllocation] = {}
        self._dynamic: dict[str, LayerSlot] = {}

    # -- registration -------------------------------------------------------------------------

    def register(self, name: str, kind: str, cost_factor: float = 1.0) -> "LayerSlot":
        """Add a layer; returns the slot the layer keeps."""
        self.layers.append(LayerInfo(name, kind, cost_factor))
        return LayerSlot(self, len(self.layers) - 1)

    def dynamic_slot(self, name: str, kind: str, cost_factor: float = 1.0) -> "LayerSlot":
        """The slot named ``name``, registered the first time it is asked for (the saved-tensor hook
        path meets its tensors only in forward; the same name in a later step gets the same slot)."""
        slot = self._dynamic.get(name)
        if slot is None:
            slot = self._dynamic[name] = self.register(name, kind, cost_factor)
        return slot

    def target_bits(self, kind: str) -> float | None:
        """The level's bits for an input saved by a layer of ``kind`` (None: full precision).

        conv/linear inputs (and layer scale): ``conv_bits``; normalised inputs of BatchNorm and
        LayerNorm: ``bn_bits``; attention's Q and K: ``qk_bits``; everything else (activation
        derivatives, softmax outputs, attention's V, the saved-tensor hook path): ``act_bits``.
        """
        if kind in SHARED_BUDGET_KINDS:
            return self.config.conv_bits
        if kind in NORM_KINDS:
            return self.config.bn_bits
        if kind == QK_KIND:
            return self.config.qk_bits
        return self.config.act_bits

    # -- the step boundary --------------------------------------------------------------------

    def before_save(self) -> None:
        """Called by every compressing forward: the first one after a backward starts a step."""
        if not self._backward_seen:
            return
        self._backward_seen = False
        self.step += 1
        self._seeds = []
        if self.offloader is not None:
            self.offloader.new_step()
        if self.config.mixed_precision and self._grad_sq:
            self._reallocate()

    def after_backward(self) -> None:
        self._backward_seen = True

    def draw_seed_offset(self) -> tuple[int, int]:
        """Philox seed and offset for one quantization, from this controller's CPU generator.

        Drawn SEEDS_PER_DRAW pairs at a time (one generator call instead of one per layer; a new
        step starts a new draw), with dispatch modes off, so a forward under FakeTensorMode (the
        harness's meta sizing) gets real numbers instead of failing on a data-dependent ``int()``.
        """
        if not self._seeds:
            with compat.dispatch_modes_disabled():
                self._seeds = torch.randint(0, 2**62, (SEEDS_PER_DRAW, 2), generator=self.generator, dtype=torch.int64,
                                            device="cpu").tolist()[::-1]
        seed, offset = self._seeds.pop()
        return seed, offset

    def record_grad(self, index: int, grad_output: torch.Tensor) -> None:
        """The layer's ||grad_output||^2 and its sample count, kept on the device until the next step.

        Only the batch mean per sample enters the cost (docs/design.md §2): one dot product over the
        whole gradient (memory speed), not a per-sample reduction; ``_reallocate`` divides, once a step.
        """
        self._backward_seen = True
        if not self.config.mixed_precision:
            return
        g = grad_output.detach()
        flat = g.reshape(-1)
        if flat.dtype in (torch.float32, torch.float64):
            total = torch.dot(flat, flat).float()
        else:  # 16-bit: accumulate in fp32 without an fp32 copy of the gradient
            total = torch.linalg.vector_norm(flat, dtype=torch.float32).square()
        self._grad_sq[index] = (total, g.shape[0] if g.dim() > 1 else 1)

    # -- allocation ---------------------------------------------------------------------------

    def _reallocate(self) -> None:
        """One host round trip: last step's statistics -> per-layer multisets of widths."""
        groups: dict[tuple, list[int]] = {}
        for index in sorted(self._grad_sq):
            r2 = self._range_sq.get(index)
            if r2 is None or r2.numel() != self._grad_sq[index][1]:
                continue
            kind = self.layers[index].kind
            target = self.target_bits(kind)
            if target is None:
                continue
            # Conv/linear layers share one budget (per-layer + per-sample allocation). A BatchNorm
            # input's error also flows into every earlier layer's gradient through BN's input
            # gradient, which the local cost does not see: each BN keeps its own budget and only
            # varies bits across samples (as upstream did). The same holds for every other kind
            # (LayerNorm, activation derivatives, softmax, attention, hook-packed tensors): their
            # error reaches the input gradient, so each keeps its own budget.
            key = (float(target), -1 if kind in SHARED_BUDGET_KINDS else index)
            groups.setdefault(key, []).append(index)
        self._allocation = {}
        if not groups:
            return
        order = [i for key in sorted(groups) for i in groups[key]]
        totals = torch.stack([self._grad_sq[i][0] for i in order])
        if compat.is_fake(totals):
            # Meta sizing (fake tensors, no data): keep the uniform allocation of each target. With
            # unit weights the greedy lands on exactly max(N, floor(target * N)) sample-bits per
            # budget; with real statistics the split between layers differs and the total moves
            # slightly (docs/design.md §4).
            return
        # each layer's mean per sample, in fp32 as its sum; an overflowed sum (a diverging run) counts 0
        samples = torch.tensor([self._grad_sq[i][1] for i in order], dtype=totals.dtype, device=totals.device)
        means = torch.nan_to_num(totals / samples, posinf=0.0)
        stacked = torch.cat([means, *(self._range_sq[i].to(totals.device) for i in order)])
        try:
            host_values = stacked.to("cpu", torch.float64).tolist()  # the one device -> host transfer per step
        except RuntimeError as exc:  # fake tensors without data (meta sizing): the uniform allocation, as above
            log.info("actnn: statistics have no data (%s); uniform allocation this step", type(exc).__name__)
            return
        with compat.dispatch_modes_disabled():  # plain CPU bookkeeping, also inside a FakeTensorMode
            self._allocate(groups, order, host_values)
        log.debug("actnn step %d: network mean bits %.3f", self.step, self.network_mean_bits() or float("nan"))

    def _allocate(self, groups: dict[tuple, list[int]], order: list[int], values: list[float]) -> None:
        """Greedy allocation per budget group from last step's statistics (float64 on the CPU): ``values`` holds each
        layer's mean ||grad||^2 per sample, in ``order``, then each layer's per-sample ranges. Python floats, not tiny
        tensor ops per layer (5-10 ms a step)."""
        stats, pos = {}, len(order)
        for k, i in enumerate(order):
            n = self._grad_sq[i][1]
            stats[i] = (values[k], values[pos : pos + n])
            pos += n
        for (target, _), indices in groups.items():
            # Bits are chosen in forward, before a sample's own gradient exists: last step's per-sample norms belong
            # to other samples, so a layer's cost uses their mean and the split across samples follows the range. A
            # diverging run's overflowed statistic (inf, or inf x 0 = nan) counts 0, as the layer means' does.
            cost, weight = [], []
            for i in indices:
                scale = self._cost_factor(i) * self._calls_per_step(i) * stats[i][0]
                cost += [scale * r for r in stats[i][1]]
                weight += [float(self._elements[i])] * len(stats[i][1])
            cost = torch.nan_to_num(torch.tensor(cost, dtype=torch.float64), nan=0.0, posinf=0.0)
            bits = ops.allocate_bits(cost, torch.tensor(weight, dtype=torch.float64), target * sum(weight),
                                     self.config.min_bits, self.config.max_bits).tolist()
            for i in indices:
                desc, bits = sorted(bits[: len(stats[i][1])], reverse=True), bits[len(stats[i][1]) :]
                self._allocation[i] = LayerAllocation(self.layers[i].name, tuple(desc), self._elements[i])

    def _cost_factor(self, index: int) -> float:
        """Variance of the weight gradient per unit of ||g||^2 * sum_groups range^2 (constants dropped).

        Var(grad W) = sum over output positions of ||g_p||^2 * (the quantization variance summed
        over the elements p reads). With the mean per-element variance
        S * sum range^2 / (4 B^2 F_in), that is ||g||^2 * S sum range^2 / (4 B^2) * reads / F_in.
        A conv output position reads (C_in / groups) * k elements of F_in = C_in * spatial: the
        factor is k / (groups * spatial) — a 32-group 3x3 conv is charged 9/32 per position, not
        9, or depthwise layers get bits they cannot use. A linear layer's token reads ``in`` of
        F_in = tokens * in: 1 / tokens (1 for a 2-D input). The layer supplies k / groups (or 1)
        as ``cost_factor``; the positions (spatial size, tokens) are the input's, seen in forward.
        Without the division a conv's cost is overstated by its map size and small layers (fc)
        are starved of bits.
        """
        return self.layers[index].cost_factor / self._positions.get(index, 1)

    def _calls_per_step(self, index: int) -> int:
        """How many inputs layer ``index`` saved in its last step: a layer called k times in one forward
        (RAFT's update block, 12 times) costs k times the bytes and k times the gradient variance of
        one call, so its weight and cost in the shared budget are both k times one call's."""
        return self._calls.get(index, (0, 1))[1]

    def record_packed_ranges(self, index: int, packed: ops.PackedTensor) -> None:
        """Per sample, the sum over groups of range^2, from a packed tensor's scales: scale = (2^b - 1) / (range + eps)
        rounded towards zero, so (2^b - 1) / scale is the range to one bf16 step (non-finite groups -> 0). torch's
        levels / scale (a reciprocal, then a product), in place on one fp32 copy: out of place it held two [N, groups]
        temporaries at once, at ResNet-50's peak on meta (docs/design.md §2)."""
        span = packed.scale.to(torch.float32, copy=True).reciprocal_().mul_(float((1 << packed.bits) - 1))
        self._range_sq[index] = torch.nan_to_num_(span.square_(), nan=0.0, posinf=0.0).sum(1)

    def allocation(self) -> dict[str, LayerAllocation]:
        """The current step's per-layer allocation (empty before the first adaptive step)."""
        return {a.name: a for a in self._allocation.values()}

    def network_mean_bits(self) -> float | None:
        """Element-weighted mean bits of the current allocation (None before the first)."""
        allocs = list(self._allocation.values())
        if not allocs:
            return None
        total = sum(sum(a.bits_desc) * a.elements_per_sample for a in allocs)
        return total / sum(len(a.bits_desc) * a.elements_per_sample for a in allocs)

    def sample_bits(self, index: int, x: torch.Tensor) -> int | torch.Tensor:
        """Bits for each sample of ``x`` [N, ...] saved by layer ``index`` (int when uniform)."""
        return self.plan_bits(index, x).bits

    def plan_bits(self, index: int, x: torch.Tensor) -> "BitPlan":
        """This step's bits for ``x`` [N, ...] saved by layer ``index``, with what quantize needs.

        Everything the quantizer would otherwise read back from the device is returned from the
        host: ``total_bits`` is the sum of the per-sample widths (known here, where the multiset
        lives), and ``minmax`` is the per-group min/max already computed for the range statistic
        (None when every sample gets one width: then nothing needs the ranges before quantizing).
        Without them ``ops.quantize`` checks and sums the bits tensor with ``int()`` — three host
        syncs per layer and step — and computes the min/max a second time.
        """
        kind = self.layers[index].kind
        target = self.target_bits(kind)
        n = x.shape[0]
        step, calls = self._calls.get(index, (-1, 0))
        calls = calls + 1 if step == self.step else 1
        self._calls[index] = (self.step, calls)
        self._elements[index] = calls * (x.numel() // n)  # per sample, over this step's calls so far
        self._positions[index] = _positions(kind, x)
        if not self.config.mixed_precision:
            return BitPlan(int(target))
        alloc = self._allocation.get(index)
        if alloc is not None and len(alloc.bits_desc) == n:
            desc = list(alloc.bits_desc)
        else:
            desc = uniform_bits(n, float(target), self.config.min_bits, self.config.max_bits)
        if len(set(desc)) == 1 and desc[0] in UNIFORM_BITS:
            # One width for all: no rank match, so the quantizer takes the ranges in its own pass
            # and the range statistic is read back from its scales (record_packed_ranges).
            return BitPlan(desc[0], ranges_from_scales=True)
        minmax = ops.group_minmax(x, self.config.group_size, backend=self.config.backend)
        mn, mx = minmax
        r2 = torch.nan_to_num_((mx - mn).square_(), nan=0.0, posinf=0.0).sum(1)
        self._range_sq[index] = r2
        # Rank match on the device: the widest widths go to the samples with the largest ranges.
        rank = torch.argsort(r2, descending=True, stable=True)
        bits = torch.empty(n, dtype=torch.int32, device=x.device)
        bits[rank] = torch.tensor(desc, dtype=torch.int32).to(x.device, non_blocking=True)
        return BitPlan(bits, total_bits=sum(desc), minmax=minmax)


#: Philox (seed, offset) pairs drawn from the generator at once (a step of ResNet-50 quantizes 107 inputs)
SEEDS_PER_DRAW = 64
#: Kinds whose saved input only feeds their weight gradient: they share one network-wide budget.
SHARED_BUDGET_KINDS = ("conv", "linear")
#: Normalisation layers (their normalised input, at ``bn_bits``).
NORM_KINDS = ("bn", "norm")
#: attention's queries and keys (``LevelConfig.qk_bits``)
QK_KIND = "qk"


def _positions(kind: str, x: torch.Tensor) -> int:
    """Output positions that reuse one input element's quantization error in the weight gradient.

    A conv's input [N, C, *spatial] is read at every spatial position; an N-D linear layer's
    [N, *tokens, in] at every token (a 2-D [N, in] has one). See Controller._cost_factor.
    """
    if kind == "conv":
        return math.prod(x.shape[2:])
    if kind == "linear":
        return math.prod(x.shape[1:-1])
    return 1


#: Attribute marking a tensor an ActNN layer keeps, with its role: the census files it under it.
SAVED_ROLE = "_actnn_saved_role"
ROLE_COMPRESSED = "compressed"
ROLE_FULL_PRECISION = "full precision by level"
ROLE_STATISTICS = "layer statistics"


def saved_role(t: torch.Tensor) -> str | None:
    """The role an ActNN layer gave ``t`` (None: not kept by one)."""
    return getattr(t, SAVED_ROLE, None)


@dataclass(frozen=True)
class BitPlan:
    """One layer's bits in one step: an int (uniform) or a per-sample int32 tensor on the device,
    with their sum known on the host and the group min/max already computed (both may be None)."""

    bits: int | torch.Tensor
    total_bits: int | None = None
    minmax: tuple[torch.Tensor, torch.Tensor] | None = None
    #: the range statistic is to be taken from the packed scales after quantizing (uniform width)
    ranges_from_scales: bool = False


class LayerSlot:
    """A layer's handle on its controller: compress, store (maybe offload), restore."""

    __slots__ = ("controller", "index")

    def __init__(self, controller: Controller, index: int) -> None:
        self.controller = controller
        self.index = index

    @property
    def config(self) -> LevelConfig:
        return self.controller.config

    @property
    def info(self) -> LayerInfo:
        return self.controller.layers[self.index]

    # -- saving ---------------------------------------------------------------------------------

    def save_input(self, x: torch.Tensor, whole_rows: bool = False) -> tuple[tuple[torch.Tensor, ...], PackSpec]:
        """Compress the input of a conv/linear/BN layer as the level says -> (tensors, spec). ``whole_rows``:
        rows shorter than a group are packed as one row (docs/design.md §3); loading restores the shape."""
        c = self.controller
        c.before_save()
        target = c.target_bits(self.info.kind)
        if target is None or x.dtype not in ops.PACKABLE_DTYPES or x.numel() == 0:
            return self._stash((x,), PackSpec("raw", x.shape, x.dtype, device=x.device))
        one_row = x.dim() < 2 or (whole_rows and x.numel() < x.shape[0] * self.config.group_size)
        view_shape, x = (x.shape, x.reshape(1, -1)) if one_row else (None, x)
        plan = c.plan_bits(self.index, x)
        bits = plan.bits
        packed = ops.quantize(
            x, bits, group_size=self.config.group_size, backend=self.config.backend, seed_offset=c.draw_seed_offset(),
            total_bits=plan.total_bits, minmax=plan.minmax,
        )
        if plan.ranges_from_scales:
            c.record_packed_ranges(self.index, packed)
        mixed = isinstance(bits, torch.Tensor)
        spec = PackSpec(
            "packed", x.shape, x.dtype, None if mixed else bits, mixed, self.config.group_size, view_shape, device=x.device
        )
        return self._stash(packed.tensors, spec)

    def save_mask(self, mask: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], PackSpec]:
        """A bool mask -> 1 bit per element."""
        self.controller.before_save()
        return self._stash((ops.pack_mask(mask),), PackSpec("mask", mask.shape, torch.bool, device=mask.device))

    def save_argmax(self, argmax: torch.Tensor, input_shape: torch.Size) -> tuple[tuple[torch.Tensor, ...], PackSpec]:
        """A max pool's int8 argmax (already compact)."""
        self.controller.before_save()
        return self._stash((argmax,), PackSpec("argmax", input_shape, argmax.dtype, device=argmax.device))

    def _stash(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec):
        """Swap (L4/L5) the tensors the level's ``swap_scope`` names to the host; keep the rest.

        Every tensor returned is marked with its role (``SAVED_ROLE``), which the saved-tensor hook
        path (it leaves them alone) and the census (it files them by role) read.
        """
        tensors, spec = self._offload(tensors, spec)
        role = ROLE_FULL_PRECISION if spec.kind == "raw" else ROLE_COMPRESSED
        for t in tensors:
            setattr(t, SAVED_ROLE, role)
        return tensors, spec

    def _offload(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec):
        off = self.controller.offloader
        positions = self._swapped(tensors, spec) if off is not None else ()
        if not positions:
            return tensors, spec
        host, handle = off.offload(tuple(tensors[i] for i in positions))
        kept = list(tensors)
        for i, h in zip(positions, host):
            kept[i] = h
        return tuple(kept), dataclasses.replace(spec, offload=handle, offloaded=positions)

    def _swapped(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec) -> tuple[int, ...]:
        # "codes" is the original's scope: only packed codes (tensors[0] of a PackedTensor) move;
        # metadata, masks and argmax are small and stay on the device (levels.py, LevelConfig).
        if self.config.swap_scope == "all":
            return tuple(range(len(tensors)))
        return (0,) if spec.kind == "packed" else ()

    # -- restoring ------------------------------------------------------------------------------

    def _unstash(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec) -> tuple[torch.Tensor, ...]:
        if spec.offload is None:
            return tensors
        fetched = self.controller.offloader.fetch(spec.offload, tuple(tensors[i] for i in spec.offloaded), spec.device)
        restored = list(tensors)
        for i, d in zip(spec.offloaded, fetched):
            restored[i] = d
        return tuple(restored)

    def load_input(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec) -> torch.Tensor:
        tensors = self._unstash(tensors, spec)
        if spec.kind == "raw":
            return tensors[0]
        bits = tensors[3] if spec.mixed else spec.bits
        packed = ops.PackedTensor(tensors[0], tensors[1], tensors[2], bits, spec.group_size, spec.shape, spec.dtype)
        x = ops.dequantize(packed, backend=self.config.backend)
        return x.reshape(spec.view_shape) if spec.view_shape is not None else x

    def load_mask(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec) -> torch.Tensor:
        (packed,) = self._unstash(tensors, spec)
        return ops.unpack_mask(packed, spec.shape)

    def masked_grad(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec, grad: torch.Tensor,
                    scale: float) -> torch.Tensor:
        """grad * scale where the packed mask is set, else 0: one kernel for the packable dtypes."""
        (packed,) = self._unstash(tensors, spec)
        if grad.dtype in ops.PACKABLE_DTYPES and grad.shape == spec.shape:
            return ops.apply_mask(grad, packed, scale)
        mask = ops.unpack_mask(packed, spec.shape)
        return grad * mask * scale if scale != 1.0 else grad * mask

    def load_argmax(self, tensors: tuple[torch.Tensor, ...], spec: PackSpec) -> torch.Tensor:
        (argmax,) = self._unstash(tensors, spec)
        return argmax

    def record_grad(self, grad_output: torch.Tensor) -> None:
        self.controller.record_grad(self.index, grad_output)

    def after_backward(self) -> None:
        self.controller.after_backward()
