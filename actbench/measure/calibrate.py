"""``actbench calibrate``: measure this machine's device and write its :class:`DeviceModel`.

Each probe times one kind of op the step-time model prices (docs/design.md §11): matmuls and
convolutions at a few shapes and dtypes (peak FLOP/s and the fraction of it a step's kernels reach),
copies, elementwise ops and reductions (DRAM bandwidth), a tiny op's cost per call (the host's
dispatch cost; on a device with asynchronous copies also the launch gap of kernels replayed without
the host), and, where the device pins host memory, pinned host<->device copies. Timings are the
median of a few repetitions after a warm-up, each repetition synchronised on the device.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Iterable

import torch

from actbench.core.devices import DeviceProfile, profile
from actbench.measure.host_probes import strategy_call_seconds, swap_copy_rate
from actbench.planning.device_models import CONV_CURVES, DeviceModel

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ProbeSizes:
    """Shapes of the probes: ``QUICK`` ones for tests (a few seconds), ``FULL`` ones under a minute on a
    CPU, ``FULL_GPU`` ones the size of a ResNet-50 step's at batch 64 (smaller ones only time launches)."""

    matmul: tuple[int, ...]
    conv: tuple[tuple[int, int, int], ...]  # (batch, channels, side) of a 3x3 convolution
    stream_elements: tuple[int, ...]  # fp32 vector lengths of the memory probes (a step's tensors range widely)
    repeats: int
    tiny_ops: int
    low_precision_matmul: tuple[int, ...]  # matmul sides timed in bf16 and fp16
    extension_elements: int  # fp32 values of the extension's quantize + dequantize probe
    strategy_rounds: int = 30  # steps of each strategy's tiny model (host_probes.strategy_call_seconds)
    #: (batch, output sides) of the convolutions timed by GEMM rows (batch x side^2), 1x1 and 3x3 alike,
    #: and their channels (in = out); a ResNet's rows run from its input's down to a few per image
    conv_row_batch: int = 4
    conv_row_sides: tuple[int, ...] = (2, 8)
    conv_row_channels: int = 64
    #: the activation the normalisation ops are timed on (:func:`slow_op_rates`)
    norm_shape: tuple[int, ...] = (4, 256, 16, 16)
    #: image side of the swap step whose copies price a CPU's host copies (host_probes.swap_copy_rate)
    swap_side: int = 64
    #: the sides and channels of a CPU's bf16 convolutions by rows, which run far slower than fp32 ones
    low_precision_conv_sides: tuple[int, ...] = (2, 8)
    low_precision_conv_channels: int = 64


QUICK = ProbeSizes(matmul=(128, 256), conv=((2, 32, 16),), stream_elements=(1 << 18,), repeats=3, tiny_ops=200,
                   low_precision_matmul=(128, 256), extension_elements=1 << 18, strategy_rounds=3,
                   conv_row_sides=(2, 8), conv_row_channels=32, swap_side=16, norm_shape=(2, 32, 8, 8))
FULL = ProbeSizes(matmul=(256, 512, 1024), conv=((8, 64, 56), (8, 128, 28), (8, 256, 14), (8, 512, 7)),
                  stream_elements=(1 << 16, 1 << 20, 1 << 24), repeats=5, tiny_ops=2000,
                  low_precision_matmul=(256, 512), extension_elements=1 << 20,
                  conv_row_sides=(2, 4, 8, 16, 32, 64), conv_row_channels=256,
                  low_precision_conv_sides=(2, 4, 8, 16))
FULL_GPU = ProbeSizes(matmul=(2048, 4096, 8192), conv=((64, 64, 56), (64, 128, 28), (64, 256, 14), (64, 512, 7)),
                      stream_elements=(1 << 20, 1 << 24, 1 << 26), repeats=5, tiny_ops=2000,
                      low_precision_matmul=(4096, 8192), extension_elements=1 << 24,
                      conv_row_batch=64, conv_row_sides=(2, 4, 7, 14, 28, 56), conv_row_channels=256,
                      norm_shape=(64, 256, 28, 28))
#: A timed repetition runs its op back to back until it lasts about this long, so that on a device
#: fed asynchronously a probe times the device's work, not one launch and one synchronisation.
MIN_REPETITION_S = 0.005


def full_sizes(prof: DeviceProfile) -> ProbeSizes:
    """The full probes for this kind of device: a device fed asynchronously (a GPU) gets step-sized ones."""
    return FULL_GPU if prof.async_host_copies else FULL


def _seconds(fn: Callable[[], object], prof: DeviceProfile, device: torch.device, repeats: int) -> float:
    """Median synchronised seconds per call of ``fn`` after one warm-up call; each repetition calls it
    back to back for at least :data:`MIN_REPETITION_S`."""
    fn()
    prof.synchronize(device)
    start = time.perf_counter()
    fn()
    prof.synchronize(device)
    calls = max(1, min(1000, math.ceil(MIN_REPETITION_S / max(time.perf_counter() - start, 1e-9))))
    times = []
    for _ in range(repeats):
        prof.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        prof.synchronize(device)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def matmul_rates(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes, dtype: torch.dtype) -> list[float]:
    """FLOP/s of square matmuls of each size in ``sizes.matmul``."""
    rates = []
    for n in sizes.matmul:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        rates.append(2 * n ** 3 / _seconds(lambda: a @ b, prof, device, sizes.repeats))
    return rates


def conv_rates(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes, dtype: torch.dtype) -> list[float]:
    """FLOP/s of 3x3 same-padding convolutions (channels in = out) at each shape in ``sizes.conv``."""
    rates = []
    for batch, channels, side in sizes.conv:
        x = torch.randn(batch, channels, side, side, device=device, dtype=dtype)
        w = torch.randn(channels, channels, 3, 3, device=device, dtype=dtype)
        flops = 2 * batch * channels * channels * 9 * side * side
        rates.append(flops / _seconds(lambda: torch.nn.functional.conv2d(x, w, padding=1), prof, device,
                                      sizes.repeats))
    return rates


def conv_rates_by_rows(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes,
                       dtype: str = "fp32") -> dict[str, tuple[tuple[int, float], ...]]:
    """FLOP/s of ``dtype`` convolutions (channels in = out, stride 1, same padding) by GEMM rows, batch x
    side^2 for each side in ``sizes.conv_row_sides``: 1x1 and 3x3 kernels, forward and backward (the input
    and weight gradients, twice the forward's FLOPs), keyed as ``DeviceModel.conv_rates`` holds them."""
    curves: dict[str, list[tuple[int, float]]] = {f"{dtype}:{curve}": [] for curve in CONV_CURVES}
    channels, batch, kind = sizes.conv_row_channels, sizes.conv_row_batch, _DTYPES[dtype]
    for kernel, curve in ((1, f"{dtype}:pointwise"), (3, f"{dtype}:spatial")):
        for side in sizes.conv_row_sides:
            x = torch.randn(batch, channels, side, side, device=device, dtype=kind, requires_grad=True)
            w = torch.randn(channels, channels, kernel, kernel, device=device, dtype=kind, requires_grad=True)
            y = torch.nn.functional.conv2d(x, w, padding=kernel // 2)
            grad = torch.randn_like(y)
            rows, flops = batch * side * side, 2 * y.numel() * channels * kernel * kernel
            forward = _seconds(lambda: torch.nn.functional.conv2d(x, w, padding=kernel // 2), prof, device,
                               sizes.repeats)
            backward = _seconds(lambda: torch.autograd.grad(y, (x, w), grad, retain_graph=True), prof, device,
                                sizes.repeats)
            curves[curve].append((rows, flops / forward))
            curves[f"{curve}_backward"].append((rows, 2 * flops / backward))
    return {curve: tuple(points) for curve, points in curves.items()}


def slow_op_rates(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> dict[str, float]:
    """Bytes/s of the normalisation ops, forward and backward, timed on their own at a step's shape
    (``sizes.norm_shape``), each op's bytes counted by the step-time model's own recorder so the rate
    prices exactly what it records: on a CPU they run far below a copy's speed."""
    from actbench.measure.tracker import OpObserver
    from actbench.planning.step_time import OpRecorder

    x = torch.randn(sizes.norm_shape, device=device, requires_grad=True)
    batch_norm = torch.nn.BatchNorm2d(sizes.norm_shape[1]).to(device).train()
    layer_norm = torch.nn.LayerNorm(sizes.norm_shape[1:]).to(device)
    rates = {}
    for forward in (lambda: batch_norm(x), lambda: layer_norm(x)):
        y = forward()
        grad = torch.randn_like(y)
        for run in (forward, lambda: torch.autograd.grad(y, x, grad, retain_graph=True)):
            recorder = OpRecorder()
            with OpObserver(recorder):
                run()
            timed = max((op for op in recorder.ops if op.name.startswith("native_")), key=lambda op: op.bytes_moved)
            rates[timed.name] = timed.bytes_moved / _seconds(run, prof, device, sizes.repeats)
    return rates


def conv_backward_ratio(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> float:
    """Median over ``sizes.conv`` of a convolution's backward FLOP/s (input and weight gradients, twice
    the forward's FLOPs) over its forward FLOP/s, fp32."""
    ratios = []
    for batch, channels, side in sizes.conv:
        x = torch.randn(batch, channels, side, side, device=device, requires_grad=True)
        w = torch.randn(channels, channels, 3, 3, device=device, requires_grad=True)
        y = torch.nn.functional.conv2d(x, w, padding=1)
        grad = torch.randn_like(y)
        forward = _seconds(lambda: torch.nn.functional.conv2d(x, w, padding=1), prof, device, sizes.repeats)
        backward = _seconds(lambda: torch.autograd.grad(y, (x, w), grad, retain_graph=True), prof, device,
                            sizes.repeats)
        ratios.append(2 * forward / backward)
    return statistics.median(ratios)


def memory_rates(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> dict[str, float]:
    """Bytes/s read plus written by a copy, an elementwise add and a reduction over fp32 vectors of each
    length in ``sizes.stream_elements`` (``copy@N`` and so on)."""
    rates = {}
    for n in sizes.stream_elements:
        a, b = torch.randn(n, device=device), torch.randn(n, device=device)
        nbytes = a.numel() * a.element_size()
        rates[f"copy@{n}"] = 2 * nbytes / _seconds(a.clone, prof, device, sizes.repeats)
        rates[f"elementwise@{n}"] = 3 * nbytes / _seconds(lambda: a + b, prof, device, sizes.repeats)
        rates[f"reduction@{n}"] = nbytes / _seconds(a.sum, prof, device, sizes.repeats)
    return rates


def host_op_seconds(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> float:
    """Seconds per call of a one-element in-place add issued back to back (dispatch and launch)."""
    x = torch.zeros(1, device=device)

    def many() -> None:
        for _ in range(sizes.tiny_ops):
            x.add_(1)

    return _seconds(many, prof, device, sizes.repeats) / sizes.tiny_ops


def launch_gap_seconds(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> float:
    """Device seconds per tiny kernel with no host in the way: a CUDA graph of them, replayed."""
    x = torch.zeros(1, device=device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        x.add_(1)  # warm-up outside capture, as graph capture requires
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(sizes.tiny_ops):
            x.add_(1)
    return _seconds(graph.replay, prof, device, sizes.repeats) / sizes.tiny_ops


def pinned_copy_rates(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> tuple[float, float]:
    """(host-to-device, device-to-host) bytes/s of copies between pinned host memory and the device."""
    host = torch.empty(max(sizes.stream_elements), pin_memory=True)
    dev = torch.empty(max(sizes.stream_elements), device=device)
    nbytes = host.numel() * host.element_size()
    h2d = nbytes / _seconds(lambda: dev.copy_(host, non_blocking=True), prof, device, sizes.repeats)
    d2h = nbytes / _seconds(lambda: host.copy_(dev, non_blocking=True), prof, device, sizes.repeats)
    return h2d, d2h


def extension_rate(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes) -> float | None:
    """Bytes/s the extension's ops move in a 2-bit quantize and dequantize (each op's inputs and outputs,
    as the step-time model counts them); None when the extension cannot be loaded here."""
    from actbench.kernels import ops
    from actbench.kernels.extension import ExtensionError

    try:
        ops.ensure_loaded()
    except (ExtensionError, OSError, RuntimeError):
        return None
    x = torch.randn(sizes.extension_elements // 4096, 4096, device=device)
    packed = ops.quantize(x, 2)
    # group_minmax and quantize read x, dequantize writes it; quantize writes the packed bytes, dequantize reads them
    moved = 3 * x.numel() * x.element_size() + 2 * packed.nbytes
    seconds = _seconds(lambda: ops.dequantize(ops.quantize(x, 2)), prof, device, sizes.repeats)
    return moved / seconds


def _median_copy(memory: dict[str, float]) -> float:
    """Bytes/s of a copy in memory, as a "host copy" of that many tensor bytes (half the bytes moved)."""
    return statistics.median(v for k, v in memory.items() if k.startswith("copy@")) / 2


def all_conv_rates_by_rows(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes,
                           dtypes: Iterable[str]) -> dict[str, tuple[tuple[int, float], ...]]:
    """:func:`conv_rates_by_rows` in fp32 and each low-precision dtype of ``dtypes``; a CPU without a bf16
    unit runs those a hundred times slower, so it times them over fewer rows and channels."""
    by_rows = conv_rates_by_rows(prof, device, sizes)
    low = sizes if prof.async_host_copies else dataclasses.replace(
        sizes, conv_row_sides=sizes.low_precision_conv_sides, conv_row_channels=sizes.low_precision_conv_channels)
    for dtype in dtypes:
        if dtype not in ("fp32", "tf32"):
            by_rows.update(conv_rates_by_rows(prof, device, low, dtype))
    return by_rows


def _conv_rates_line(prof: DeviceProfile, sizes: ProbeSizes, by_rows: dict[str, tuple[tuple[int, float], ...]]) -> str:
    return (f"calibrate: convolutions by GEMM rows, batch {sizes.conv_row_batch}, {sizes.conv_row_channels} channels "
            "in and out" + ("" if prof.async_host_copies else f" ({sizes.low_precision_conv_channels} for bf16)")
            + ", GFLOP/s: " + "; ".join(
                f"{curve} " + ", ".join(f"{r} {v / 1e9:.1f}" for r, v in points) for curve, points in by_rows.items()))


def host_copy_rates(prof: DeviceProfile, device: torch.device, sizes: ProbeSizes, host_op: float,
                    memory: dict[str, float], calls: dict[str, float]) -> tuple[float, float, str]:
    """(host-to-device, device-to-host bytes/s, a source line): pinned copies where the device pins host
    memory; else (a CPU) a copy as swap's step makes it (less its hook's Python, priced per call in
    ``calls``), or a copy in memory where that measured nothing."""
    if prof.pins_host_memory:
        h2d, d2h = pinned_copy_rates(prof, device, sizes)
        return h2d, d2h, f"calibrate: host-to-device {h2d / 1e9:.2f} GB/s, device-to-host {d2h / 1e9:.2f} GB/s"
    rate, line = swap_copy_rate(prof, device, host_op, rounds=sizes.strategy_rounds, side=sizes.swap_side,
                                copy_call_s=calls)
    if not math.isfinite(rate):
        rate = _median_copy(memory)
        line += f"; nothing measured beyond fp32's: a copy in memory's {rate / 1e9:.2f} GB/s instead"
    return rate, rate, line


def _device_label(prof: DeviceProfile, device: torch.device) -> str:
    if prof.async_host_copies:
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "host CPU"


def calibrate(device_name: str, sizes: ProbeSizes | None = None, name: str | None = None) -> DeviceModel:
    """Measure the device ``device_name`` (cpu, cuda) of this machine and return its model.

    Peaks per dtype are the fastest matmul or convolution measured in it; ``compute_efficiency`` is the
    median fp32 probe over the fp32 peak (the fraction a step's mixed shapes reach), likewise for memory
    and, where fp32 convolutions run on tensor cores as TF32, for those (``tensor_core_efficiency``).
    On a device without asynchronous copies (a CPU) the host and the device are one: the tiny op's cost
    is the host's, launches cost nothing more, and a "copy to the host" is a copy in memory as swap's makes it.
    """
    prof = profile(device_name)
    device = prof.torch_device()
    sizes = sizes or full_sizes(prof)
    tf32_convs = _convolutions_run_as_tf32(prof, device)
    convs = conv_rates(prof, device, sizes, torch.float32)
    rates = {"fp32": matmul_rates(prof, device, sizes, torch.float32) + ([] if tf32_convs else convs)}
    if tf32_convs:
        rates["tf32"] = convs
    low = dataclasses.replace(sizes, matmul=sizes.low_precision_matmul)
    for dtype in ("bf16", "fp16") if prof.async_host_copies else ("bf16",):  # fp16 on a CPU: not a training dtype
        rates[dtype] = matmul_rates(prof, device, low, _DTYPES[dtype])
    backward = conv_backward_ratio(prof, device, sizes)
    by_rows = all_conv_rates_by_rows(prof, device, sizes, rates)
    slow_ops = slow_op_rates(prof, device, sizes)
    extension = extension_rate(prof, device, sizes)
    memory = memory_rates(prof, device, sizes)
    host_op = host_op_seconds(prof, device, sizes)
    calls, calls_source = strategy_call_seconds(prof, device, host_op, rounds=sizes.strategy_rounds)
    launch = launch_gap_seconds(prof, device, sizes) if prof.async_host_copies else 0.0
    h2d, d2h, copies_source = host_copy_rates(prof, device, sizes, host_op, memory, calls)
    peaks = {dtype: max(values) for dtype, values in rates.items()}
    dram = max(memory.values())
    label = _device_label(prof, device)
    sources = {"peaks": "calibrate: fastest of " + "; ".join(
                   f"{d} {', '.join(f'{r / 1e9:.1f}' for r in v)} GFLOP/s" for d, v in rates.items()),
               "dram": "calibrate: " + ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in memory.items()),
               "copies": copies_source,
               "backward": f"calibrate: convolution backward at {backward:.2f} of the forward's FLOP/s",
               "conv_rates": _conv_rates_line(prof, sizes, by_rows),
               "extension": ("calibrate: the extension could not be loaded: its ops priced at DRAM bandwidth"
                             if extension is None else
                             f"calibrate: 2-bit quantize + dequantize of {sizes.extension_elements * 4 >> 20} MiB move "
                             f"{extension / 1e9:.2f} GB/s"),
               "op_bytes": f"calibrate: timed on their own at {list(sizes.norm_shape)}, GB/s as the step-time "
                           f"model counts their bytes: {', '.join(f'{k} {v / 1e9:.2f}' for k, v in slow_ops.items())}",
               "host_op": f"calibrate: {host_op * 1e6:.2f} us per one-element add_",
               "strategy_calls": calls_source,
               "launch": (f"calibrate: {launch * 1e6:.2f} us per kernel of a replayed CUDA graph"
                          if prof.async_host_copies else "calibrate: no separate device (the host op cost covers it)"),
               "machine": f"{platform.node()} {label}, torch {torch.__version__}, {torch.get_num_threads()} threads"}
    return DeviceModel(
        name=name or f"calibrated-{device_name}", label=label, peak_flops=MappingProxyType(peaks),
        dram_bytes_per_s=dram, h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h, launch_s=launch, host_op_s=host_op,
        compute_efficiency=statistics.median(rates["fp32"]) / peaks["fp32"],
        memory_efficiency=statistics.median(memory.values()) / dram, backward_efficiency=backward,
        extension_bytes_per_s=extension,
        host_overlaps_device=prof.async_host_copies, async_copies=prof.async_host_copies,
        tensor_core_efficiency=statistics.median(rates["tf32"]) / peaks["tf32"] if tf32_convs else None,
        conv_fp32_as_tf32=tf32_convs, calibrated=True, sources=MappingProxyType(sources),
        strategy_call_s=MappingProxyType(calls), conv_rates=MappingProxyType(by_rows),
        op_bytes_per_s=MappingProxyType(slow_ops))


def _convolutions_run_as_tf32(prof: DeviceProfile, device: torch.device) -> bool:
    """Whether this device's fp32 convolutions run on tensor cores as TF32: cuDNN's default
    (``torch.backends.cudnn.allow_tf32``) on a GPU of compute capability 8 (Ampere) or later."""
    if not prof.async_host_copies:
        return False
    return bool(torch.backends.cudnn.allow_tf32) and torch.cuda.get_device_capability(device)[0] >= 8
