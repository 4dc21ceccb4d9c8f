"""Device speed models: what a step's ops cost on a device, from datasheets or from ``actbench calibrate``.

A :class:`DeviceModel` holds the numbers the step-time model (:mod:`actbench.planning.step_time`) needs:
peak FLOP/s per dtype, DRAM bandwidth, host<->device copy bandwidth, the per-kernel launch cost and
the host's own cost per op, and the fractions of those peaks a training step's kernels reach. The
built-in GPU models come from vendor datasheets (each value with its source, docs/design.md §11); a
calibrated model is a JSON file written by ``actbench calibrate``. No torch here: reports and the CLI
name a model without loading it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from actbench.schema import MAX_COLUMN_VALUE, MAX_NAME_CHARS

#: The environment variable naming a device-model file (``--device-model FILE``), read where points are
#: measured, as child processes inherit it.
DEVICE_MODEL_ENV = "ACTBENCH_DEVICE_MODEL"
#: Version of the device-model file's layout; a file of another version is refused.
MODEL_FILE_VERSION = 1
#: dtypes a peak is given for: fp32 (CUDA cores), tf32/bf16/fp16 (tensor cores, dense)
PEAK_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")
#: Convolution rate curves of a calibrated model (``DeviceModel.conv_rates``): 1x1 kernels and larger ones,
#: forward and backward (input and weight gradients together)
CONV_CURVES: tuple[str, ...] = ("pointwise", "spatial", "pointwise_backward", "spatial_backward")
TERA = 1e12
GB = 1e9


@dataclass(frozen=True)
class DeviceModel:
    """Speed of one device as the step-time model sees it (SI units: FLOP/s, bytes/s, seconds).

    ``peak_flops`` maps a dtype of :data:`PEAK_DTYPES` to its dense peak (a dtype without tensor-core
    support is absent: its ops run at the fp32 peak). ``compute_efficiency`` and ``memory_efficiency``
    are the fractions of peak FLOP/s and DRAM bandwidth a training step's kernels reach.
    ``host_overlaps_device``: the host enqueues kernels ahead of the device (a GPU), so the step takes
    the larger of host and device time; False (a CPU) adds them. ``async_copies``: L4/L5's side-stream
    copies overlap compute on this device.
    """

    name: str
    label: str
    peak_flops: Mapping[str, float]
    dram_bytes_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    launch_s: float
    host_op_s: float
    compute_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    #: fraction of a tensor-core peak (tf32, bf16, fp16) a step's kernels reach; None: ``compute_efficiency``
    tensor_core_efficiency: float | None = None
    #: bytes/s the extension's own ops (``actbench::``, ActNN's quantize and pack) move, which cost more
    #: per byte than a copy; None: DRAM bandwidth, as any memory-bound kernel
    extension_bytes_per_s: float | None = None
    #: FLOP/s of backward kernels (a convolution's input and weight gradients) over forward ones at the
    #: same shapes; 1.0 in the datasheet models (assumed), measured by ``calibrate``
    backward_efficiency: float = 1.0
    pcie_generation: int | None = None
    host_overlaps_device: bool = True
    async_copies: bool = True
    #: fp32 convolutions run on tensor cores as TF32 (PyTorch's default cudnn.allow_tf32 on Ampere and later)
    conv_fp32_as_tf32: bool = False
    calibrated: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)
    #: host seconds of one call of a strategy's own Python, by kind: ``actnn_layer:L3`` (one ActNN
    #: layer's forward and backward at that level; ``actnn_layer`` for a level without its own),
    #: ``checkpoint_module``, ``selective_module`` (per module a checkpoint or sac segment holds, as its
    #: Python runs again in recompute); over and above ``host_op_s`` for the ATen ops
    #: those calls dispatch. Absent (a file older than this field): 0, as ``sources`` then says.
    strategy_call_s: Mapping[str, float] = field(default_factory=dict)
    #: FLOP/s of convolutions measured by GEMM rows (a batch's output positions, N x H x W), as (rows,
    #: FLOP/s) pairs by rows, keyed ``DTYPE:CURVE`` (the tensors' dtype, fp32 also where it runs as TF32;
    #: a curve of :data:`CONV_CURVES`): how fast a convolution runs depends on its rows far more than a
    #: median efficiency says (on a CPU a 1x1 convolution over 16 rows runs at a fifteenth of the rate it
    #: reaches over 1,024). A convolution without its curve (datasheet models, files written before it):
    #: peak x efficiency.
    conv_rates: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    #: bytes/s of ops timed on their own, by ATen op name (bytes as the step-time model counts them), for
    #: the memory-bound ops that run far below a copy's speed: a CPU's batch norm moves its bytes at a
    #: tenth of an add's. An op without a value: DRAM bandwidth x memory efficiency.
    op_bytes_per_s: Mapping[str, float] = field(default_factory=dict)

    def conv_rate(self, dtype: str, curve: str, rows: int) -> float | None:
        """FLOP/s of a ``dtype`` convolution of ``curve`` over ``rows`` GEMM rows: interpolated between the
        measured rows on log-log scales, the nearest measured value outside them; None without that curve."""
        points = self.conv_rates.get(f"{dtype}:{curve}")
        if not points or rows <= 0:
            return None
        if rows <= points[0][0]:
            return points[0][1]
        for (r0, v0), (r1, v1) in zip(points, points[1:]):
            if rows <= r1:
                share = math.log(rows / r0) / math.log(r1 / r0)
                return math.exp(math.log(v0) + share * (math.log(v1) - math.log(v0)))
        return points[-1][1]

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (fp32's where the device has no faster unit for it)."""
        return self.peak_flops.get(dtype) or self.peak_flops["fp32"]

    def efficiency_for(self, dtype: str) -> float:
        """The fraction of :meth:`peak_for` a step's kernels reach in ``dtype``."""
        on_tensor_cores = dtype != "fp32" and dtype in self.peak_flops
        if on_tensor_cores and self.tensor_core_efficiency is not None:
            return self.tensor_core_efficiency
        return self.compute_efficiency

    def strategy_call_seconds(self, kind: str) -> float:
        """Host seconds of one :attr:`strategy_call_s` call of ``kind`` (``actnn_layer:L4`` falls back
        to ``actnn_layer``); 0 for a kind the model has no value for."""
        if kind in self.strategy_call_s:
            return self.strategy_call_s[kind]
        return self.strategy_call_s.get(kind.split(":", 1)[0], 0.0)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["peak_flops"], data["sources"] = dict(self.peak_flops), dict(self.sources)
        data["strategy_call_s"] = dict(self.strategy_call_s)
        data["conv_rates"] = {k: [list(p) for p in v] for k, v in self.conv_rates.items()}
        data["op_bytes_per_s"] = dict(self.op_bytes_per_s)
        return {"version": MODEL_FILE_VERSION, **data}

    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the model's JSON: a run folder's name changes with the model its
        rows are priced on, so a resume never keeps another model's predictions."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "device model") -> "DeviceModel":
        """The model ``data`` describes; ValueError naming the field, its value and what is allowed (a
        wrong version, a missing field, a number of the wrong type or outside its bounds, a bad name)."""
        version = data.get("version")
        if not (_real(version) and version == MODEL_FILE_VERSION):
            raise ValueError(f"{origin}: version must be {MODEL_FILE_VERSION} (the layout this actbench reads), "
                             f"got {_shown(version)}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        missing = [n for n in ("name", "label", "peak_flops", "dram_bytes_per_s", "h2d_bytes_per_s",
                               "d2h_bytes_per_s", "launch_s", "host_op_s") if n not in values]
        if missing:
            raise ValueError(f"{origin}: missing field(s) {', '.join(missing)}")
        check_model_text(values["name"], "name", origin)
        check_model_text(values["label"], "label", origin)
        _check_scalars(values, origin)
        values["peak_flops"] = _peaks(values["peak_flops"], origin)
        sources = values.get("sources") or {}
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            raise ValueError(f"{origin}: sources must map names to strings, got {type(sources).__name__}")
        values["sources"] = MappingProxyType(dict(sources))
        values["strategy_call_s"], values["sources"] = _strategy_calls(values, origin)
        values["conv_rates"] = _conv_rates(values.get("conv_rates", {}), origin)
        values["op_bytes_per_s"] = _op_rates(values.get("op_bytes_per_s", {}), origin)
        return cls(**values)


#: Bounds of a model file's numbers, wide beyond any device yet narrow enough that a step's predicted time
#: (a sum over its ops of bytes or FLOPs over a rate, plus times per op) always comes out finite:
#: seconds per op or call (0: a CPU has no launch gap; an hour at most), rates in FLOP/s or bytes/s (at
#: least 1 per second, at most 1e21, a million times an H200's peak), and fractions of a peak.
SECONDS_BOUNDS: tuple[float, float] = (0.0, 3600.0)
RATE_BOUNDS: tuple[float, float] = (1.0, 1e21)
FRACTION_BOUNDS: tuple[float, float] = (1e-6, 1e3)
#: PCIe generations a model may name (null: not a PCIe device, as a CPU).
PCIE_GENERATIONS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
_SECONDS, _BYTES, _SHARE = "a number of seconds", "a number of bytes/s", "a number (a share of peak)"
#: A model file's scalar numbers: (bounds, what they are, null allowed).
_NUMBERS: Mapping[str, tuple[tuple[float, float], str, bool]] = MappingProxyType({
    "dram_bytes_per_s": (RATE_BOUNDS, _BYTES, False), "h2d_bytes_per_s": (RATE_BOUNDS, _BYTES, False),
    "d2h_bytes_per_s": (RATE_BOUNDS, _BYTES, False), "launch_s": (SECONDS_BOUNDS, _SECONDS, False),
    "host_op_s": (SECONDS_BOUNDS, _SECONDS, False), "compute_efficiency": (FRACTION_BOUNDS, _SHARE, False),
    "memory_efficiency": (FRACTION_BOUNDS, _SHARE, False), "backward_efficiency": (FRACTION_BOUNDS, _SHARE, False),
    "tensor_core_efficiency": (FRACTION_BOUNDS, _SHARE, True), "extension_bytes_per_s": (RATE_BOUNDS, _BYTES, True)})
_FLAGS = ("host_overlaps_device", "async_copies", "conv_fp32_as_tf32", "calibrated")


def _shown(value: Any) -> str:
    """``value`` as the JSON file spells it (Infinity, true, null), on one line and cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


def _number(value: Any, name: str, origin: str, bounds: tuple[float, float], what: str,
            nullable: bool = False) -> Any:
    """``value`` when it is a JSON number within ``bounds`` (so finite; ``true`` is no number), or null
    where ``nullable``; ValueError naming ``name``, the value and the bounds otherwise."""
    low, high = bounds
    if (nullable and value is None) or (_real(value) and low <= value <= high):  # NaN, infinities: False
        return value
    raise ValueError(f"{origin}: {name} must be {what} in {low:g}..{high:g}{' or null' if nullable else ''}, "
                     f"got {_shown(value)}")


def _check_scalars(values: Mapping[str, Any], origin: str) -> None:
    """ValueError naming the first scalar field of a model file of the wrong type or out of bounds."""
    for name, (bounds, what, nullable) in _NUMBERS.items():
        if name in values:
            _number(values[name], name, origin, bounds, what, nullable)
    for name in _FLAGS:
        if name in values and not isinstance(values[name], bool):
            raise ValueError(f"{origin}: {name} must be true or false, got {_shown(values[name])}")
    generation = values.get("pcie_generation")
    if generation is not None and not (_real(generation) and isinstance(generation, int)
                                       and generation in PCIE_GENERATIONS):
        raise ValueError(f"{origin}: pcie_generation must be one of {', '.join(map(str, PCIE_GENERATIONS))} or "
                         f"null, got {_shown(generation)}")


def check_model_text(text: Any, field_name: str, origin: str) -> str:
    """``text`` when it can stand as a model's name or label in rows, tables and figures: a non-empty
    string of at most :data:`MAX_NAME_CHARS` printable characters (no new line, tab or escape); ValueError."""
    if isinstance(text, str) and text.strip() and text.isprintable() and len(text) <= MAX_NAME_CHARS:
        return text
    raise ValueError(f"{origin}: {field_name} must be a non-empty string of at most {MAX_NAME_CHARS} printable "
                     f"characters (no new line, tab or other control character), got {_shown(text)}")


def _peaks(peaks: Any, origin: str) -> Mapping[str, float]:
    """A model file's ``peak_flops``: dtypes of :data:`PEAK_DTYPES` (fp32 required) mapped to FLOP/s."""
    if not isinstance(peaks, dict) or "fp32" not in peaks or set(peaks) - set(PEAK_DTYPES):
        raise ValueError(f"{origin}: peak_flops must map {', '.join(PEAK_DTYPES)} (fp32 required) to FLOP/s, "
                         f"got {_shown(peaks)}")
    for dtype, value in peaks.items():
        _number(value, f"peak_flops.{dtype}", origin, RATE_BOUNDS, "a number of FLOP/s")
    return MappingProxyType(dict(peaks))


#: What a model without ``strategy_call_s`` (a file written before it existed) says about it.
NO_STRATEGY_CALLS = ("not in this file (written before calibrate measured it): a strategy's own Python "
                     "(ActNN's layers, checkpoint's segments) costs nothing in this model's predictions")


def _strategy_calls(values: Mapping[str, Any], origin: str) -> tuple[Mapping[str, float], Mapping[str, str]]:
    """(``strategy_call_s``, ``sources``) of a model file: a mapping of names to seconds; absent,
    an empty one, and ``sources`` says so (:data:`NO_STRATEGY_CALLS`)."""
    sources = values["sources"]
    if "strategy_call_s" not in values:
        return MappingProxyType({}), MappingProxyType({**sources, "strategy_calls": NO_STRATEGY_CALLS})
    calls = values["strategy_call_s"]
    if not isinstance(calls, dict):
        raise ValueError(f"{origin}: strategy_call_s must map names to seconds in {SECONDS_BOUNDS[0]:g}.."
                         f"{SECONDS_BOUNDS[1]:g}, got {_shown(calls)}")
    for kind, seconds in calls.items():
        _number(seconds, f"strategy_call_s.{kind}", origin, SECONDS_BOUNDS, _SECONDS)
    return MappingProxyType(dict(calls)), sources


def _real(value: Any) -> bool:
    """A JSON number (``true`` is an int to Python, not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _op_rates(data: Any, origin: str) -> Mapping[str, float]:
    """A model file's ``op_bytes_per_s``: op names mapped to bytes/s; ValueError naming the op otherwise."""
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: op_bytes_per_s must map op names to bytes/s, got {_shown(data)}")
    for op, rate in data.items():
        _number(rate, f"op_bytes_per_s.{op}", origin, RATE_BOUNDS, _BYTES)
    return MappingProxyType(dict(data))


def _conv_rates(data: Any, origin: str) -> Mapping[str, tuple[tuple[int, float], ...]]:
    """A model file's ``conv_rates``: ``DTYPE:CURVE`` keys mapped to [rows, FLOP/s] pairs, rows
    whole and rising, rates within :data:`RATE_BOUNDS`; ValueError naming the field otherwise."""
    def pair(p: Any) -> bool:
        return isinstance(p, list) and len(p) == 2 and _real(p[0]) and isinstance(p[0], int) \
            and 0 < p[0] <= MAX_COLUMN_VALUE and _real(p[1]) and RATE_BOUNDS[0] <= p[1] <= RATE_BOUNDS[1]

    keys = {f"{dtype}:{curve}" for dtype in PEAK_DTYPES for curve in CONV_CURVES}
    if not isinstance(data, dict) or set(data) - keys:
        raise ValueError(f"{origin}: conv_rates must map DTYPE:CURVE (a dtype of {', '.join(PEAK_DTYPES)}, a curve "
                         f"of {', '.join(CONV_CURVES)}) to [rows, FLOP/s] pairs, got {_shown(data)}")
    curves = {}
    for curve, points in data.items():
        if not isinstance(points, list) or not points or not all(pair(p) for p in points) or any(
                a[0] >= b[0] for a, b in zip(points, points[1:])):
            raise ValueError(f"{origin}: conv_rates.{curve} must be [rows, FLOP/s] pairs with rising whole rows "
                             f"and rates in {RATE_BOUNDS[0]:g}..{RATE_BOUNDS[1]:g}, got {_shown(points)}")
        curves[curve] = tuple((int(r), float(v)) for r, v in points)
    return MappingProxyType(curves)


def save_device_model(model: DeviceModel, path: Path) -> None:
    """Write ``model`` as JSON, atomically (a failed write leaves any earlier file whole); a model its
    own file could not load back (a measured value out of bounds) is a ValueError, and nothing is written."""
    from actbench.store.outputs import atomic_write_text

    DeviceModel.from_dict(model.to_dict(), origin=f"device model {model.name!r}")
    atomic_write_text(Path(path), json.dumps(model.to_dict(), indent=2, sort_keys=True) + "\n")


def load_device_model(path: Path | str) -> DeviceModel:
    """The model in the JSON file at ``path``; ValueError naming the file and what is wrong.

    Read as run files are (``reading.read_json_file``): a regular file only, within limits on size,
    nesting and digits, so a FIFO, a device or a hostile file is one line, never a hang or a traceback.
    """
    from actbench.store.reading import RunFileError, read_json_file

    path = Path(path)
    try:
        data = read_json_file(path)
    except RunFileError as exc:
        raise ValueError(f"device model {exc}") from None
    if data is None:
        raise ValueError(f"device model '{path}': no such file; expected a JSON file from `actbench calibrate`")
    if not isinstance(data, dict):
        raise ValueError(f"device model {path}: expected a JSON object, got {type(data).__name__}")
    return DeviceModel.from_dict(data, origin=f"device model {path}")


# --- built-in GPU models (datasheet values; docs/design.md §11) ---------------------------------------
#: Effective pinned host<->device bandwidth per PCIe generation (x16): about 3/4 of the link's raw
#: rate (Gen3 15.75, Gen4 31.5, Gen5 63 GB/s), what pinned cudaMemcpyAsync reaches in bandwidthTest.
PCIE_EFFECTIVE_BYTES_PER_S: Mapping[int, float] = MappingProxyType({3: 12 * GB, 4: 24 * GB, 5: 48 * GB})
#: Kernel launch cost on the device timeline (gap between back-to-back kernels), assumed until calibrated.
GPU_LAUNCH_S = 4e-6
#: Host (Python and ATen dispatch) cost per op of eager PyTorch on a server CPU, assumed until calibrated.
GPU_HOST_OP_S = 10e-6
#: Fractions of peak a ConvNet training step's kernels reach on a GPU (cuDNN convolutions, elementwise
#: and normalisation kernels); assumed until ``calibrate --device cuda`` measures them.
GPU_COMPUTE_EFFICIENCY = 0.6
GPU_MEMORY_EFFICIENCY = 0.8
#: Tensor-core kernels reach a smaller share of their far higher peak: a quarter, set from NVIDIA
#: DeepLearningExamples' ResNet-50 v1.5 on V100 with AMP (1200 img/s x 24.6 GFLOP per image ~ 24% of
#: 125 TFLOPS); the TF32 and bf16 predictions on A100 are checks outside that setting (docs/design.md §11).
GPU_TENSOR_CORE_EFFICIENCY = 0.25

#: Host seconds per call of a strategy's own Python (``DeviceModel.strategy_call_s``), fitted from the H200
#: loan (results/gpu/h200_2026-12-04/second/datasheet/speed_vs_cuda.csv: ResNet-50, batch 64, 224 px, measured
#: on code before the twins stopped rerouting every torch call): measured step less this model's
#: 10 us x dispatched ops, over the calls meta records (157 ActNN layers; 140 modules in 16 checkpoint
#: segments). L5 runs L4's step; other levels take L0's, the cheapest measured (a floor); sac's modules
#: take checkpoint's (not measured on a GPU). A host's cost, so every built-in GPU takes the same.
GPU_STRATEGY_CALL_S: Mapping[str, float] = MappingProxyType({
    "actnn_layer:L0": 248e-6, "actnn_layer:L3": 842e-6, "actnn_layer:L4": 984e-6, "actnn_layer:L5": 984e-6,
    "actnn_layer": 248e-6, "checkpoint_module": 295e-6, "selective_module": 295e-6})
_STRATEGY_CALLS_SOURCE = ("fitted from the H200 loan's trust rows (results/gpu/h200_2026-12-04/second/datasheet/"
                          "speed_vs_cuda.csv, ResNet-50 b64 224 px): per ActNN layer L0 248 us, L3 842 us, L4 (and L5) "
                          "984 us, other levels L0's; per module of a checkpoint segment 295 us (sac's the same, assumed)")

_ASSUMED = ("launch: assumed 4 us between kernels; host_op: assumed 10 us of eager dispatch per op; efficiencies: "
            "assumed 0.6 of peak FLOP/s and 0.8 of DRAM bandwidth (calibrate --device cuda measures them); "
            "tensor cores 0.25 of their peak (from DeepLearningExamples' ResNet-50 V100 AMP: 1200 img/s)")


def _gpu(name: str, label: str, tflops: Mapping[str, float], dram_gb_s: float, pcie: int, sheet: str,
         tf32_convs: bool) -> DeviceModel:
    bandwidth = PCIE_EFFECTIVE_BYTES_PER_S[pcie]
    peaks = ", ".join(f"{d} {v:g}" for d, v in tflops.items())
    return DeviceModel(
        name=name, label=label, peak_flops=MappingProxyType({d: v * TERA for d, v in tflops.items()}),
        dram_bytes_per_s=dram_gb_s * GB, h2d_bytes_per_s=bandwidth, d2h_bytes_per_s=bandwidth,
        launch_s=GPU_LAUNCH_S, host_op_s=GPU_HOST_OP_S, compute_efficiency=GPU_COMPUTE_EFFICIENCY,
        memory_efficiency=GPU_MEMORY_EFFICIENCY, tensor_core_efficiency=GPU_TENSOR_CORE_EFFICIENCY,
        pcie_generation=pcie, conv_fp32_as_tf32=tf32_convs, strategy_call_s=GPU_STRATEGY_CALL_S,
        sources=MappingProxyType({
            "peaks": f"{sheet}: dense TFLOPS {peaks} (no sparsity)", "dram": f"{sheet}: {dram_gb_s:g} GB/s",
            "pcie": f"{sheet}: PCIe Gen{pcie} x16; effective pinned {bandwidth / GB:g} GB/s each way "
                    "(3/4 of the raw link rate)",
            "assumed": _ASSUMED, "strategy_calls": _STRATEGY_CALLS_SOURCE}))


#: Speed models of every GPU spec (actbench/core/gpus.py), by the same names.
GPU_SPEED_MODELS: Mapping[str, DeviceModel] = MappingProxyType({m.name: m for m in (
    _gpu("t4", "NVIDIA T4", {"fp32": 8.1, "fp16": 65}, 320, 3, "NVIDIA T4 datasheet", False),
    _gpu("v100", "NVIDIA V100 SXM2 16GB", {"fp32": 15.7, "fp16": 125}, 900, 3, "NVIDIA V100 datasheet (SXM2)",
         False),
    _gpu("l4", "NVIDIA L4", {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121}, 300, 4,
         "NVIDIA L4 datasheet (sparse figures halved)", True),
    _gpu("a10", "NVIDIA A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125}, 600, 4,
         "NVIDIA A10 datasheet", True),
    _gpu("a100-40gb", "NVIDIA A100 40GB", {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 1555, 4,
         "NVIDIA A100 datasheet (SXM4 40GB)", True),
    _gpu("a100-80gb", "NVIDIA A100 80GB", {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 2039, 4,
         "NVIDIA A100 datasheet (SXM4 80GB)", True),
    _gpu("h100-80gb", "NVIDIA H100 80GB", {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}, 3350, 5,
         "NVIDIA H100 datasheet (SXM5; sparse figures halved)", True),
    _gpu("h200", "NVIDIA H200", {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}, 4800, 5,
         "NVIDIA H200 datasheet (SXM; sparse figures halved)", True),
    _gpu("rtx3090", "NVIDIA GeForce RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71}, 936, 4,
         "NVIDIA Ampere GA102 whitepaper (RTX 3090; FP16/BF16 with FP32 accumulate)", True),
    _gpu("rtx4090", "NVIDIA GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}, 1008, 4,
         "NVIDIA Ada Lovelace whitepaper (RTX 4090; FP16/BF16 with FP32 accumulate)", True),
)})


def gpu_speed_model(name: str) -> DeviceModel:
    """The built-in model of GPU ``name``; ValueError naming the value and the choices."""
    try:
        return GPU_SPEED_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown GPU '{name}'; choose {', '.join(GPU_SPEED_MODELS)}") from None


def is_built_in(model: DeviceModel) -> bool:
    """Whether ``model`` is one of :data:`GPU_SPEED_MODELS` itself (the object, not a file holding the same
    values): what ``--gpu`` implies, where a file's model is a setting of its own."""
    return any(model is built_in for built_in in GPU_SPEED_MODELS.values())


def selected_device_model(gpu: str | None) -> DeviceModel | None:
    """The model a point is predicted on: the file ``--device-model`` named (:data:`DEVICE_MODEL_ENV`),
    else the built-in model of the point's GPU spec, else none (no prediction)."""
    path = os.environ.get(DEVICE_MODEL_ENV)
    if path:
        return load_device_model(path)
    return None if gpu is None else gpu_speed_model(gpu)
