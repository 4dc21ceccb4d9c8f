"""How each point is measured, shared by every command: devices, step counts, budgets, precision."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from actbench.core.devices import profile
from actbench.schema import DEFAULT_PRECISION, DEFAULT_TIMEOUT_S, ModelSpec, PointConfig


@dataclass(frozen=True)
class MeasureSettings:
    """How each point is measured (shared by every command)."""

    device: str = "cpu"
    budget_bytes: int | None = None
    warmup_steps: int = 1
    timed_steps: int = 3
    checkpoint_segments: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    precision: str = DEFAULT_PRECISION
    #: GPU profile planned for (actbench/core/gpus.py; budget_bytes is then its usable memory), None: none
    gpu: str | None = None
    host_budget_bytes: int | None = None

    def point(self, model: ModelSpec, strategy: str, batch: int, image_size: int) -> PointConfig:
        return PointConfig(model=model, strategy=strategy, batch_size=batch, image_size=image_size,
                           device=self.device, budget_bytes=self.budget_bytes, warmup_steps=self.warmup_steps,
                           timed_steps=self.timed_steps, checkpoint_segments=self.checkpoint_segments,
                           precision=self.precision, gpu=self.gpu, host_budget_bytes=self.host_budget_bytes)

    def identity(self) -> dict[str, Any]:
        """What makes results differ (the timeout does not). fp32, and a GPU profile or host budget not
        given, are left out, so the run directories named before they existed keep their names."""
        data = asdict(self)
        data.pop("timeout_s")
        if data["precision"] == DEFAULT_PRECISION:
            data.pop("precision")
        for name in ("gpu", "host_budget_bytes"):
            if data[name] is None:
                data.pop(name)
        return data

    @classmethod
    def resolve(cls, device: str, command: str, budget_bytes: int | None = None, warmup_steps: int | None = None,
                timed_steps: int | None = None, checkpoint_segments: int | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S, precision: str = DEFAULT_PRECISION, gpu: str | None = None,
                host_budget_bytes: int | None = None) -> "MeasureSettings":
        """Settings with each step count left as None filled with the device's default.

        The defaults are the device profile's (cuda warms up 3 steps and times 10: kernels autotune
        and the allocator settles; cpu 1 and 3: a step costs seconds; meta one untimed step: no
        compute); ``memory`` times nothing. The CLI and experiment files both come through here, so
        the same options name the same run.
        """
        warmup_steps, timed_steps = profile(device).resolve_steps(command, warmup_steps, timed_steps)
        return cls(device=device, budget_bytes=budget_bytes, warmup_steps=warmup_steps, timed_steps=timed_steps,
                   checkpoint_segments=checkpoint_segments, timeout_s=timeout_s, precision=precision, gpu=gpu,
                   host_budget_bytes=host_budget_bytes)
