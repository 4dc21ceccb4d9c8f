"""A model of PyTorch's CUDA caching allocator, replaying a step's allocations and frees in order.

A GPU runs out of memory when the caching allocator cannot *reserve* another segment, not when the
bytes alive (meta's peak) pass the capacity. This replays meta's trace through the allocator's rules
(pools, best fit, splitting, releases, expandable segments, streams) in plain Python over integers,
without torch, so it runs for every meta point. The rules, their sources in PyTorch and what is left
out: docs/design.md §10 ("The caching-allocator model").
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest small-pool request
SMALL_BUFFER = 2 << 20  # small-pool segment (and expandable small-pool page)
LARGE_BUFFER = 20 << 20  # segment for requests under MIN_LARGE_ALLOC (and expandable large-pool page)
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
#: An expandable segment's address space. The allocator reserves 1 1/8 of the GPU's memory; the model does
#: not know the GPU's total (only what PyTorch may use), so it never runs out of addresses.
_UNBOUNDED_SPACE = 1 << 48

#: One trace event: (handle, nbytes); nbytes > 0 allocates ``handle``, nbytes == 0 frees it.
Event = tuple[int, int]


@dataclass(frozen=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` options the model follows (others are ignored)."""

    expandable_segments: bool = False
    max_split_size: int | None = None

    @classmethod
    def parse(cls, conf: str | None) -> "AllocatorConfig":
        """From ``PYTORCH_CUDA_ALLOC_CONF`` text (``expandable_segments:True,max_split_size_mb:128``)."""
        expandable, max_split = False, None
        for part in (conf or "").split(","):
            key, _, value = part.strip().partition(":")
            if key == "expandable_segments":
                expandable = value.strip().lower() == "true"
            elif key == "max_split_size_mb":
                max_split = int(value) << 20
        return cls(expandable_segments=expandable, max_split_size=max_split)


@dataclass(frozen=True)
class ReplayResult:
    """What the replay saw: peaks of reserved and allocated bytes, and the first allocation that failed."""

    reserved_peak: int
    allocated_peak: int
    oom_request: int | None = None  # bytes asked for when reserving failed (None: everything fitted)
    reserved_at_oom: int | None = None

    @property
    def oom(self) -> bool:
        return self.oom_request is not None


def round_size(size: int) -> int:
    """The allocator's request size: at least 512 bytes, a multiple of 512."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment a (rounded) request that no cached block fits allocates."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "allocated", "mapped", "segment")

    def __init__(self, addr: int, size: int, segment: "_Segment", mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False
        self.mapped = mapped
        self.segment = segment

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Segment:
    __slots__ = ("base", "small", "expandable", "page", "pool")

    def __init__(self, base: int, pool: "_Pool", expandable: bool) -> None:
        self.base = base
        self.small = pool.small
        self.pool = pool
        self.expandable = expandable
        self.page = SMALL_BUFFER if pool.small else LARGE_BUFFER


class _Pool:
    """Free, mapped blocks of one pool, sorted by (size, address) for best fit."""

    __slots__ = ("small", "keys", "blocks", "expandable")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, _Block] = {}
        self.expandable: _Segment | None = None

    def insert(self, block: _Block) -> None:
        bisect.insort(self.keys, (block.size, block.addr))
        self.blocks[block.addr] = block

    def remove(self, block: _Block) -> None:
        i = bisect.bisect_left(self.keys, (block.size, block.addr))
        del self.keys[i]
        del self.blocks[block.addr]


class CachingAllocatorModel:
    """The allocator's state while a trace is replayed; ``capacity`` bounds reserved bytes (None: no bound)."""

    def __init__(self, config: AllocatorConfig = AllocatorConfig(), capacity: int | None = None) -> None:
        self.config = config
        self.capacity = capacity
        self.max_split = config.max_split_size if config.max_split_size is not None else 1 << 62
        self.pools = (_Pool(small=True), _Pool(small=False))  # the main stream's (small, large)
        self._streams: dict[int, tuple[_Pool, _Pool]] = {0: self.pools}
        self.reserved = 0
        self.allocated = 0
        self.reserved_peak = 0
        self.allocated_peak = 0
        self._next_base = 1 << 40
        self._unmapped: list[_Block] = []  # unmapped ranges of expandable segments

    # --- the public operations ------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> _Block | None:
        """Allocate ``nbytes`` on ``stream``; None when the allocator would raise out-of-memory."""
        size = round_size(nbytes)
        if stream not in self._streams:
            self._streams[stream] = (_Pool(small=True), _Pool(small=False))
        pools = self._streams[stream]
        pool = pools[0] if size <= SMALL_SIZE else pools[1]
        block = self._free_block(pool, size)
        if block is None:
            block = (self._new_block(pool, size)
                     or (self._release_oversize(pool, size) and self._new_block(pool, size))
                     or (self._release_cached() and self._new_block(pool, size)))
            if block is None:
                return None
        if self._should_split(block, size, pool):
            rest = _Block(block.addr + size, block.size - size, block.segment)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        return block

    def free(self, block: _Block) -> None:
        block.allocated = False
        self.allocated -= block.size
        pool = block.segment.pool
        for other in (block.prev, block.next):
            if other is not None and not other.allocated and other.mapped == block.mapped:
                self._merge(block, other, pool)
        pool.insert(block)

    # --- finding a cached block -----------------------------------------------------------------
    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        keys = pool.keys
        i = bisect.bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        block = pool.blocks[keys[i][1]]
        if block.segment.expandable:
            # Best fit counts a block followed by unmapped space as the size it can grow to.
            def grows_to(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while block.segment.expandable and i + 1 < len(keys):
                following = pool.blocks[keys[i + 1][1]]
                if grows_to(following) >= grows_to(block):
                    break
                i, block = i + 1, following
        if size < self.max_split <= block.size:
            return None  # an oversize block serves only oversize requests
        if size >= self.max_split and block.size >= size + LARGE_BUFFER:
            return None  # ... and none much smaller than itself
        pool.remove(block)
        return block

    def _should_split(self, block: _Block, size: int, pool: _Pool) -> bool:
        rest = block.size - size
        if pool.small or block.segment.expandable:
            return rest >= MIN_BLOCK
        return size < self.max_split and rest > SMALL_SIZE

    # --- reserving memory -----------------------------------------------------------------------
    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved

    def _new_block(self, pool: _Pool, size: int) -> _Block | None:
        """A new segment (or, with expandable segments, newly mapped pages) holding a free block >= size."""
        if self.config.expandable_segments:
            return self._expand(pool, size)
        alloc = allocation_size(size)
        if not self._fits(alloc):
            return None
        segment = _Segment(self._next_base, pool, expandable=False)
        self._next_base += alloc + (1 << 30)
        self._reserve(alloc)
        return _Block(segment.base, alloc, segment)

    def _expand(self, pool: _Pool, size: int) -> _Block | None:
        if pool.expandable is None:
            space = _UNBOUNDED_SPACE
            segment = _Segment(self._next_base, pool, expandable=True)
            self._next_base += space + (1 << 40)
            space -= space % segment.page
            pool.expandable = segment
            whole = _Block(segment.base, space, segment, mapped=False)
            self._unmapped.append(whole)
        segment = pool.expandable
        candidate = self._expandable_candidate(segment, size)
        if candidate is None:
            return None
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size), pool)
            if candidate is None:
                return None
            pool.insert(candidate)
        while candidate.size < size:
            following = candidate.next  # unmapped: mapped free neighbours were merged
            mapped = self._map(following, min(size - candidate.size, following.size), pool)
            if mapped is None:
                return None  # what was mapped stays mapped and cached, as in the allocator
            candidate = mapped
            pool.insert(candidate)
        pool.remove(candidate)
        return candidate

    def _expandable_candidate(self, segment: _Segment, size: int) -> _Block | None:
        """The lowest unmapped range (with the free block just before it) with space for ``size``."""
        for unmapped in sorted((b for b in self._unmapped if b.segment is segment), key=lambda b: b.addr):
            start = unmapped
            if unmapped.prev is not None and not unmapped.prev.allocated:
                start = unmapped.prev
            space, b = 0, start
            while space < size and b is not None and not b.allocated:
                space += b.size
                b = b.next
            if space >= size:
                return start
        return None

    def _map(self, block: _Block, nbytes: int, pool: _Pool) -> _Block | None:
        """Map the pages covering the first ``nbytes`` of an unmapped block; merge with free neighbours."""
        page = block.segment.page
        mapped = min(block.size, page * ((nbytes + page - 1) // page))
        if not self._fits(mapped):
            return None
        self._unmapped.remove(block)
        if mapped < block.size:
            rest = _Block(block.addr + mapped, block.size - mapped, block.segment, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            self._unmapped.append(rest)
        block.mapped = True
        self._reserve(mapped)
        for other in (block.prev, block.next):
            if other is not None and not other.allocated and other.mapped:
                pool.remove(other)
                self._join(block, other)
        return block  # not in the pool: the caller decides

    # --- merging and releasing ------------------------------------------------------------------
    @staticmethod
    def _join(block: _Block, other: _Block) -> None:
        """Absorb the adjacent ``other`` into ``block``."""
        if other is block.prev:
            block.addr = other.addr
            block.prev = other.prev
            if block.prev is not None:
                block.prev.next = block
        else:
            block.next = other.next
            if block.next is not None:
                block.next.prev = block
        block.size += other.size

    def _merge(self, block: _Block, other: _Block, pool: _Pool) -> None:
        if other.mapped:
            pool.remove(other)
        else:
            self._unmapped.remove(other)
        self._join(block, other)

    def _release_oversize(self, pool: _Pool, size: int) -> bool:
        """Release cached whole blocks >= max_split_size, enough for ``size`` (only with max_split_size)."""
        if self.config.max_split_size is None or self.config.expandable_segments:
            return False
        target = max(size, self.max_split)
        oversize = [pool.blocks[a] for s, a in pool.keys if s >= self.max_split]
        oversize = [b for b in oversize if not b.is_split()]
        fitting = [b for b in oversize if b.size >= target]
        chosen = fitting[:1] or []
        if not chosen:
            released = 0
            for b in reversed(oversize):
                if released >= target:
                    break
                chosen.append(b)
                released += b.size
            if released < target:
                return False
        for b in chosen:
            pool.remove(b)
            self.reserved -= b.size
        return True

    def _release_cached(self) -> bool:
        """Release every whole free segment; unmap every free page of expandable segments."""
        for pool in (p for pools in self._streams.values() for p in pools):
            for block in list(pool.blocks.values()):
                if block.segment.expandable:
                    self._unmap_free_pages(block, pool)
                elif not block.is_split():
                    pool.remove(block)
                    self.reserved -= block.size
        return True

    def _unmap_free_pages(self, block: _Block, pool: _Pool) -> None:
        segment = block.segment
        page = segment.page
        offset = block.addr - segment.base
        begin = -(-offset // page) * page
        end = ((offset + block.size) // page) * page
        if begin >= end:
            return
        pool.remove(block)
        pieces = []
        if begin > offset:
            pieces.append((block.addr, begin - offset, True))
        pieces.append((segment.base + begin, end - begin, False))
        if offset + block.size > end:
            pieces.append((segment.base + end, offset + block.size - end, True))
        prev, nxt = block.prev, block.next
        made = []
        for addr, size, mapped in pieces:
            piece = _Block(addr, size, segment, mapped=mapped)
            piece.prev = made[-1] if made else prev
            if piece.prev is not None:
                piece.prev.next = piece
            made.append(piece)
        made[-1].next = nxt
        if nxt is not None:
            nxt.prev = made[-1]
        self.reserved -= end - begin
        for piece in made:
            if piece.mapped:
                pool.insert(piece)
        hole = next(p for p in made if not p.mapped)
        self._unmapped.append(hole)
        for other in (hole.prev, hole.next):
            if other is not None and not other.mapped:
                self._unmapped.remove(other)
                self._join(hole, other)


def replay(events: Iterable[Event], config: AllocatorConfig = AllocatorConfig(), capacity: int | None = None,
           model: CachingAllocatorModel | None = None) -> ReplayResult:
    """Replay ``events`` in order -> peaks and the first failed allocation (the replay stops there).

    A free of a handle never allocated (a storage alive before the trace began) is ignored.
    """
    model = CachingAllocatorModel(config, capacity) if model is None else model
    live: dict[int, _Block] = {}
    for handle, nbytes in events:
        if nbytes:
            block = model.malloc(nbytes)
            if block is None:
                return ReplayResult(model.reserved_peak, model.allocated_peak, round_size(nbytes), model.reserved)
            live[handle] = block
        else:
            block = live.pop(handle, None)
            if block is not None:
                model.free(block)
    return ReplayResult(model.reserved_peak, model.allocated_peak)


def replay_steps(persistent: Sequence[Event], step: Sequence[Event], config: AllocatorConfig = AllocatorConfig(),
                 capacity: int | None = None, steps: int = 2, side_stream: frozenset[int] = frozenset()) -> ReplayResult:
    """A training run's reserved peak: the persistent allocations, then ``steps`` repeats of one step.

    What a step leaves alive (gradients, the loss) is freed before the next one, as ``zero_grad``
    does; the first repeat is the warm-up whose cached segments the measured step reuses (a cuda
    measurement's reserved peak also includes the warm-up's segments). Handles in ``side_stream`` are
    allocated on a second stream.
    """
    model = CachingAllocatorModel(config, capacity)
    live: dict[int, _Block] = {}

    def run(events: Sequence[Event], owned: dict[int, _Block]) -> int | None:
        for handle, nbytes in events:
            if nbytes:
                block = model.malloc(nbytes, 1 if handle in side_stream else 0)
                if block is None:
                    return round_size(nbytes)
                owned[handle] = block
            else:
                block = owned.pop(handle, None)
                if block is None:
                    block = live.pop(handle, None)
                if block is not None:
                    model.free(block)
        return None

    failed = run(persistent, live)
    for _ in range(steps):
        if failed is not None:
            break
        made: dict[int, _Block] = {}
        failed = run(step, made)
        for block in made.values():
            model.free(block)
    if failed is not None:
        return ReplayResult(model.reserved_peak, model.allocated_peak, failed, model.reserved)
    return ReplayResult(model.reserved_peak, model.allocated_peak)


def next_power_of_two(n: int) -> int:
    """The pinned host allocator's block size for ``n`` bytes (docs/design.md §10)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pinned_host_peak(events: Iterable[Event]) -> int:
    """Pinned host bytes held after ``events``: PyTorch's host allocator rounds each block up to a power
    of two and caches freed blocks for requests of the same size, never returning them, so what it
    holds is, per block size, the most blocks of that size alive at once."""
    live: dict[int, int] = {}
    count: dict[int, int] = {}
    most: dict[int, int] = {}
    for handle, nbytes in events:
        if nbytes:
            size = next_power_of_two(nbytes)
            live[handle] = size
            count[size] = count.get(size, 0) + 1
            if count[size] > most.get(size, 0):
                most[size] = count[size]
        else:
            size = live.pop(handle, None)
            if size is not None:
                count[size] -= 1
    return sum(size * n for size, n in most.items())


__all__ = ["AllocatorConfig", "CachingAllocatorModel", "Event", "ReplayResult", "allocation_size",
           "next_power_of_two", "pinned_host_peak", "replay", "replay_steps", "round_size"]
