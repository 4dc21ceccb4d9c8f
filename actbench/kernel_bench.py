"""``actbench bench-kernels``: throughput of quantize+pack and unpack+dequantize.

Rates are GB/s of fp32 input (bytes of the activation being compressed, per second), measured
beside a plain ``x.clone()`` of the same tensor in the same run -- the bandwidth ceiling.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from actbench import ops
from actbench.devices import profile

log = logging.getLogger(__name__)
MIB = 2**20
DEFAULT_SIZES_MIB = (1, 4, 16, 64, 256, 1024)
SAMPLES_PER_BATCH = 64  # the tensor is shaped [64, values / 64], like a batch of activations
# On cuda one timed sample is several back-to-back calls between two synchronisations (the device
# profile's kernel_calls_per_sample), divided by the count: the ops never synchronise, so in training
# the host's launch work overlaps the previous kernel, and a lone call's ~tens of microseconds of
# Python would otherwise swamp a 0.1 ms kernel. The copy baseline is timed the same way. On cpu
# every call is its own sample.

@dataclass(frozen=True)
class KernelBenchConfig:
    device: str = "cpu"
    sizes_mib: tuple[int, ...] = DEFAULT_SIZES_MIB
    bits: tuple[int, ...] = (2,)
    repeats: int = 5
    reference_max_mib: int = 256  # the pure-torch reference needs ~20x the input in temporaries


@dataclass(frozen=True)
class KernelRow:
    device: str
    op: str  # quantize (group min/max + quantize + pack) | dequantize (unpack + dequantize) | copy
    backend: str  # extension | reference | torch (x.clone())
    bits: int | None
    input_bytes: int
    seconds_median: float
    seconds_iqr: float
    input_gb_per_s: float
    copy_gb_per_s: float
    fraction_of_copy: float
    speedup_vs_reference: float | None
    torch_threads: int
    calls_per_sample: int  # calls timed between two synchronisations (the device profile's kernel_calls_per_sample)


def _sync(device: str) -> None:
    profile(device).synchronize(torch.device(device))


def time_call(fn: Callable[[], object], device: str, repeats: int,
              clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median and interquartile range, over ``repeats`` samples after one warm-up call, of seconds per call."""
    calls = profile(device).kernel_calls_per_sample
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = clock()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((clock() - start) / calls)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), q[2] - q[0]


def run(config: KernelBenchConfig, on_row: Callable[[KernelRow], None] | None = None) -> list[KernelRow]:
    """Benchmark every (size, bits); rows come back (and go to ``on_row``) as they are measured."""
    reason = profile(config.device).unavailable()
    if reason is not None:
        raise ValueError(f"bench-kernels: {reason}")
    ops.ensure_loaded()
    rows: list[KernelRow] = []

    def emit(row: KernelRow) -> None:
        rows.append(row)
        if on_row:
            on_row(row)

    for size_mib in config.sizes_mib:
        values = size_mib * MIB // 4
        x = torch.randn(SAMPLES_PER_BATCH, values // SAMPLES_PER_BATCH, device=config.device)
        nbytes = x.numel() * 4
        copy_s, copy_iqr = time_call(lambda: x.clone(), config.device, config.repeats)
        copy_rate = nbytes / copy_s / 1e9
        emit(_row(config, "copy", "torch", None, nbytes, copy_s, copy_iqr, copy_rate, None))
        for bits in config.bits:
            for op_name, backends in _ops(x, bits, size_mib <= config.reference_max_mib):
                measured = {}
                for backend, fn in backends:
                    repeats = config.repeats if backend == "extension" else max(1, min(config.repeats, 3))
                    measured[backend] = time_call(fn, config.device, repeats)
                ref_s = measured.get("reference", (None, None))[0]
                for backend, (sec, iqr) in measured.items():
                    speedup = ref_s / sec if ref_s and backend == "extension" else None
                    emit(_row(config, op_name, backend, bits, nbytes, sec, iqr, copy_rate, speedup))
        del x
    return rows


def _ops(x: torch.Tensor, bits: int, with_reference: bool) -> Iterable[tuple[str, list[tuple[str, Callable]]]]:
    backends = ["extension"] + (["reference"] if with_reference else [])
    packed = {b: ops.quantize(x, bits, backend=b) for b in backends}
    yield "quantize", [(b, lambda b=b: ops.quantize(x, bits, backend=b)) for b in backends]
    yield "dequantize", [(b, lambda b=b: ops.dequantize(packed[b], backend=b)) for b in backends]


def _row(config, op, backend, bits, nbytes, sec, iqr, copy_rate, speedup) -> KernelRow:
    rate = nbytes / sec / 1e9
    return KernelRow(
        device=config.device,
        op=op,
        backend=backend,
        bits=bits,
        input_bytes=nbytes,
        seconds_median=sec,
        seconds_iqr=iqr,
        input_gb_per_s=rate,
        copy_gb_per_s=copy_rate,
        fraction_of_copy=rate / copy_rate,
        speedup_vs_reference=speedup,
        torch_threads=torch.get_num_threads(),
        calls_per_sample=profile(config.device).kernel_calls_per_sample,
    )


def verdicts(rows: list[KernelRow], device: str) -> list[tuple[str, bool]]:
    """The issue's targets, checked at 256 MiB: CPU >= 5x reference and >= 50% of copy; GPU >= 70% of copy."""
    out = []
    for r in rows:
        if r.backend != "extension" or r.input_bytes != 256 * MIB:
            continue
        need, speedup = profile(device).kernel_targets
        out.append((f"{r.op} {r.bits}-bit at 256 MiB: {r.fraction_of_copy:.0%} of copy (target >= {need:.0%})",
                    r.fraction_of_copy >= need))
        if speedup is not None and r.speedup_vs_reference is not None:
            out.append((f"{r.op} {r.bits}-bit at 256 MiB: {r.speedup_vs_reference:.1f}x the reference "
                        f"(target >= {speedup:g}x)", r.speedup_vs_reference >= speedup))
    return out
