"""GPU specs for the planner: what memory a named GPU leaves to PyTorch (docs/design.md §10).

A prediction on ``meta`` is made for an idealised device unless told which GPU it is for: with
``--gpu t4`` a point is planned for the memory a T4 leaves to PyTorch's caching allocator, and the
caching-allocator model (:mod:`actbench.planning.allocator_model`) decides out-of-memory on the memory that
allocator would reserve. This module is the one home of those numbers; it imports no torch, so
``actbench report`` can name a row's GPU without loading it. Every value says where it comes
from (``sources``); docs/design.md §10 lists them with the documents they come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

MIB = 1 << 20
GIB = 1 << 30

#: PyTorch's default cuBLAS workspace per handle before Hopper: CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8",
#: two 4096-KiB chunks and eight 16-KiB ones (8,519,680 B; docs/design.md §10).
CUBLAS_WORKSPACE_PRE_HOPPER = 2 * 4096 * 1024 + 8 * 16 * 1024
#: Hopper (compute capability 9.x): 32 MiB, cuBLAS's recommended size there (docs/design.md §10).
CUBLAS_WORKSPACE_HOPPER = 32 * MIB
#: GDDR boards with ECC on keep the check bits in the same memory (in-band): 1/16 of it (docs/design.md §10).
INBAND_ECC_FRACTION = 1 / 16
#: The CUDA context an idle PyTorch process holds on the device; an assumption until measured per GPU
#: (scripts/gpu_check.sh's ``context`` step measures it; docs/design.md §10).
CONTEXT_ALLOWANCE = 512 * MIB


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: its memory, what is not PyTorch's to allocate, and the workspaces replayed as allocations.

    ``memory_bytes`` is the vendor's capacity (a GPU's "GB" are GiB of DRAM). ``usable_bytes`` is what
    the caching allocator may reserve: capacity less in-band ECC and the CUDA context. The cuBLAS and
    cuBLASLt workspaces are allocations through that allocator, so the model replays them (they are
    rounded and cached like any block) instead of subtracting them; cuDNN's workspace is 0 because
    PyTorch falls back to an algorithm with a smaller workspace when one does not fit
    (docs/design.md §10).
    """

    name: str
    label: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    ecc_inband: bool
    context_bytes: int = CONTEXT_ALLOWANCE
    cudnn_workspace_bytes: int = 0
    #: host memory of a known machine with this GPU (None: the GPU alone says nothing about the host)
    host_memory_bytes: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def ecc_reserved_bytes(self) -> int:
        return int(self.memory_bytes * INBAND_ECC_FRACTION) if self.ecc_inband else 0

    @property
    def usable_bytes(self) -> int:
        """Bytes the caching allocator may reserve before cudaMalloc fails."""
        return self.memory_bytes - self.ecc_reserved_bytes - self.context_bytes - self.cudnn_workspace_bytes

    @property
    def cublas_workspace_bytes(self) -> int:
        """PyTorch's default cuBLAS workspace (one handle and stream)."""
        return CUBLAS_WORKSPACE_HOPPER if self.compute_capability[0] >= 9 else CUBLAS_WORKSPACE_PRE_HOPPER

    @property
    def cublaslt_workspace_bytes(self) -> int:
        """PyTorch's default cuBLASLt workspace: 1 MiB, 4 MiB on compute capability 8.x with >= 24 GiB
        (as the driver reports it), 32 MiB from 9.0 (docs/design.md §10)."""
        if self.compute_capability[0] >= 9:
            return 32 * MIB
        reported_gib = (self.memory_bytes - self.ecc_reserved_bytes) // GIB
        return 4 * MIB if self.compute_capability[0] == 8 and reported_gib >= 24 else 1 * MIB

    def workspace_allocations(self) -> tuple[int, ...]:
        """Sizes of the persistent workspace allocations a training step's matmuls make."""
        return (self.cublas_workspace_bytes, self.cublaslt_workspace_bytes)

    def describe(self) -> str:
        """One line for messages and reports: ``t4 (NVIDIA T4 16 GiB: 14.5 GiB usable)``."""
        return (f"{self.name} ({self.label} {self.memory_bytes / GIB:g} GiB: {self.usable_bytes / GIB:.2f} GiB "
                f"usable)")


_DATASHEET = "vendor data sheet"
_GDDR_ECC = "in-band ECC on (data-centre default): 1/16 of the memory holds check bits"
_NO_ECC = "HBM: ECC check bits are stored outside the capacity"
_CONTEXT = "assumed 512 MiB (torch 2.x, CUDA 12, lazy module loading); measured by gpu_check.sh's context step"


def _gpu(name: str, label: str, gib: int, cc: tuple[int, int], ecc_inband: bool, ecc_note: str,
             host_memory_bytes: int | None = None) -> GpuSpec:
    return GpuSpec(name=name, label=label, memory_bytes=gib * GIB, compute_capability=cc, ecc_inband=ecc_inband,
                      host_memory_bytes=host_memory_bytes,
                      sources=MappingProxyType({"memory": f"{_DATASHEET}: {gib} GB", "ecc": ecc_note, "context": _CONTEXT,
                                               "workspaces": "PyTorch defaults for compute capability "
                                                             f"{cc[0]}.{cc[1]} (docs/design.md §10)"}))


#: Every GPU spec by name (the CLI's ``--gpu`` choices, in this order).
GPU_SPECS: Mapping[str, GpuSpec] = MappingProxyType({p.name: p for p in (
    _gpu("t4", "NVIDIA T4", 16, (7, 5), True, _GDDR_ECC),
    _gpu("v100", "NVIDIA V100 SXM2 16GB", 16, (7, 0), False, _NO_ECC),
    _gpu("l4", "NVIDIA L4", 24, (8, 9), True, _GDDR_ECC),
    _gpu("a10", "NVIDIA A10", 24, (8, 6), True, _GDDR_ECC),
    _gpu("a100-40gb", "NVIDIA A100 40GB", 40, (8, 0), False, _NO_ECC),
    _gpu("a100-80gb", "NVIDIA A100 80GB", 80, (8, 0), False, _NO_ECC),
    _gpu("h100-80gb", "NVIDIA H100 80GB", 80, (9, 0), False, _NO_ECC),
    _gpu("h200", "NVIDIA H200", 141, (9, 0), False, _NO_ECC),
    _gpu("rtx3090", "NVIDIA GeForce RTX 3090", 24, (8, 6), False,
             "GeForce: ECC off, the whole capacity is usable"),
    _gpu("rtx4090", "NVIDIA GeForce RTX 4090", 24, (8, 9), False,
             "GeForce: ECC off, the whole capacity is usable"),
)})
GPU_NAMES: tuple[str, ...] = tuple(GPU_SPECS)


def gpu_spec(name: str) -> GpuSpec:
    """The GPU spec called ``name``; ValueError naming the value and the choices."""
    try:
        return GPU_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown GPU '{name}'; choose {', '.join(GPU_NAMES)}") from None


__all__ = ["CONTEXT_ALLOWANCE", "CUBLAS_WORKSPACE_HOPPER", "CUBLAS_WORKSPACE_PRE_HOPPER", "GPU_NAMES", "GPU_SPECS",
           "GpuSpec", "INBAND_ECC_FRACTION", "gpu_spec"]
