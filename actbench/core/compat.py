"""The only module of actbench that touches private PyTorch APIs.

Private names move between PyTorch releases; keeping every use here means a torch upgrade breaks one
file, and its tests say which name moved. Public APIs (FlopCounterMode, saved_tensors_hooks,
checkpoint) are imported where they are used.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
# TorchDispatchMode sees every ATen op with its real output tensors: the live-storage tracker builds
# on it because it counts real storages (views dedup to their base) rather than estimating.
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten
from torch._ops import OpOverload, OpOverloadPacket, _len_torch_dispatch_stack_pre_dispatch

from actbench.core.devices import holds_data

__all__ = ["TorchDispatchMode", "tree_flatten", "dispatch_modes_disabled", "memtracker_class", "tensor_version",
           "fake_tensor_mode", "is_fake", "as_fake_like", "data_dependent_ops", "storage_identity",
           "parameters_on_meta", "fake_module",
           "forget_compiled_graphs", "clear_cublas_workspaces", "softmax_backward", "builtin_avg_pool2d",
           "has_dispatch_kernel", "op_flops", "op_bytes_moved", "torch_function_disabled",
           "internal_compute_ops", "torch_callables", "callable_name"]


def tensor_version(tensor: "torch.Tensor") -> int:
    """In-place modification counter of a tensor's data (``Tensor._version``, no public equivalent)."""
    return tensor._version


def torch_function_disabled() -> "contextlib.AbstractContextManager":
    """A context in which torch calls skip every ``__torch_function__`` mode and override
    (``torch._C.DisableTorchFunction``); dispatch modes (fake tensors, FLOP counting) still apply.
    Entered and left by separate calls (a module's pre- and post-forward hooks), so it is returned
    as an object, not a generator."""
    return torch._C.DisableTorchFunction()


def dispatch_modes_disabled() -> "contextlib.AbstractContextManager":
    """Run a block with every active dispatch mode switched off (bookkeeping inside a mode). With no
    mode active (every real step) nothing needs switching off, and the switch costs tens of
    microseconds: ActNN draws a seed per quantized tensor through this."""
    if torch._C._len_torch_dispatch_stack() == 0 and _len_torch_dispatch_stack_pre_dispatch() == 0:
        return contextlib.nullcontext()
    return _disable_current_modes()


def memtracker_class() -> type:
    """PyTorch's own MemTracker (torch.distributed._tools), for cross-checks; not used to measure.

    actbench measures with its own tracker because MemTracker's category split (it files gradients
    created inside backward as temporaries) does not match docs/design.md's columns.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker


# --- the meta device: fake tensors ---------------------------------------------------------------
# FakeTensorMode runs every ATen op through its meta kernel (the extension's through the fake kernels
# in actbench.kernels.ops) on tensors that have a device, shape and dtype but no data: a training step is
# sized without compute or memory. It is private API (torch._subclasses), hence here.


def fake_tensor_mode() -> "contextlib.AbstractContextManager":
    """A fresh FakeTensorMode; tensors created inside it (parameters included) are fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _quiet_meta_kernel_failures()
    return FakeTensorMode()


def _quiet_meta_kernel_failures() -> None:
    """FakeTensorMode logs a meta kernel's exception with its traceback before raising it again; the
    exception becomes the point's ``error`` row and its one-line message, so the log is dropped (any
    other record of that logger still passes)."""
    import logging

    from torch._subclasses import fake_tensor

    logger = getattr(fake_tensor, "log", logging.getLogger(fake_tensor.__name__))
    if not any(isinstance(f, _MetaKernelFailure) for f in logger.filters):
        logger.addFilter(_MetaKernelFailure())


class _MetaKernelFailure:
    """A logging filter: False for FakeTensorMode's "failed while attempting to run meta for OP" record."""

    def filter(self, record: object) -> bool:
        return not str(getattr(record, "msg", "")).startswith("failed while attempting to run meta")


def is_fake(tensor: object) -> bool:
    """True for a fake tensor (no data: reading values back is impossible)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def as_fake_like(tensor: "torch.Tensor", fake: "torch.Tensor") -> "torch.Tensor":
    """Real ``tensor`` as a fake tensor of ``fake``'s mode: a constant a module keeps outside its
    parameters and buffers (torchvision's anchors), met by an op on fake tensors."""
    return fake.fake_mode.from_tensor(tensor)


def data_dependent_ops() -> tuple[OpOverloadPacket, OpOverloadPacket]:
    """The private ATen ops a value-dependent step reaches beside ``nonzero``: ``_local_scalar_dense``
    (``.item()``, a tensor's truth value) and ``_unique2`` (``torch.unique``), for a dispatch mode that
    answers them on fake tensors (actbench/training/detection_sizing.py)."""
    return torch.ops.aten._local_scalar_dense, torch.ops.aten._unique2


def storage_identity(tensor: "torch.Tensor") -> int:
    """An id of the storage behind ``tensor``, equal for views, distinct per live storage.

    ``data_ptr()`` would do on real tensors, but every fake tensor's storage reports 0; the address
    of the C++ StorageImpl (``_cdata``) is unique on both.
    """
    return tensor.untyped_storage()._cdata


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the ``meta`` device (no data, no init).

    ``nn.Module.register_parameter`` (which ``module.weight = Parameter(...)`` goes through) is
    wrapped so that each new parameter is replaced at once by an uninitialised twin on ``meta``:
    init functions on it are no-ops (``trunc_normal_``'s rejection sampling, data-dependent under
    fake tensors, returns at once), while everything else the constructor computes (RegNet's
    widths with ``.tolist()``, Swin's relative position index) runs on real CPU tensors. Buffers
    stay real. The same idea as accelerate's ``init_empty_weights``; meta sizing turns the result
    into fake tensors with :func:`fake_module`.
    """
    import torch
    from torch import nn

    original = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and holds_data(param):
            param = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def fake_module(model: "torch.nn.Module", mode: object, device: "torch.device") -> "torch.nn.Module":
    """Turn ``model``'s parameters, buffers and tensor attributes into fake tensors of ``mode`` on ``device``.

    Meta tensors (parameters built under :func:`parameters_on_meta`) become fake tensors of the same
    shape, strides and dtype; real tensors (buffers) go through ``mode.from_tensor``, which keeps
    their values as fake metadata and storage sharing between views. A tensor shared by several
    modules stays shared. Returns ``model``, changed in place.
    """
    import torch
    from torch import nn

    memo: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        if is_fake(t):
            return t
        if id(t) not in memo:
            if not holds_data(t):
                with mode:
                    fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
            else:
                fake = mode.from_tensor(t.detach().to(device))
            if isinstance(t, nn.Parameter):
                with mode:
                    fake = nn.Parameter(fake, requires_grad=t.requires_grad)
            memo[id(t)] = fake
        return memo[id(t)]

    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is not None:
                    store[name] = convert(t)
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not name.startswith("_"):
                object.__setattr__(module, name, convert(value))
    return model


# --- torch.compile (the ``compile`` strategy) ----------------------------------------------------
# The activation memory budget is a private functorch config, and resetting dynamo's caches and its
# recompile limit are private dynamo calls; all of them are here.

#: A debug backend of torch.compile that runs dynamo, AOT autograd, inductor's decompositions and its
#: min-cut partitioner (the activation memory budget included), then executes the graphs eagerly
#: through the dispatcher, where the live-storage tracker (cpu, meta) can see every buffer.
EAGER_PARTITIONED_BACKEND = "aot_eager_decomp_partition"


def activation_memory_budget(budget: float | None) -> "contextlib.AbstractContextManager":
    """``torch._functorch.config.activation_memory_budget`` set to ``budget`` inside the block.

    The partitioner reads it when a graph is compiled, which happens in the first forward; None
    leaves torch's default (1.0: keep what the min-cut partitioner picks).
    """
    if budget is None:
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config

    return functorch_config.patch(activation_memory_budget=budget)


def reset_compiler(recompile_limit: int = 64) -> None:
    """Forget every graph dynamo compiled in this process, and fail loudly past ``recompile_limit``.

    A compiled graph is cached on the model class's code and guarded on shapes, not on the
    functorch config, so ``compile@0.5`` after ``compile`` in one process (meta runs in-process)
    would otherwise reuse the earlier graph. Meta reuses one model over several batch sizes (one
    static graph each); past the limit dynamo would silently run eager, so it raises instead.
    """
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, recompile_limit)
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def forget_compiled_graphs() -> None:
    """Drop dynamo's compiled graphs, if dynamo was ever loaded (a worker between points)."""
    import sys

    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()


def clear_cublas_workspaces() -> None:
    """Free cuBLAS's per-stream workspaces, which ``empty_cache`` keeps (no public equivalent)."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def softmax_backward(grad: "torch.Tensor", output: "torch.Tensor", dim: int, dtype: "torch.dtype") -> "torch.Tensor":
    """Softmax's gradient from its output (ATen's ``_softmax_backward_data``: no public form)."""
    import torch

    return torch.ops.aten._softmax_backward_data(grad, output, dim, dtype)


def builtin_avg_pool2d() -> object:
    """The C function ``F.avg_pool2d`` is bound to, which modules may call directly."""
    import torch

    return torch._C._nn.avg_pool2d


def has_dispatch_kernel(qualified_op: str, dispatch_key: str) -> bool:
    """Whether ``qualified_op`` (``ns::name``) has a kernel registered for ``dispatch_key`` (e.g. CUDA)."""
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(qualified_op, dispatch_key))


# --- the step-time model's per-op counts (actbench.planning.step_time) --------------------------------
# torch.utils._runtime_estimation holds the views and creation ops that move no bytes and the bytes an
# op reads and writes (broadcast dimensions read once); FlopCounterMode's formulas are in flop_registry.


def op_flops(func: object, args: tuple, kwargs: dict, out: object) -> int:
    """FLOPs of one ATen op by FlopCounterMode's formula for it (2 per multiply-add); 0 without one."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(getattr(func, "overloadpacket", func))
    return 0 if formula is None else int(formula(*args, **kwargs, out_val=out))


def op_bytes_moved(func: object, inputs: list, outputs: list) -> int:
    """DRAM bytes one ATen op reads and writes (its tensor inputs and outputs); 0 for a view or a creation
    op that PyTorch's runtime estimator ignores.

    Counted as its ``get_num_bytes`` counts them (a broadcast dimension, stride 0, is read once), on the
    concrete shapes of a traced step: its symbolic-shape checks cost a meta step as much again.
    """
    from torch.utils._runtime_estimation import _IGNORE_OPS

    if getattr(func, "overloadpacket", func) in _IGNORE_OPS:
        return 0
    total = 0
    for t in (*inputs, *outputs):
        n = t.element_size()
        for size, stride in zip(t.shape, t.stride()):
            if stride:
                n *= size
        total += n
    return total


#: aten's internal convolution and fused-attention ops, which the public ``convolution`` and
#: ``scaled_dot_product_attention`` dispatch to (which exist depends on the build).
_INTERNAL_COMPUTE_OPS = ("_convolution", "_scaled_dot_product_flash_attention",
                         "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                         "_scaled_dot_product_cudnn_attention")


def internal_compute_ops() -> list:
    """The op packets of :data:`_INTERNAL_COMPUTE_OPS` this torch build has: what a recompute policy
    sees when a model calls a convolution or fused attention."""
    return [getattr(torch.ops.aten, n) for n in _INTERNAL_COMPUTE_OPS if hasattr(torch.ops.aten, n)]


def torch_callables(op: str) -> list:
    """The callables a ``TorchFunctionMode`` can see for ``op``: ``"ns::name"`` gives the
    ``torch.ops`` packet and its overloads (for ``aten`` also ``torch.<name>`` and
    ``Tensor.<name>``), a dotted path (``"torch.nn.functional.grid_sample"``) that function. Empty
    when the op's library is not loaded. Names are looked up by string, which may reach private
    attributes, hence here."""
    if "::" not in op:
        module, _, name = op.rpartition(".")
        target = torch
        for part in module.split(".")[1:]:
            target = getattr(target, part, None)
        found = getattr(target, name, None)
        return [found] if found is not None else []
    namespace, name = op.split("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return []
    out = [packet, *(getattr(packet, overload) for overload in packet.overloads())]
    if namespace == "aten":
        out += [f for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None)) if f is not None]
    return out


def callable_name(func) -> str:
    """A readable name of what a ``TorchFunctionMode`` was called with: ``"torchvision::roi_align"``
    for a ``torch.ops`` op (whose ``__qualname__`` is a pybind11 record), else its qualified name."""
    if isinstance(func, OpOverloadPacket):
        return func._qualified_op_name
    if isinstance(func, OpOverload):
        return func.name()
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
