"""The saved-tensor hook path: every floating saved tensor that no ActNN twin handles is quantized.

Twins (``layers.py``) compress what their own layers keep; everything else autograd saves in a
converted model's forward reaches the ``saved_tensors_hooks`` a :class:`SavedTensorPacker` installs,
and is packed with the same ops, slots, mixed precision and offload as a twin's input. While it is
installed, a ``TorchFunctionMode`` reroutes functional activations and pools to the twins' autograd
functions. What is packed, what is rerouted and why: docs/design.md §3 ("The saved-tensor hook path").
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from torch.overrides import TorchFunctionMode

from actbench.core import compat

from actbench.kernels import ops
from actbench.actnn import saved_arguments as arguments
from actbench.actnn.controller import (QK_KIND, ROLE_COMPRESSED, Controller, LayerSlot, PackSpec,
                                      saved_role)
from actbench.actnn import routes
from actbench.actnn.layers import ActNNModule
from actbench.actnn.functions import kept_by_twin

#: Why a saved tensor was left as it is (the census files it under these reasons).
SKIP_NOT_FLOATING = "integer or bool"
SKIP_DTYPE = "not packable dtype"
SKIP_STATE = "model state"
SKIP_SMALL = "small"
SKIP_TWIN = "kept by twin"
SKIP_LEVEL = "full precision by level"
SKIP_POSITION = "positions: kept exact"  # saved_arguments.py: boxes, grids, offsets
#: The owner of what a loss computed after the model's forward saves (:meth:`SavedTensorPacker.covering_loss`);
#: not a module name, so no module's census entry can take it.
LOSS_OWNER = "(loss)"
#: A loss's own saved tensors (log-probabilities, exponentials) feed nonlinear backwards: rounded, they
#: would bias the gradient, so only the loss twins (loss_functions.py) compress a loss.
SKIP_LOSS = "loss: full precision"


@dataclass
class HookPacked:
    """A tensor the hook path packed: what :meth:`SavedTensorPacker.unpack` restores."""

    slot: LayerSlot
    tensors: tuple[torch.Tensor, ...]
    spec: PackSpec
    owner: str


class SavedTensorPacker:
    """Installs the hook path around one converted model's training forwards (see the module doc)."""

    def __init__(self, controller: Controller, model: nn.Module) -> None:
        self.controller = controller
        self.observer: Callable[[torch.Tensor, HookPacked | None, str | None, str], None] | None = None
        self._names = weakref.WeakKeyDictionary({m: (n or type(model).__name__) for n, m in model.named_modules()})
        self._root_name = type(model).__name__
        self._root = model  # a strong reference: deepcopy of the model then maps it to the copy
        self._context = None
        self._covering_loss = False
        # per module running: (owner name, inside an ActNN twin's forward, entered the rerouting mode,
        # the context that keeps torch-function modes off inside the outermost twin, or None)
        self._frames: list[tuple[str, bool, bool, object | None]] = []
        self._functional: _FunctionalTwins | None = None
        #: the functional call being rerouted to a twin right now (for the census), else None
        self.routing: str | None = None
        #: the last training forward's saved bytes: (owner, owner type, category) -> [bytes, count]
        self.saved: dict[tuple[str, str, str], list[int]] = {}
        self._seen: set[int] = set()
        self._types: dict[str, str] = {n or type(model).__name__: type(m).__name__ for n, m in model.named_modules()}
        self._types[LOSS_OWNER] = "loss"
        self._counts: dict[str, int] = {}
        self._cache: dict[tuple, tuple[weakref.ref, HookPacked]] = {}
        self._state: set[int] = set()
        #: op -> where its arguments with a role are (saved_arguments.py), rebuilt at each training forward
        self.argument_ops: dict = {}
        #: the callables of saved_arguments.QUERY_KEY_PRODUCTS
        self.query_key_products = arguments.query_key_products()
        self._marked: list[arguments.Mark] = []  # arguments with a role of the calls running now
        # Every module, not only the root: a checkpointed segment's recompute in backward calls its
        # modules without the root, and must reroute functional calls as its forward did (checkpoint
        # compares what both saved). The same modules hold the state :meth:`_start` reads.
        self._modules = list(model.modules())
        for module in self._modules:
            module.register_forward_pre_hook(self._push)
            module.register_forward_hook(self._pop, always_call=True)

    # -- the model's forward ------------------------------------------------------------------

    def _push(self, module: nn.Module, args) -> None:
        training = module.training and torch.is_grad_enabled()
        if training and module is self._root and self._context is None:
            self._start(module)
        entered = False
        if training and self._functional is None:
            self._functional = _FunctionalTwins(self)
            self._functional.__enter__()
            entered = True
        name = self._names.get(module)
        owner = name if name is not None else (self._frames[-1][0] if self._frames else self._root_name)
        outer_in_twin = self._frames[-1][1] if self._frames else False
        in_twin = outer_in_twin or isinstance(module, ActNNModule)
        # A twin's own calls are never rerouted: run them without the rerouting mode, which would
        # otherwise see every torch call of the twin and its controller (thousands a step).
        quiet = None
        if in_twin and not outer_in_twin and self._functional is not None:
            quiet = compat.torch_function_disabled()
            quiet.__enter__()
        self._frames.append((owner, in_twin, entered, quiet))

    def _pop(self, module: nn.Module, args, output) -> None:
        if not self._frames:
            return
        _, _, entered, quiet = self._frames.pop()
        if quiet is not None:
            quiet.__exit__(None, None, None)
        if entered and self._functional is not None:
            functional, self._functional = self._functional, None
            functional.__exit__(None, None, None)
        if module is self._root and self._context is not None and not self._frames and not self._covering_loss:
            self._end()

    @contextlib.contextmanager
    def covering_loss(self) -> Iterator[None]:
        """Keep the hook path on from the model's training forward through the loss computed after it.

        A loss outside the model (segmentation's cross-entropy over H x W, optical flow's |error|)
        saves as much as a layer; inside this scope its saved tensors reach :meth:`pack` and its
        cross-entropy and |x| are rerouted to the loss twins (``loss_functions.py``), owned by
        :data:`LOSS_OWNER`; what else it saves stays as torch keeps it (:data:`SKIP_LOSS`). Outside a
        training forward (eval, no grad, hooks already on) it does nothing.
        """
        model = self._root
        if not (model.training and torch.is_grad_enabled()) or self._context is not None:
            yield
            return
        self._start(model)
        functional = self._functional = _FunctionalTwins(self)
        functional.__enter__()
        self._covering_loss = True
        try:
            yield
        finally:
            self._covering_loss = False
            self._functional = None
            functional.__exit__(None, None, None)
            if self._context is not None:
                self._end()

    def _start(self, model: nn.Module) -> None:
        """A training forward of the whole model begins: install the saved-tensor hooks."""
        # Each module's own parameters and buffers, read now (a replaced parameter counts): the same
        # tensors as model.parameters() and buffers(), whose walk of the module tree (names, a
        # memo) took 0.34 ms of a ResNet-50 step's host time, against 0.05 ms for the identities.
        self._state = {compat.storage_identity(t) for m in self._modules
                       for t in (*m._parameters.values(), *m._buffers.values()) if t is not None}
        self._counts.clear()
        self.saved, self._seen, self._cache = {}, set(), {}
        self.argument_ops = arguments.argument_roles()
        self._context = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._context.__enter__()

    def _end(self) -> None:
        context, self._context = self._context, None
        context.__exit__(None, None, None)
        self._state = set()
        self._cache = {}  # dedup is within one forward; autograd alone keeps the packed tensors after it

    @property
    def _owner(self) -> str:
        if self._frames:
            return self._frames[-1][0]
        return LOSS_OWNER if self._covering_loss else self._root_name

    @property
    def in_model(self) -> bool:
        """Whether a module of the model is running (not the loss after it)."""
        return bool(self._frames)

    @property
    def in_twin(self) -> bool:
        """Whether an ActNN twin's forward is running (its own calls are not rerouted)."""
        return bool(self._frames) and self._frames[-1][1]

    def functional_slot(self, what: str, kind: str) -> LayerSlot:
        """A slot for a rerouted functional call, named ``<owner>:<what>:<n>``."""
        owner = self._owner
        n = self._counts.get(owner, 0)
        self._counts[owner] = n + 1
        return self.controller.dynamic_slot(f"{owner}:{what}:{n}", kind)

    # -- the hooks ----------------------------------------------------------------------------

    def skip_reason(self, t: torch.Tensor, role: str | None = None) -> str | None:
        """Why ``t`` (passed as an argument with ``role``, saved_arguments.py) stays as it is, or None
        when it is packed."""
        if kept_by_twin(t):
            return SKIP_TWIN
        # the storage first: isinstance(t, nn.Parameter) runs a Python __instancecheck__
        if compat.storage_identity(t) in self._state or isinstance(t, nn.Parameter):
            return SKIP_STATE
        if role == arguments.ROLE_POSITION:
            return SKIP_POSITION
        if self._covering_loss and not self._frames:
            return SKIP_LOSS
        if not t.is_floating_point():
            return SKIP_NOT_FLOATING
        if t.dtype not in ops.PACKABLE_DTYPES:
            return SKIP_DTYPE
        if t.numel() < self.controller.config.hook_min_elements:
            return SKIP_SMALL
        config = self.controller.config
        if (config.qk_bits if role == arguments.ROLE_QUERY_KEY else config.act_bits) is None:
            return SKIP_LEVEL
        return None

    def call_with_roles(self, func, args: tuple, kwargs: dict, marks: list[arguments.Mark]):
        """Run an op of saved_arguments.py: what it saves from its positions stays exact, its queries
        and keys are packed at ``qk_bits``."""
        self._marked.extend(marks)
        try:
            return func(*args, **kwargs)
        finally:
            del self._marked[len(self._marked) - len(marks):]

    def _account(self, owner: str, category: str, tensors) -> None:
        """The running census of this forward (storages counted once): see ``memory.last_forward_census``."""
        for t in tensors:
            key = compat.storage_identity(t)
            if key in self._seen:
                continue
            self._seen.add(key)
            entry = self.saved.setdefault((owner, self._types.get(owner, "?"), category), [0, 0])
            entry[0] += t.untyped_storage().nbytes()
            entry[1] += 1

    def pack(self, t: torch.Tensor):
        owner = self._owner
        role = arguments.role_of(t, self._marked) if self._marked else None
        reason = self.skip_reason(t, role)
        if reason is not None:
            if reason != SKIP_STATE:
                self._account(owner, saved_role(t) if reason == SKIP_TWIN else reason, (t,))
            if self.observer is not None:
                self.observer(t, None, reason, owner)
            return t
        c = self.controller
        c.before_save()  # may start a new step
        key = (compat.storage_identity(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
               compat.tensor_version(t), role)
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is not None:
            packed = hit[1]
        else:
            n = self._counts.get(owner, 0)
            self._counts[owner] = n + 1
            slot = c.dynamic_slot(f"{owner}:{n}", QK_KIND if role == arguments.ROLE_QUERY_KEY else "hook")
            # whole rows: the quantizer pads each row to whole groups, and a detector's [anchors, 91]
            # scores would take 256 values' codes and a range a row
            tensors, spec = slot.save_input(t.detach(), whole_rows=True)
            packed = HookPacked(slot, tensors, spec, owner)
            self._cache[key] = (weakref.ref(t), packed)
            if c.config.mixed_precision and t.requires_grad and t.dim() > 1 and not compat.is_fake(t):
                index = slot.index
                t.register_hook(lambda g: c.record_grad(index, g))
        self._account(owner, ROLE_COMPRESSED, packed.tensors)
        if self.observer is not None:
            self.observer(t, packed, None, owner)
        return packed

    def unpack(self, packed):
        if not isinstance(packed, HookPacked):
            return packed
        self.controller.after_backward()
        return packed.slot.load_input(packed.tensors, packed.spec)


class _FunctionalTwins(TorchFunctionMode):
    """Reroutes functional activations to the twins' autograd functions (see the module doc)."""

    def __init__(self, packer: SavedTensorPacker) -> None:
        super().__init__()
        self.packer = packer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        locations = self.packer.argument_ops.get(func)
        if locations is not None:
            return self.packer.call_with_roles(func, args, kwargs, arguments.marks(args, kwargs, locations))
        product = arguments.query_key_product_marks(func, args, kwargs, self.packer.query_key_products)
        if product is not None and not self.packer.in_twin:
            return self.packer.call_with_roles(func, args, kwargs, product)
        route = routes.routes().get(func)
        if route is not None and not self.packer.in_twin and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            if x.requires_grad and x.dtype in ops.PACKABLE_DTYPES and x.numel() > 0:
                self.packer.routing = getattr(func, "__name__", "?")
                try:
                    out = route(self.packer, x, args[1:], kwargs)
                finally:
                    self.packer.routing = None
                if out is not NotImplemented:
                    return out
        return func(*args, **kwargs)


def packer_of(model: nn.Module) -> SavedTensorPacker | None:
    """The packer :func:`actbench.actnn.convert` installed on ``model`` or, for a model that wraps a
    converted one, on its first submodule that has one (None: none)."""
    for module in model.modules():
        packer = module.__dict__.get("_actnn_packer")
        if packer is not None:
            return packer
    return None


def loss_scope(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """The context a training loop computes a converted ``model``'s forward and loss in, so that the
    loss's saved tensors are compressed too (:meth:`SavedTensorPacker.covering_loss`); a no-op for a
    model without the hook path."""
    packer = packer_of(model)
    return packer.covering_loss() if packer is not None else contextlib.nullcontext()


def install(controller: Controller, model: nn.Module) -> SavedTensorPacker:
    packer = SavedTensorPacker(controller, model)
    object.__setattr__(model, "_actnn_packer", packer)
    return packer
