"""``actbench bench-kernels``: throughput of every op of the extension.

Rates are GB/s of fp32 activation (bytes of the activation an op compresses, restores, masks or
pools, per second), measured beside a plain ``x.clone()`` of the same tensor -- the bandwidth
ceiling -- and beside torch's own op where one exists (``threshold_backward`` for the
mask applied to a gradient, ``x > 0`` -- the bool mask torch would keep -- for taking and for
unpacking a mask, ``max_pool2d_with_indices`` and its backward for the pool). The copy, the op and
torch's op are timed in turn, one sample each per round (:func:`time_calls`), so a machine whose
bandwidth drifts within a run moves all three alike, not one of them.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from actbench.kernels import ops
from actbench.core.devices import profile

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
    oracle_max_mib: int = 256  # the pure-torch oracle needs ~20x the input in temporaries


@dataclass(frozen=True)
class KernelRow:
    device: str
    op: str  # one of OPS_BENCHED, or copy
    backend: str  # extension | oracle | torch (torch's own op, or x.clone() for copy)
    bits: int | None
    input_bytes: int
    seconds_median: float
    seconds_iqr: float
    input_gb_per_s: float
    copy_gb_per_s: float  # x.clone() timed in turn with this op (for the copy row: its own rate)
    fraction_of_copy: float
    speedup_vs_oracle: float | None
    speedup_vs_torch: float | None  # torch's equivalent op's seconds / the extension's
    torch_threads: int
    calls_per_sample: int  # calls timed between two synchronisations (the device profile's kernel_calls_per_sample)


def _sync(device: str) -> None:
    profile(device).synchronize(torch.device(device))


def time_call(fn: Callable[[], object], device: str, repeats: int,
              clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median and interquartile range, over ``repeats`` samples after one warm-up call, of seconds per call."""
    return time_calls({"": fn}, device, repeats, clock)[""]


def time_calls(fns: dict[str, Callable[[], object]], device: str, repeats: int,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, tuple[float, float]]:
    """:func:`time_call` for several functions at once, their samples taken in turn.

    Each round takes one sample of every function, starting one further along each time, so none
    always follows the same one. Timed back to back instead, a copy measured before an op could run
    15 % faster or slower than the machine then ran the op (bench-kernels on a shared 2-core cpu),
    and the op's share of the copy moved by as much.
    """
    samples = samples_in_turn(fns, device, repeats, profile(device).kernel_calls_per_sample, 1, clock)
    return {name: _median_and_iqr(times) for name, times in samples.items()}


def samples_in_turn(fns: dict[str, Callable[[], object]], device: str, rounds: int, calls: int = 1,
                    warmup: int = 1, clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each function, one sample of each per round (``calls`` calls between two
    synchronisations), after ``warmup`` calls of each; round r starts at function r (mod their
    number). Sample r of every function was taken in the same round, so their ratios pair up."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            _sync(device)
            start = clock()
            for _ in range(calls):
                fns[name]()
            _sync(device)
            times[name].append((clock() - start) / calls)
    return times


def _median_and_iqr(times: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), q[2] - q[0]


#: Ops timed per size: (name, whether it is timed per bit width).
OPS_BENCHED = (
    ("quantize", True), ("dequantize", True), ("quantize_mixed", True), ("dequantize_mixed", True),
    ("group_minmax", False), ("pack_mask", False), ("unpack_mask", False), ("apply_mask", False),
    ("max_pool2d_with_argmax", False), ("max_pool2d_backward", False),
)
#: Bytes alive per byte of fp32 input while one size runs (input, its ReLU, a gradient, outputs
#: and clone), and what the pure-torch oracle adds in temporaries where it runs.
LIVE_PER_INPUT_BYTE = 6
ORACLE_PER_INPUT_BYTE = 20


def check_sizes_fit(config: KernelBenchConfig, limit: int | None = None) -> None:
    """Refuse, before anything runs or is written, a size whose tensors cannot fit in memory."""
    limit = profile(config.device).available_memory_bytes() if limit is None else limit
    for size in config.sizes_mib:
        need = size * MIB * (LIVE_PER_INPUT_BYTE + (ORACLE_PER_INPUT_BYTE if size <= config.oracle_max_mib else 0))
        if need > limit:
            raise ValueError(f"bench-kernels: --sizes-mib {size} needs about {need / 2**30:.1f} GiB, more than the "
                             f"{limit / 2**30:.1f} GiB of {config.device} memory available")


def run(config: KernelBenchConfig, on_row: Callable[[KernelRow], None] | None = None) -> list[KernelRow]:
    """Benchmark every op at every size (and bit width); rows come back (and go to ``on_row``) as measured."""
    reason = profile(config.device).unavailable()
    if reason is not None:
        raise ValueError(f"bench-kernels: {reason}")
    check_sizes_fit(config)
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
        emit(_row(config, "copy", "torch", None, nbytes, copy_s, copy_iqr, copy_rate, None, None))
        cases = [(name, bits) for name, per_bits in OPS_BENCHED for bits in (config.bits if per_bits else (None,))]
        for name, bits in cases:
            backends = _backends(name, x, bits, size_mib <= config.oracle_max_mib)
            # the copy again, in turn with this op and torch's: on a shared machine the bandwidth
            # left over drifts within a run, and an op is judged against the copy measured beside it
            in_turn = {"copy": lambda: x.clone(), **{b: fn for b, fn in backends if b != "oracle"}}
            timed = time_calls(in_turn, config.device, config.repeats)
            copy_rate = nbytes / timed.pop("copy")[0] / 1e9
            measured = {}
            for backend, fn in backends:  # the oracle, many times slower, alone and at most 3 times
                measured[backend] = timed[backend] if backend in timed else time_call(
                    fn, config.device, max(1, min(config.repeats, 3)))
            ref_s = measured.get("oracle", (None, None))[0]
            torch_s = measured.get("torch", (None, None))[0]
            for backend, (sec, iqr) in measured.items():
                ext = backend == "extension"
                emit(_row(config, name, backend, bits, nbytes, sec, iqr, copy_rate,
                          ref_s / sec if ref_s and ext else None, torch_s / sec if torch_s and ext else None))
        del x
    return rows


POOL = ((3, 3), (2, 2), (1, 1), (1, 1))  # ResNet's stem: kernel, stride, padding, dilation


def _backends(name: str, x: torch.Tensor, bits: int | None, with_oracle: bool) -> list[tuple[str, Callable]]:
    """(backend, call) pairs timing op ``name`` on the activation x [64, F]."""
    refs = ["extension"] + (["oracle"] if with_oracle else [])
    if name in ("quantize", "dequantize"):
        packed = {b: ops.quantize(x, bits, backend=b) for b in refs}
        if name == "quantize":
            return [(b, lambda b=b: ops.quantize(x, bits, backend=b)) for b in refs]
        return [(b, lambda b=b: ops.dequantize(packed[b], backend=b)) for b in refs]
    if name in ("quantize_mixed", "dequantize_mixed"):
        per_sample = torch.full((x.shape[0],), bits, dtype=torch.int32, device=x.device)
        minmax, total = ops.group_minmax(x), bits * x.shape[0]
        packed = ops.quantize(x, per_sample, total_bits=total, minmax=minmax)
        if name == "quantize_mixed":
            return [("extension", lambda: ops.quantize(x, per_sample, total_bits=total, minmax=minmax))]
        return [("extension", lambda: ops.dequantize(packed))]
    if name == "group_minmax":
        return [(b, lambda b=b: ops.group_minmax(x, backend=b)) for b in refs]
    return _mask_and_pool_backends(name, x)


def _mask_and_pool_backends(name: str, x: torch.Tensor) -> list[tuple[str, Callable]]:
    y = torch.relu(x)
    if name == "pack_mask":
        return [("extension", lambda: ops.pack_mask(y)), ("torch", lambda: y > 0)]
    packed = ops.pack_mask(y)
    if name == "unpack_mask":
        return [("extension", lambda: ops.unpack_mask(packed, y.shape)), ("torch", lambda: y > 0)]
    if name == "apply_mask":
        return [("extension", lambda: ops.apply_mask(x, packed)),
                ("torch", lambda: torch.ops.aten.threshold_backward(x, y, 0))]
    img = x.view(x.shape[0], -1, 64, 64)  # F = size_mib * 4096 values: planes of 64 x 64
    k, s, p, d = POOL
    out, arg = ops.max_pool2d_with_argmax(img, k, s, p, d)
    if name == "max_pool2d_with_argmax":
        return [("extension", lambda: ops.max_pool2d_with_argmax(img, k, s, p, d)),
                ("torch", lambda: torch.ops.aten.max_pool2d_with_indices(img, k, s, p, d, False))]
    grad = torch.randn_like(out)
    _, idx = torch.ops.aten.max_pool2d_with_indices(img, k, s, p, d, False)
    return [("extension", lambda: ops.max_pool2d_backward(grad, arg, img.shape, k, s, p, d)),
            ("torch", lambda: torch.ops.aten.max_pool2d_with_indices_backward(grad, img, k, s, p, d, False, idx))]


def _row(config, op, backend, bits, nbytes, sec, iqr, copy_rate, speedup, vs_torch) -> KernelRow:
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
        speedup_vs_oracle=speedup,
        speedup_vs_torch=vs_torch,
        torch_threads=torch.get_num_threads(),
        calls_per_sample=profile(config.device).kernel_calls_per_sample,
    )


def verdicts(rows: list[KernelRow], device: str) -> list[tuple[str, bool]]:
    """Targets at 256 MiB: the device's fraction of copy (and speed-up over the oracle), and no
    slower than torch's own op where there is one."""
    out = []
    need, speedup = profile(device).kernel_targets
    for r in rows:
        if r.backend != "extension" or r.input_bytes != 256 * MIB:
            continue
        label = f"{r.op}{f' {r.bits}-bit' if r.bits else ''} at 256 MiB"
        out.append((f"{label}: {r.fraction_of_copy:.0%} of copy (target >= {need:.0%})", r.fraction_of_copy >= need))
        if speedup is not None and r.speedup_vs_oracle is not None:
            out.append((f"{label}: {r.speedup_vs_oracle:.1f}x the oracle (target >= {speedup:g}x)",
                        r.speedup_vs_oracle >= speedup))
        if r.speedup_vs_torch is not None:
            out.append((f"{label}: {r.speedup_vs_torch:.2f}x torch's op (target >= 1x)", r.speedup_vs_torch >= 1.0))
    return out
