"""L4/L5: move saved activations to host memory after forward, prefetch them back in backward.

Which saved tensors move is the level's ``swap_scope`` (actbench/actnn/levels.py): by default only
packed codes, as the original ActNN did; the layer slot hands this module just those tensors.

On CUDA the copies run on a side stream into pinned buffers, so they overlap compute; backward
runs in reverse forward order, so when the layer saved at position i is fetched, the ones saved at
i-1 .. i-depth are prefetched. On a CPU device the same logic runs with plain copies into separate
buffers (so tests cover ordering and prefetching), which of course saves no memory there.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from actbench.core.devices import profile_of

log = logging.getLogger(__name__)


@dataclass
class OffloadStats:
    """Counters for tests and reports (bytes are device -> host payload)."""

    offloaded: int = 0
    offloaded_bytes: int = 0
    prefetched: int = 0
    prefetch_hits: int = 0
    fetched_on_demand: int = 0


class Offloader:
    """Per-model swap state: one per controller; ``new_step`` starts a fresh forward order."""

    def __init__(self, prefetch_depth: int = 2) -> None:
        self.prefetch_depth = prefetch_depth
        self.stats = OffloadStats()
        # Weak references only: the host copies are owned by autograd (save_for_backward), so a
        # graph that is dropped without backward frees them.
        self._order: list[tuple[tuple[weakref.ref, ...], torch.device]] = []
        self._ready: dict[int, tuple[tuple[torch.Tensor, ...], object]] = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._step = 0
        # Off CUDA the "host" copies are ordinary tensors; a measurement may set this to a context
        # (LiveStorageTracker.host_allocations) so they count as host, not device, bytes.
        self.host_scope: Callable[[], ContextManager[None]] = contextlib.nullcontext
        # Off CUDA, a context under which prefetched device copies are made: on CUDA they are allocated
        # on the side stream, whose cached blocks the caching allocator keeps apart (the tracker tags
        # them so the allocator model can, docs/design.md §10).
        self.side_stream_scope: Callable[[], ContextManager[None]] = contextlib.nullcontext

    def new_step(self) -> None:
        """Forget the previous step's order (called at the first offload after a backward)."""
        self._order.clear()
        self._ready.clear()
        self._step += 1

    def _stream(self, device: torch.device) -> "torch.cuda.Stream":
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def offload(self, tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], tuple[int, int]]:
        """Copy ``tensors`` (all on one device) to host buffers -> (host tensors, handle)."""
        device = tensors[0].device
        if profile_of(device).async_host_copies:
            side = self._stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            host = []
            with torch.cuda.stream(side):
                for t in tensors:
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    buf.copy_(t, non_blocking=True)
                    t.record_stream(side)  # the caching allocator must not reuse t before the copy ends
                    host.append(buf)
            host = tuple(host)
        else:
            with self.host_scope():  # the harness's tracker files these copies as host memory
                host = tuple(t.clone() for t in tensors)
        self.stats.offloaded += 1
        self.stats.offloaded_bytes += sum(t.numel() * t.element_size() for t in tensors)
        self._order.append((tuple(weakref.ref(h) for h in host), device))
        return host, (self._step, len(self._order) - 1)

    def _copy_back(self, host: tuple[torch.Tensor, ...], device: torch.device):
        if profile_of(device).async_host_copies:
            side = self._stream(device)
            with torch.cuda.stream(side):
                dev = tuple(h.to(device, non_blocking=True) for h in host)
                event = torch.cuda.Event()
                event.record(side)
            return dev, event
        with self.side_stream_scope():
            return tuple(h.clone() for h in host), None

    def _prefetch(self, handle: int) -> None:
        if handle < 0 or handle >= len(self._order) or handle in self._ready:
            return
        refs, device = self._order[handle]
        host = tuple(r() for r in refs)
        if any(h is None for h in host):
            return  # that part of the graph was freed
        self._ready[handle] = self._copy_back(host, device)
        self.stats.prefetched += 1

    def fetch(self, handle: tuple[int, int], host: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
        """The device copy of the tensors saved under ``handle``; prefetches the ones before it."""
        step, index = handle
        ready = self._ready.pop(index, None) if step == self._step else None
        if ready is not None and len(ready[0]) == len(host):
            dev, event = ready
            self.stats.prefetch_hits += 1
            if profile_of(device).async_host_copies:
                current = torch.cuda.current_stream(device)
                current.wait_event(event)
                for d in dev:
                    d.record_stream(current)
        else:
            self.stats.fetched_on_demand += 1
            if profile_of(device).async_host_copies:
                # The device-to-host copy ran on the side stream; wait for it before reading.
                torch.cuda.current_stream(device).wait_stream(self._stream(device))
                dev = tuple(h.to(device, non_blocking=True) for h in host)
            else:
                dev = tuple(h.clone() for h in host)
        if step == self._step:
            for ahead in range(index - 1, index - 1 - self.prefetch_depth, -1):
                self._prefetch(ahead)
        return dev
