"""The host cost of a strategy's own Python, for ``actbench calibrate``.

A step of a strategy that wraps layers in Python (ActNN's twins and their autograd functions, the
controller; checkpoint's segments and recompute) spends host time the per-op ``host_op_s`` does not
see. The probe trains a tiny model (tensors of a few hundred values, so device time is negligible)
under each strategy and under fp32, records each step's ops and strategy calls
(:class:`~actbench.planning.step_time.OpRecorder`), and prices one call of a kind as the strategy
step's host time over fp32's, less ``host_op_s`` for each extra ATen op, over the number of calls.
Swap and save_on_cpu have no layers of their own: their calls are the copies their saved-tensor hooks
make (:func:`~actbench.planning.step_time.host_copy_kind`), the extra copy ops of their step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from actbench.core.devices import DeviceProfile
from actbench.measure.tracker import COPY_OPS, OpObserver
from actbench.planning.step_time import KERNEL, STRATEGY_CALL, OpRecorder, host_copy_kind

#: Strategies probed, each giving the call kind(s) its step records: ActNN's levels L0-L3, plain and
#: selective checkpointing, and the two that copy saved tensors to the host from a hook.
PROBED_STRATEGIES: tuple[str, ...] = ("L0", "L1", "L2", "L3", "checkpoint", "sac", "swap", "save_on_cpu")
#: Kinds not probed, priced as another: L4 and L5 are L3 whose codes move to the host (their copies are
#: priced as copies); ``actnn_layer``, a level without a value of its own, takes L0's, the cheapest (a floor).
DERIVED_KINDS = {"actnn_layer:L4": "actnn_layer:L3", "actnn_layer:L5": "actnn_layer:L3",
                 "actnn_layer": "actnn_layer:L0"}


@dataclass(frozen=True)
class StrategyProbe:
    """One strategy's tiny step: its fastest time, its dispatched ops and its strategy calls by kind."""

    seconds: float
    dispatched: int
    calls: dict[str, int]
    #: tensor bytes the step's copy ops wrote (``copy_``, ``clone``, ``_to_copy``: swap's saved tensors and
    #: their way back, among others)
    copied: int = 0


def tiny_model(blocks: int = 4, channels: int = 8) -> nn.Module:
    """A ResNet-shaped toy: a stem and ``blocks`` conv-BatchNorm-ReLU blocks in one Sequential (the
    container checkpoint segments), pooled into a linear head."""
    body = [nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())]
    body += [nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                           nn.ReLU()) for _ in range(blocks)]
    return nn.Sequential(nn.Sequential(*body), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


def probe_strategies(prof: DeviceProfile, device: torch.device, strategies: tuple[str, ...], rounds: int,
                     batch_size: int = 2, side: int = 8, channels: int = 8) -> dict[str, StrategyProbe]:
    """fp32 and each of ``strategies`` on the tiny model (``channels`` wide, ``batch_size`` images of ``side``
    pixels): ``rounds`` steps each, interleaved so that a shared machine's load falls on all alike; the
    fastest step of each (host cost is a floor)."""
    from actbench import strategies as registry
    from actbench.training.step import build_training_step

    torch.manual_seed(0)
    images = torch.randn(batch_size, 3, side, side, device=device)
    targets = torch.randint(0, 10, (batch_size,), device=device)
    steps, probes = {}, {}
    for name in ("fp32", *strategies):
        strategy = registry.get(name)
        step, _ = build_training_step(strategy, tiny_model(channels=channels).to(device), device)
        for _ in range(3):  # warm-up: the controller's first steps, lazily made state
            step.zero_grad()
            step(images, targets)
        recorder = OpRecorder()
        step.zero_grad()
        with OpObserver(recorder):
            step(images, targets)
        calls: dict[str, int] = {}
        for op in recorder.ops:
            if op.kind == STRATEGY_CALL:
                calls[op.name] = calls.get(op.name, 0) + 1
        dispatched = len(recorder.ops) - sum(calls.values())
        copies = [op for op in recorder.ops if op.name in COPY_OPS and op.kind != STRATEGY_CALL]
        if name == "fp32":
            fp32_copies = len(copies)
        elif strategy.copies_from_a_hook and len(copies) > fp32_copies:
            calls[host_copy_kind(name)] = len(copies) - fp32_copies
        # a copy op in memory reads and writes its bytes: half of what it moves is what it wrote
        copied = sum(op.bytes_moved // 2 for op in copies if op.kind == KERNEL)
        steps[name] = (step, dispatched, calls, copied)
    fastest = {name: float("inf") for name in steps}
    for _ in range(rounds):
        for name, (step, *_) in steps.items():
            step.zero_grad()
            prof.synchronize(device)
            start = time.perf_counter()
            step(images, targets)
            prof.synchronize(device)
            fastest[name] = min(fastest[name], time.perf_counter() - start)
    for name, (_, dispatched, calls, copied) in steps.items():
        probes[name] = StrategyProbe(fastest[name], dispatched, calls, copied)
    return probes


def swap_copy_rate(prof: DeviceProfile, device: torch.device, host_op_s: float, rounds: int = 30,
                   side: int = 64, copy_call_s: dict[str, float] | None = None) -> tuple[float, str]:
    """(bytes/s of a host copy as a swap step makes it, a source line), where host and device are one
    memory (a CPU): each saved tensor goes to a new buffer of its own and comes back as another, so a
    copy costs its fresh pages too, which a copy probe reusing its memory does not see (here about a
    third of its rate). Measured as the bytes the tiny model's swap step copies (32 channels, batch 4,
    ``side`` px: megabytes a tensor) over its time beyond fp32's, less ``host_op_s`` per extra op and
    ``copy_call_s`` (strategy-call seconds by kind) per hook call."""
    copy_call_s = copy_call_s or {}
    probes = probe_strategies(prof, device, ("swap",), rounds, batch_size=4, side=side, channels=32)
    base, swap = probes["fp32"], probes["swap"]
    hooks = sum(count * copy_call_s.get(kind, 0.0) for kind, count in swap.calls.items())
    extra = swap.seconds - base.seconds - (swap.dispatched - base.dispatched) * host_op_s - hooks
    copied = swap.copied - base.copied
    rate = copied / extra if extra > 0 and copied > 0 else float("inf")
    line = (f"calibrate: the tiny conv-BN-ReLU model (32 channels, batch 4, {side} px), fastest of {rounds} steps: "
            f"fp32 {base.seconds * 1e3:.2f} ms, swap {swap.seconds * 1e3:.2f} ms copying {copied / 2**20:.1f} MiB more: "
            f"{rate / 1e9:.2f} GB/s (a copy into new memory, as swap's: host and device are one)")
    return rate, line


def strategy_call_seconds(prof: DeviceProfile, device: torch.device, host_op_s: float, rounds: int = 30,
                          strategies: tuple[str, ...] = PROBED_STRATEGIES) -> tuple[dict[str, float], str]:
    """(seconds per strategy call by kind, a source line saying what was measured).

    A kind's value is (strategy step - fp32 step - extra dispatched ops x ``host_op_s``) / calls, at
    least 0; a strategy recording several kinds shares the difference equally among all its calls.
    Kinds not probed take another's (:data:`DERIVED_KINDS`).
    """
    probes = probe_strategies(prof, device, strategies, rounds)
    base = probes["fp32"]
    values: dict[str, float] = {}
    parts = [f"fp32 {base.seconds * 1e3:.2f} ms ({base.dispatched} ops)"]
    for name in strategies:
        probe = probes[name]
        total = sum(probe.calls.values())
        extra = probe.seconds - base.seconds - (probe.dispatched - base.dispatched) * host_op_s
        parts.append(f"{name} {probe.seconds * 1e3:.2f} ms ({probe.dispatched} ops, {total} calls)")
        for kind in probe.calls:
            values.setdefault(kind, max(0.0, extra / total) if total else 0.0)
    values.update({kind: values[like] for kind, like in DERIVED_KINDS.items() if like in values})
    line = ("calibrate: tiny conv-BN-ReLU model, batch 2, 8 px, fastest of "
            f"{rounds} steps: " + ", ".join(parts) + "; per call "
            + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in sorted(values.items()))
            + " (step over fp32's, less host_op_s per extra op, over the calls; L4 and L5 take L3's, "
            "other levels L0's)")
    return values, line
