"""``actbench doctor``: what this machine has, whether the extension is built and works."""

from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import dataclass, field

import torch

from actbench.kernels import extension


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _nvcc_version(cuda_home: str | None) -> str:
    nvcc = f"{cuda_home}/bin/nvcc" if cuda_home else shutil.which("nvcc")
    if not nvcc:
        return "not found"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"{nvcc}: {err}"
    release = next((line.strip() for line in out.splitlines() if "release" in line), out.strip()[-80:])
    return f"{nvcc} ({release})"


def _self_check(device: str) -> tuple[bool, str]:
    """Round trip of a random tensor through every bit width (and mixed bits) on ``device``."""
    from actbench.kernels import ops

    x = torch.randn(5, 3, 17, 19, generator=torch.Generator().manual_seed(0)).to(device)
    widths: list[int | torch.Tensor] = [1, 2, 4, 8, torch.tensor([1, 2, 3, 5, 8], dtype=torch.int32)]
    for bits in widths:
        p = ops.quantize(x, bits, seed_offset=(1, 2))
        y = ops.dequantize(p)
        scale = p.scale.float().repeat_interleave(p.group_size, dim=1)[:, : x[0].numel()].reshape(x.shape)
        if not bool(((y - x).abs() <= 1 / scale + 1e-6).all()):
            return False, f"round trip at bits={bits if isinstance(bits, int) else 'mixed'} is off by more than one step"
        # Every device's kernels must give the host oracle's codes, bit for bit (docs/design.md §2).
        host_bits = bits.cpu() if isinstance(bits, torch.Tensor) else bits
        ref = ops.quantize(x.cpu(), host_bits, seed_offset=(1, 2), backend="oracle")
        if not torch.equal(ref.codes, p.codes.cpu()):
            return False, f"codes at bits={bits if isinstance(bits, int) else 'mixed'} differ from the oracle"
    return True, "round trip of 1, 2, 4, 8 and mixed bits, codes equal the oracle"


def diagnose() -> Report:
    """Every check, in the order a user would fix them."""
    r = Report()
    r.add("python", True, platform.python_version())
    r.add("torch", True, f"{torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
    gpu = torch.cuda.is_available()
    if gpu:
        props = torch.cuda.get_device_properties(0)
        r.add("gpu", True, f"{props.name}, {props.total_memory / 2**30:.1f} GiB, sm_{props.major}{props.minor}")
    else:
        r.add("gpu", True, "none (CPU and meta devices only)")
    cuda_home = extension.find_cuda_home() if torch.version.cuda else None
    r.add("nvcc", True, _nvcc_version(cuda_home) + (f", CUDA_HOME={cuda_home}" if cuda_home else ""))
    try:
        plan = extension.load()
    except extension.ExtensionError as err:
        r.add("extension", False, str(err))
        return r
    kinds = "CPU + CUDA kernels" if plan.with_cuda else "CPU kernels only"
    r.add("extension", True, f"{kinds}, {plan.library}")
    if plan.with_cuda:
        from actbench.kernels import ops

        registered = ops.cuda_kernels_registered()
        missing = [op for op, ok in registered.items() if not ok and op != "allocate_bits"]
        r.add("cuda kernels", not missing, "registered for every GPU op" if not missing else f"missing: {missing}")
    for device in ["cpu"] + (["cuda"] if gpu else []):
        try:
            ok, detail = _self_check(device)
        except Exception as err:  # a self-check reports any failure rather than dying on it
            ok, detail = False, f"{type(err).__name__}: {err}"
        r.add(f"self-check {device}", ok, detail)
    if gpu and not plan.with_cuda:
        r.add("self-check cuda", False, "a GPU is present but the extension was built without CUDA (no nvcc)")
    return r
