"""The caching-allocator model and the GPU specs (docs/design.md §10): rules checked by hand-computed cases.

Each case states what PyTorch's allocator does by its documented rules; a model that rounds, pools,
splits, merges or expands differently fails one of them. No torch: the model is plain Python.
"""

from __future__ import annotations

import pytest

from actbench.core.gpus import (CUBLAS_WORKSPACE_HOPPER, CUBLAS_WORKSPACE_PRE_HOPPER, GIB, GPU_NAMES, GPU_SPECS, MIB,
                           gpu_spec)
from actbench.planning.allocator_model import (AllocatorConfig, CachingAllocatorModel, allocation_size, next_power_of_two,
                                        pinned_host_peak, replay, replay_steps, round_size)

EXPANDABLE = AllocatorConfig(expandable_segments=True)


# --- rounding and segment sizes -------------------------------------------------------------------
@pytest.mark.parametrize("size, rounded", [(1, 512), (512, 512), (513, 1024), (1000, 1024), (5 * MIB + 1, 5 * MIB + 512)])
def test_requests_round_up_to_multiples_of_512_bytes(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


@pytest.mark.parametrize("size, segment", [
    (512, 2 * MIB), (1 * MIB, 2 * MIB),  # small pool: 2 MiB segments
    (1 * MIB + 512, 20 * MIB), (10 * MIB - 512, 20 * MIB),  # 1-10 MiB: a 20 MiB segment
    (10 * MIB, 10 * MIB), (11 * MIB, 12 * MIB), (21 * MIB, 22 * MIB),  # larger: rounded up to 2 MiB
])
def test_segment_sizes_follow_the_pools(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


def test_small_requests_share_one_2_mib_segment_and_large_ones_a_20_mib_one() -> None:
    events = [(i, 100_000) for i in range(20)]  # 20 x 100 kB (rounded to 100,352 B) fit in 2 MiB
    assert replay(events).reserved_peak == 2 * MIB
    assert replay(events + [(99, 100_000)] * 1 + [(98, 100_000)]).reserved_peak == 4 * MIB  # 22 no longer fit
    # three 6 MiB requests share one 20 MiB segment (split, rest > 1 MiB), the fourth needs another
    assert replay([(i, 6 * MIB) for i in range(3)]).reserved_peak == 20 * MIB
    assert replay([(i, 6 * MIB) for i in range(4)]).reserved_peak == 40 * MIB
    # pools are separate: a free large block never serves a small request
    assert replay([(1, 6 * MIB), (1, 0), (2, 4096)]).reserved_peak == 22 * MIB


# --- best fit, splitting, merging -----------------------------------------------------------------
def test_best_fit_takes_the_smallest_free_block_that_fits() -> None:
    model = CachingAllocatorModel()
    a, b = model.malloc(40 * MIB), model.malloc(24 * MIB)
    model.free(a)
    model.free(b)
    chosen = model.malloc(20 * MIB)  # 24 MiB fits more tightly than 40 MiB
    assert chosen.addr == b.addr and model.reserved == 64 * MIB


def test_a_large_block_is_split_only_when_more_than_1_mib_would_remain() -> None:
    model = CachingAllocatorModel()
    seg = model.malloc(12 * MIB)
    model.free(seg)
    near = model.malloc(11 * MIB + 512)  # remainder 1 MiB - 512 B: not split, the whole block is used
    assert near.size == 12 * MIB
    model.free(near)
    far = model.malloc(10 * MIB)  # remainder 2 MiB: split
    assert far.size == 10 * MIB and model.malloc(2 * MIB).addr == far.addr + 10 * MIB
    assert model.reserved == 12 * MIB


def test_freed_neighbours_merge_back_into_one_block() -> None:
    model = CachingAllocatorModel()
    a, b, c = model.malloc(6 * MIB), model.malloc(6 * MIB), model.malloc(6 * MIB)  # one 20 MiB segment
    for block in (a, c, b):
        model.free(block)
    assert model.pools[1].keys == [(20 * MIB, a.addr)]
    assert model.malloc(18 * MIB).addr == a.addr and model.reserved == 20 * MIB


def test_max_split_size_keeps_oversize_blocks_for_oversize_requests() -> None:
    config = AllocatorConfig.parse("max_split_size_mb:32")
    assert config.max_split_size == 32 * MIB and not config.expandable_segments
    # a cached 40 MiB block does not serve a 20 MiB request (it would be split) ...
    assert replay([(1, 40 * MIB), (1, 0), (2, 20 * MIB)], config).reserved_peak == 60 * MIB
    # ... nor a 36 MiB request if it were 20 MiB or more larger; a 100 MiB block does not serve 40 MiB
    assert replay([(1, 40 * MIB), (1, 0), (2, 36 * MIB)], config).reserved_peak == 40 * MIB
    assert replay([(1, 100 * MIB), (1, 0), (2, 40 * MIB)], config).reserved_peak == 140 * MIB
    # without the option the 40 MiB block is split for the 20 MiB request
    assert replay([(1, 40 * MIB), (1, 0), (2, 20 * MIB)]).reserved_peak == 40 * MIB


def test_max_split_size_releases_only_enough_oversize_blocks_before_every_free_segment() -> None:
    model = CachingAllocatorModel(AllocatorConfig.parse("max_split_size_mb:32"), capacity=80 * MIB)
    big, mid = model.malloc(40 * MIB), model.malloc(24 * MIB)
    model.free(big)
    model.free(mid)
    # 30 MiB: the cached 40 MiB is oversize (not for a request under 32 MiB), 24 MiB is too small, and a new
    # 30 MiB segment would pass 80 MiB: the oversize block is released, the 24 MiB one stays cached
    assert model.malloc(30 * MIB) is not None and model.reserved == 24 * MIB + 30 * MIB


def test_the_strategies_allocator_settings_parse() -> None:
    from actbench import strategies

    assert AllocatorConfig.parse(strategies.cuda_alloc_conf("L5")) == EXPANDABLE
    assert AllocatorConfig.parse(strategies.cuda_alloc_conf("L4")) == AllocatorConfig()


# --- running out of memory ------------------------------------------------------------------------
def test_a_hand_computed_trace_and_its_out_of_memory() -> None:
    # 30 MiB, 30 MiB, free the first, 40 MiB: the 30 MiB hole cannot hold 40 MiB -> 100 MiB reserved
    trace = [(1, 30 * MIB), (2, 30 * MIB), (1, 0), (3, 40 * MIB)]
    assert replay(trace).reserved_peak == 100 * MIB and replay(trace).allocated_peak == 70 * MIB
    # capped at 80 MiB: the failed segment releases the free 30 MiB segment and the retry fits (70 MiB)
    capped = replay(trace, capacity=80 * MIB)
    assert not capped.oom and capped.reserved_peak == 70 * MIB
    # capped at 60 MiB: even after releasing, 30 + 40 > 60: out of memory on the 40 MiB request
    failed = replay(trace, capacity=60 * MIB)
    assert failed.oom and failed.oom_request == 40 * MIB and failed.reserved_at_oom == 30 * MIB


def test_a_split_segment_with_a_live_block_is_not_released() -> None:
    # 6 MiB in a 20 MiB segment stays alive: the segment cannot be given back, so 20 + 20 > 30 fails
    trace = [(1, 6 * MIB), (2, 6 * MIB), (2, 0), (3, 20 * MIB)]
    assert replay(trace, capacity=40 * MIB).reserved_peak == 40 * MIB
    assert replay(trace, capacity=30 * MIB).oom


# --- expandable segments --------------------------------------------------------------------------
def test_expandable_segments_map_20_mib_pages_and_grow_at_the_end() -> None:
    model = CachingAllocatorModel(EXPANDABLE)
    a = model.malloc(30 * MIB)
    assert model.reserved == 40 * MIB  # two 20 MiB pages; the 10 MiB left is free at the end
    b = model.malloc(30 * MIB)  # the free 10 MiB tail grows by one page instead of a new segment
    assert b.addr == a.addr + 30 * MIB and model.reserved == 60 * MIB
    small = model.malloc(4096)
    assert model.reserved == 62 * MIB and small.segment.page == 2 * MIB  # the small pool has 2 MiB pages


def test_expandable_segments_unmap_free_pages_when_memory_runs_out() -> None:
    trace = [(1, 30 * MIB), (2, 30 * MIB), (1, 0), (3, 40 * MIB)]
    # unbounded: the 30 MiB hole at the start stays mapped, 40 MiB more is mapped at the end
    assert replay(trace, EXPANDABLE).reserved_peak == 100 * MIB
    # capped at 80 MiB: the hole's whole page (20 MiB) is unmapped, and 40 + 40 fits; fixed
    # segments cannot do this at 70 MiB (the 30 MiB segment is released, 30 + 40 = 70 fits there too)
    assert not replay(trace, EXPANDABLE, capacity=80 * MIB).oom
    # the difference that matters for L5: a live block in a large fixed segment pins all of it
    pinned = [(1, 6 * MIB), (2, 14 * MIB), (2, 0), (3, 30 * MIB)]
    assert replay(pinned, capacity=40 * MIB).oom  # 20 MiB segment (6 MiB live) + 30 MiB > 40 MiB
    assert not replay(pinned, EXPANDABLE, capacity=40 * MIB).oom  # the freed 14 MiB tail grows into 30 MiB


def test_replay_steps_reuses_the_warm_up_segments_and_frees_what_a_step_leaves() -> None:
    persistent = [(-1, 50 * MIB)]
    step = [(1, 30 * MIB), (2, 8 * MIB), (1, 0)]  # (2) survives the step, like a gradient
    assert replay_steps(persistent, step).reserved_peak == 50 * MIB + 30 * MIB + 20 * MIB
    assert replay_steps(persistent, step, capacity=90 * MIB).oom


# --- pinned host memory -----------------------------------------------------------------------------
def test_pinned_host_memory_rounds_to_powers_of_two_and_caches_per_size() -> None:
    assert [next_power_of_two(n) for n in (1, 3, 4096, 4097, 3 * GIB)] == [1, 4, 4096, 8192, 4 * GIB]
    # two 3 GiB blocks alive at once (4 GiB each), then one 5 GiB (8 GiB): the 4 GiB blocks stay cached
    events = [(1, 3 * GIB), (2, 3 * GIB), (1, 0), (2, 0), (3, 5 * GIB), (4, 3 * GIB)]
    assert pinned_host_peak(events) == 2 * 4 * GIB + 8 * GIB


# --- GPU specs -----------------------------------------------------------------------------------
def test_gpu_specs_carry_their_documented_values() -> None:
    assert GPU_NAMES == ("t4", "v100", "l4", "a10", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "rtx3090",
                         "rtx4090")
    t4 = gpu_spec("t4")
    assert t4.memory_bytes == 16 * GIB and t4.ecc_reserved_bytes == 1 * GIB and t4.context_bytes == 512 * MIB
    assert t4.usable_bytes == 16 * GIB - 1 * GIB - 512 * MIB
    assert t4.workspace_allocations() == (CUBLAS_WORKSPACE_PRE_HOPPER, 1 * MIB) and CUBLAS_WORKSPACE_PRE_HOPPER == 8519680
    assert gpu_spec("a100-80gb").workspace_allocations() == (CUBLAS_WORKSPACE_PRE_HOPPER, 4 * MIB)
    assert gpu_spec("a10").workspace_allocations() == (CUBLAS_WORKSPACE_PRE_HOPPER, 1 * MIB)  # 22.5 GiB reported
    assert gpu_spec("h200").workspace_allocations() == (CUBLAS_WORKSPACE_HOPPER, 32 * MIB)
    assert gpu_spec("h200").usable_bytes == 141 * GIB - 512 * MIB  # HBM: no in-band ECC
    assert gpu_spec("rtx4090").ecc_reserved_bytes == 0 and gpu_spec("l4").ecc_reserved_bytes == 24 * GIB // 16
    for profile in GPU_SPECS.values():
        assert {"memory", "ecc", "context", "workspaces"} <= set(profile.sources), profile.name


def test_an_unknown_gpu_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU 't5'; choose t4, v100, l4, .*rtx4090"):
        gpu_spec("t5")


def test_blocks_are_reused_only_on_the_stream_that_allocated_them() -> None:
    model = CachingAllocatorModel()
    model.free(model.malloc(30 * MIB))
    assert model.malloc(30 * MIB, stream=1) is not None and model.reserved == 60 * MIB  # a new segment
    assert model.malloc(30 * MIB) is not None and model.reserved == 60 * MIB  # stream 0 reuses its own
    # in a replay, the handles of L4/L5's prefetched copies are on the side stream
    trace = [(1, 30 * MIB), (1, 0), (2, 30 * MIB)]
    assert replay_steps((), trace, steps=1).reserved_peak == 30 * MIB
    assert replay_steps((), trace, steps=1, side_stream=frozenset({2})).reserved_peak == 60 * MIB
