"""A live-storage tracker: exact bytes of tensor storages alive, and their peak, on the CPU path.

Why not an allocator counter: on CPU PyTorch keeps no allocation statistics, so the tracker watches
every op's outputs through a dispatch mode and follows each storage's lifetime with a weak reference.
Views and in-place results share their base's storage and are counted once. Storages created inside
``host_allocations()`` are filed as *host* memory (where ``swap`` parks saved tensors), so on a CPU
run the device columns still show what a GPU would hold. Kernel-internal scratch buffers that never
become tensors are not seen (a GPU's allocator would count them).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

from actbench.core.compat import TorchDispatchMode, storage_identity, tree_flatten
from actbench.core.devices import holds_data


#: ATen ops that copy tensors (the step-time model prices them at PCIe bandwidth when they cross to the host)
COPY_OPS = frozenset(("copy_", "clone", "_to_copy"))


@dataclass
class _Entry:
    ref: weakref.ref
    nbytes: int
    host: bool
    serial: int = 0


class _ObservedMode(TorchDispatchMode):
    """A dispatch mode whose ``observer``, where it has ``start`` and ``stop``, hears the mode entered
    and left (the step-time recorder also writes down module calls while the step runs)."""

    observer: Any = None

    def __enter__(self) -> Any:
        getattr(self.observer, "start", lambda: None)()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            getattr(self.observer, "stop", lambda: None)()


class LiveStorageTracker(_ObservedMode):
    """Tracks storages created (or adopted) while active; bytes are exact storage sizes in bytes.

    Device bytes and host bytes are kept apart; ``peak_bytes`` is the device peak since the last
    ``reset_peak()``. Use as a context manager around the code to measure.

    ``record=True`` also keeps the order of allocations and frees (``device_events``, ``host_events``:
    ``(serial, nbytes)`` to allocate, ``(serial, 0)`` to free), which the caching-allocator model
    replays (actbench/planning/allocator_model.py, docs/design.md §10).
    """

    def __init__(self, record: bool = False, observer: Any = None) -> None:
        super().__init__()
        #: sees every op as ``observer.observe(func, args, kwargs, out, copy)`` (the step-time model's
        #: recorder, actbench/planning/step_time.py); ``copy``: it moves bytes between device and host
        self.observer = observer
        self._entries: dict[int, _Entry] = {}
        self._host_depth = 0
        self._serial = 0
        self.device_events: list[tuple[int, int]] | None = [] if record else None
        self.host_events: list[tuple[int, int]] | None = [] if record else None
        #: index of ``device_events`` where the measured step begins (before it: adopted state)
        self.step_start = 0
        self._side_depth = 0
        #: serials of device storages made inside ``side_stream_allocations()`` (CUDA's side stream)
        self.side_stream_serials: set[int] = set()
        self.live_bytes = 0
        self.host_live_bytes = 0
        self.peak_bytes = 0
        self.host_peak_bytes = 0

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let torch.compile'd code run under the tracker (the ``compile`` strategy).

        With the default (False) dynamo would fall back to eager whenever the tracker is active; True
        keeps the tracker off while compiling and on while the compiled graphs run, so it counts what
        they allocate (through the dispatcher: the ``compile`` strategy's tracked devices run the
        graphs eagerly, docs/design.md §1).
        """
        return True

    # -- bookkeeping -------------------------------------------------------------------------
    def _record(self, host: bool, serial: int, nbytes: int) -> None:
        events = self.host_events if host else self.device_events
        if events is not None:
            events.append((serial, nbytes))

    def _release(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._record(entry.host, entry.serial, 0)
        if entry.host:
            self.host_live_bytes -= entry.nbytes
        else:
            self.live_bytes -= entry.nbytes

    def _see(self, tensor: torch.Tensor, host: bool | None = None) -> None:
        if not holds_data(tensor) or tensor.layout != torch.strided:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        nbytes = storage.nbytes()
        key = id(storage)
        entry = self._entries.get(key)
        if entry is not None and entry.ref() is storage:
            if nbytes > entry.nbytes:  # resize_ grew it in place: a new block, then the old one freed
                self._add(entry.host, nbytes - entry.nbytes)
                entry.nbytes = nbytes
                self._serial += 1
                self._record(entry.host, self._serial, nbytes)
                self._record(entry.host, entry.serial, 0)
                entry.serial = self._serial
            return
        if nbytes == 0:
            return
        is_host = (self._host_depth > 0) if host is None else host
        ref = weakref.ref(storage, lambda _r, k=key: self._release(k))
        self._serial += 1
        self._entries[key] = _Entry(ref=ref, nbytes=nbytes, host=is_host, serial=self._serial)
        if self._side_depth and not is_host:
            self.side_stream_serials.add(self._serial)
        self._record(is_host, self._serial, nbytes)
        self._add(is_host, nbytes)

    def _add(self, host: bool, nbytes: int) -> None:
        if host:
            self.host_live_bytes += nbytes
            self.host_peak_bytes = max(self.host_peak_bytes, self.host_live_bytes)
        else:
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    # -- public API --------------------------------------------------------------------------
    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count storages that existed before tracking began (parameters, optimizer state, data)."""
        for tensor in tensors:
            self._see(tensor, host=False)

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self.peak_bytes = self.live_bytes
        self.host_peak_bytes = self.host_live_bytes

    @contextlib.contextmanager
    def host_allocations(self) -> Iterator[None]:
        """Storages first seen inside this block are host memory (swap buffers), not device memory."""
        self._host_depth += 1
        try:
            yield
        finally:
            self._host_depth -= 1

    @contextlib.contextmanager
    def side_stream_allocations(self) -> Iterator[None]:
        """Device storages first seen inside this block are allocated on a side stream on CUDA (L4/L5's
        prefetched copies): the caching-allocator model keeps their blocks in that stream's pools."""
        self._side_depth += 1
        try:
            yield
        finally:
            self._side_depth -= 1

    def _crosses_host(self, func: Any, args: Any, kwargs: Any) -> bool:
        """Whether ``func`` copies between device and host storages: a copy op inside ``host_allocations()``
        reading a device storage (an offload), or outside it reading a host storage (a fetch)."""
        if getattr(getattr(func, "overloadpacket", None), "__name__", None) not in COPY_OPS:
            return False
        for leaf in tree_flatten((args, kwargs))[0]:
            if not isinstance(leaf, torch.Tensor) or not holds_data(leaf) or leaf.layout != torch.strided:
                continue
            entry = self._entries.get(id(leaf.untyped_storage()))
            if entry is not None and entry.host != (self._host_depth > 0):
                return True
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        copy = self.observer is not None and self._crosses_host(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.observer is not None:
            self.observer.observe(func, args, kwargs, out, copy)
        # What _see reads (storage, size, layout) is metadata, not an op: no mode needs switching off
        # around it, and switching them off per op cost 8 % of an L3 meta step and 18 % of fp32's.
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self._see(leaf)
        return out


class OpObserver(_ObservedMode):
    """Shows every op to ``observer`` where no live-storage tracker runs (cuda, whose caching allocator
    counts the bytes): a copy is a copy op whose tensors are on more than one device."""

    def __init__(self, observer: Any) -> None:
        super().__init__()
        self.observer = observer

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        copy = False
        if getattr(getattr(func, "overloadpacket", None), "__name__", None) in COPY_OPS:
            devices = {t.device for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)}
            copy = len(devices) > 1
        self.observer.observe(func, args, kwargs, out, copy)
        return out


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared storages counted once)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in tensors:
        if tensor is None or not holds_data(tensor):
            continue
        key = (str(tensor.device), storage_identity(tensor))  # not data_ptr(): 0 on every fake tensor
        if key in seen:
            continue
        seen.add(key)
        total += tensor.untyped_storage().nbytes()
    return total
