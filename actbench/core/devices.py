"""Device profiles: everything that differs between cpu, cuda and meta, in one place (docs/design.md §4, §7).

A profile says how a point is measured on its device: whether it needs a child process, how to
synchronise, reset and read the peak, whether host copies are pinned, which step counts are the
default, and what to tell a user whose machine cannot run it. Nothing outside this module branches
on a device's name (a test greps for it). The declarations import no torch; the methods that touch
tensors import it when called.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from actbench.schema import Measurement

#: ``ACTBENCH_EXACT_STEPS=1`` times exactly the ``--timed-steps`` asked for: no minimum time, no
#: waiting for the spread to settle (docs/design.md §4). For quick checks where the numbers do not
#: matter, such as the test suite; a run's env.json records it, and each row's ``steps_run`` shows it.
EXACT_STEPS_ENV = "ACTBENCH_EXACT_STEPS"


def exact_steps() -> bool:
    """Whether :data:`EXACT_STEPS_ENV` asks for exactly the timed steps (ValueError for a bad value)."""
    value = os.environ.get(EXACT_STEPS_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{EXACT_STEPS_ENV} must be 0 or 1 (or unset), got {value!r}")
    return value == "1"


class SteppedModel(Protocol):
    """What a profile needs of a training step to measure one: forward with the loss, then the rest."""

    def forward_loss(self, images: Any, targets: Any) -> Any: ...

    def backward_and_update(self, loss: Any) -> None: ...


@dataclass(frozen=True)
class DeviceProfile:
    """One device kind. Subclasses override the methods that touch the hardware."""

    name: ClassVar[str]
    help: ClassVar[str]
    #: rows are predictions (no compute happened): no throughput, never mixed with measurements
    predicts: ClassVar[bool] = False
    #: points run in this process (no child): nothing can crash or leak into the next point
    in_process: ClassVar[bool] = False
    #: the parent must not initialise this device, so even the environment is captured in a child
    environment_in_child: ClassVar[bool] = False
    #: host copies (swap, L4/L5) go to pinned memory, as a GPU needs for asynchronous copies
    pins_host_memory: ClassVar[bool] = False
    #: a caching allocator reserves more than is allocated (``reserved_bytes`` is meaningful)
    has_caching_allocator: ClassVar[bool] = False
    #: device<->host copies run on a side stream, overlapping compute (L4/L5's offloader)
    async_host_copies: ClassVar[bool] = False
    #: (warm-up, timed) steps when the user gives none; memory-only commands time nothing
    default_steps: ClassVar[tuple[int, int]] = (1, 3)
    #: Timing goes past the timed steps asked for (a minimum) until the timed steps add up to
    #: ``min_timed_seconds`` and their spread has settled (IQR within ``settle_iqr_fraction`` of the
    #: median), but never past ``max_timed_steps`` steps or ``max_timed_seconds`` seconds of timed
    #: steps. Zeros time exactly the steps asked for.
    min_timed_seconds: ClassVar[float] = 0.0
    settle_iqr_fraction: ClassVar[float] = 0.10
    max_timed_steps: ClassVar[int] = 0
    max_timed_seconds: ClassVar[float] = 0.0
    #: warm-up steps before the memory step, at least (cuda: the allocator and autotuning settle)
    measures_after_all_warmup: ClassVar[bool] = False
    #: bench-kernels: calls timed between two synchronisations (cuda: launches overlap kernels)
    kernel_calls_per_sample: ClassVar[int] = 1
    #: bench-kernels' targets at 256 MiB: (fraction of a plain copy, speedup over the oracle or None)
    kernel_targets: ClassVar[tuple[float, float | None]] = (0.9, 5.0)
    #: what a report says about this device's rows beside the paper's GPU (None: nothing to add)
    report_caveat: ClassVar[str | None] = None

    # --- questions asked before any work ---------------------------------------------------------
    def unavailable(self) -> str | None:
        """Why this machine cannot run points on this device (one line), or None."""
        return None

    def resolve_steps(self, command: str, warmup: int | None, timed: int | None) -> tuple[int, int]:
        """(warm-up, timed) steps with the device's defaults filled in; ValueError for impossible ones."""
        d_warm, d_timed = self.default_steps
        return (d_warm if warmup is None else warmup,
                (0 if command == "memory" else d_timed) if timed is None else timed)

    def hardware(self) -> dict[str, Any]:
        """What the environment block records about this device beyond the host (cuda: the GPU)."""
        return {}

    def available_memory_bytes(self) -> int:
        """Memory a benchmark may still allocate here (cpu: the host's available memory)."""
        return host_available_bytes()

    # --- measuring one point (called inside the worker, or in-process for meta) -----------------
    def torch_device(self) -> "torch.device":
        import torch

        return torch.device(self.name)

    def prepare(self, device: "torch.device", budget_bytes: int | None) -> None:
        """Set the process up for a point on ``device`` (cuda: current device and memory cap)."""

    def synchronize(self, device: "torch.device") -> None:
        """Wait for queued work, so a clock read after it measures the work."""

    def allocator_memory_step(self, step: SteppedModel, images: Any, targets: Any, device: "torch.device",
                              result: "Measurement") -> None:
        """One training step measured by the device's caching allocator (``has_caching_allocator``),
        filling activation, peak, reserved and host bytes of ``result``. Devices without one are
        measured by the live-storage tracker instead (``actbench.measure.accounting``)."""
        raise TypeError(f"device {self.name} has no caching allocator to measure a step with")


@dataclass(frozen=True)
class CpuProfile(DeviceProfile):
    name: ClassVar[str] = "cpu"
    help: ClassVar[str] = "measures on the CPU, memory with a live-storage tracker (small sizes: minutes per point at 224 px)"
    # a CPU shares its cores with everything else: a few steps say little (timm and
    # torch.utils.benchmark time tens of steps, or to a minimum time)
    min_timed_seconds: ClassVar[float] = 2.0
    max_timed_steps: ClassVar[int] = 50
    max_timed_seconds: ClassVar[float] = 10.0
    report_caveat: ClassVar[str | None] = ("**`cpu` rows are not GPU numbers**: bytes come from a live-storage tracker "
                                           "(no allocator rounding, fragmentation or reserved memory), throughput is "
                                           "CPU throughput.")


@dataclass(frozen=True)
class CudaProfile(DeviceProfile):
    name: ClassVar[str] = "cuda"
    help: ClassVar[str] = "measures on the GPU (ground truth): the caching allocator's peak, synchronised timing"
    environment_in_child: ClassVar[bool] = True
    pins_host_memory: ClassVar[bool] = True
    has_caching_allocator: ClassVar[bool] = True
    async_host_copies: ClassVar[bool] = True
    default_steps: ClassVar[tuple[int, int]] = (3, 10)
    min_timed_seconds: ClassVar[float] = 1.0
    max_timed_steps: ClassVar[int] = 200
    max_timed_seconds: ClassVar[float] = 20.0
    measures_after_all_warmup: ClassVar[bool] = True
    kernel_calls_per_sample: ClassVar[int] = 10
    kernel_targets: ClassVar[tuple[float, float | None]] = (0.9, None)

    def unavailable(self) -> str | None:
        # is_available() asks the driver for a device count; it creates no CUDA context here.
        import torch

        if torch.cuda.is_available():
            return None
        return f"--device cuda: torch {torch.__version__} sees no CUDA GPU here"

    def hardware(self) -> dict[str, Any]:
        # Initialises CUDA: the environment of a cuda run is captured in a child (environment_in_child).
        import torch

        props = torch.cuda.get_device_properties(0)
        return dict(gpu_name=props.name, gpu_total_memory_bytes=props.total_memory,
                    cuda_runtime=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    gpu_count=torch.cuda.device_count())

    def available_memory_bytes(self) -> int:
        import torch

        return int(torch.cuda.mem_get_info()[0])

    def torch_device(self) -> "torch.device":
        # set_device and set_per_process_memory_fraction need an index, and tensors report one.
        import torch

        return torch.device("cuda", torch.cuda.current_device())

    def prepare(self, device: "torch.device", budget_bytes: int | None) -> None:
        import torch

        torch.cuda.set_device(device)
        if budget_bytes is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)

    def synchronize(self, device: "torch.device") -> None:
        import torch

        torch.cuda.synchronize(device)

    def allocator_memory_step(self, step: SteppedModel, images: Any, targets: Any, device: "torch.device",
                              result: "Measurement") -> None:
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        host_before = pinned_host_bytes()
        loss = step.forward_loss(images, targets)
        torch.cuda.synchronize(device)
        result.activation_bytes = torch.cuda.memory_allocated(device) - before
        host_after = pinned_host_bytes()
        if host_before is not None and host_after is not None:
            result.host_bytes = max(0, host_after - host_before)
        step.backward_and_update(loss)
        del loss
        torch.cuda.synchronize(device)
        result.peak_alloc_bytes = torch.cuda.max_memory_allocated(device)
        result.reserved_bytes = torch.cuda.max_memory_reserved(device)


@dataclass(frozen=True)
class MetaProfile(DeviceProfile):
    name: ClassVar[str] = "meta"
    help: ClassVar[str] = "predicts on fake tensors (no compute, no memory): seconds per point, no throughput"
    predicts: ClassVar[bool] = True
    in_process: ClassVar[bool] = True
    default_steps: ClassVar[tuple[int, int]] = (1, 0)
    report_caveat: ClassVar[str | None] = ("**`meta` rows are predictions** (fake tensors, no compute): sizes, and "
                                           "a throughput only where the step-time model priced the step on a device "
                                           "model (its own column); marked \"(predicted)\" everywhere.")

    def resolve_steps(self, command: str, warmup: int | None, timed: int | None) -> tuple[int, int]:
        if timed:
            raise ValueError(f"device meta predicts memory only (no compute to time); "
                             f"timed steps must be 0, got {timed}")
        return self.default_steps


def host_available_bytes() -> int:
    """The host's available memory (MemAvailable of /proc/meminfo; else the free physical pages)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def pinned_host_bytes() -> int | None:
    """Bytes of pinned host memory handed out by torch's host allocator now; None if torch cannot say.

    swap's and L4/L5's host copies are pinned (``pin_memory=True``), so the growth over a forward
    is what they keep in CPU memory. The allocator rounds blocks up to powers of two: this is the
    pinned memory actually held, not the tensors' exact sizes. Newer torch names the handed-out
    part ``active_bytes``; older only ``allocated_bytes`` (handed out, or cached for reuse).
    """
    import torch

    try:
        stats = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        return None
    for key in ("active_bytes.current", "allocated_bytes.current"):
        if key in stats:
            return int(stats[key])
    return None


PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (CpuProfile(), CudaProfile(), MetaProfile())}
DEVICE_NAMES: tuple[str, ...] = tuple(PROFILES)
#: Devices that run real compute (trust compares meta against these).
MEASURING_DEVICES: tuple[str, ...] = tuple(n for n, p in PROFILES.items() if not p.predicts)


def profile(name: str) -> DeviceProfile:
    """The profile of a device name (``cuda:1`` counts as ``cuda``); ValueError naming the choices."""
    kind = name.partition(":")[0]
    try:
        return PROFILES[kind]
    except KeyError:
        raise ValueError(f"unknown device '{name}'; choose {', '.join(DEVICE_NAMES)}") from None


def is_prediction(device: str) -> bool:
    """Whether rows of ``device`` are predictions (unknown names, from old runs, count as measured)."""
    kind = PROFILES.get(device.partition(":")[0])
    return kind is not None and kind.predicts


def holds_data(tensor: "torch.Tensor") -> bool:
    """Whether a tensor has storage behind it (a tensor on the meta device has only shape and dtype)."""
    return not tensor.is_meta


def profile_of(device: "torch.device") -> DeviceProfile:
    """The profile of a torch device (by its type)."""
    return profile(device.type)
