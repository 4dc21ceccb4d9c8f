"""How each point is measured, shared by every command: devices, step counts, budgets, precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actbench.core.devices import DeviceProfile
from actbench.core.gpus import GpuSpec
from actbench.planning.device_models import DeviceModel, is_built_in
from actbench.planning.point import Point
from actbench.schema import DEFAULT_PRECISION, DEFAULT_TIMEOUT_S, InputSize, ModelSpec, PointConfig
from actbench.strategies import Strategy


@dataclass(frozen=True)
class MeasureSettings:
    """How each point is measured (shared by every command): the device's profile, not its name."""

    device: DeviceProfile
    budget_bytes: int | None = None
    warmup_steps: int = 1
    timed_steps: int = 3
    checkpoint_segments: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    precision: str = DEFAULT_PRECISION
    #: the GPU planned for (budget_bytes is then its usable memory), None: none
    gpu: GpuSpec | None = None
    host_budget_bytes: int | None = None
    #: the device model step times are priced on (None: not priced); part of the identity when a file gave
    #: it (``--device-model``), as its predictions are the rows' too
    speed_model: DeviceModel | None = None

    def point(self, model: ModelSpec, strategy: Strategy, batch_size: int, size: InputSize) -> Point:
        config = PointConfig(model=model, strategy=strategy.name, batch_size=batch_size, **size.point_fields(),
                             device=self.device.name, budget_bytes=self.budget_bytes, warmup_steps=self.warmup_steps,
                             timed_steps=self.timed_steps, checkpoint_segments=self.checkpoint_segments,
                             precision=self.precision, gpu=None if self.gpu is None else self.gpu.name,
                             host_budget_bytes=self.host_budget_bytes)
        return Point(config, strategy, self.device, self.gpu, self.speed_model)

    def identity(self) -> dict[str, Any]:
        """What makes results differ (the timeout does not), by name. fp32, and a GPU or host budget not
        given, are left out, so the run directories named before they existed keep their names; so is a
        device model unless a file gave one (:meth:`priced_on`): another model is another run directory."""
        data: dict[str, Any] = {"device": self.device.name, "budget_bytes": self.budget_bytes,
                                "warmup_steps": self.warmup_steps, "timed_steps": self.timed_steps,
                                "checkpoint_segments": self.checkpoint_segments}
        if self.precision != DEFAULT_PRECISION:
            data["precision"] = self.precision
        if self.gpu is not None:
            data["gpu"] = self.gpu.name
        if self.host_budget_bytes is not None:
            data["host_budget_bytes"] = self.host_budget_bytes
        priced_on = self.priced_on()
        if priced_on is not None:
            data["device_model"] = priced_on
        return data

    def priced_on(self) -> dict[str, str] | None:
        """The device model's name and fingerprint where a file gave it (``--device-model``): a resume must
        not keep rows priced on another model, or on none. None without one, or for a GPU's built-in
        model, which the GPU spec in the identity implies (run folders named before keep their names)."""
        if self.speed_model is None or is_built_in(self.speed_model):
            return None
        return {"name": self.speed_model.name, "sha256": self.speed_model.fingerprint()}

    @classmethod
    def resolve(cls, device: DeviceProfile, command: str, budget_bytes: int | None = None,
                warmup_steps: int | None = None, timed_steps: int | None = None,
                checkpoint_segments: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                precision: str = DEFAULT_PRECISION, gpu: GpuSpec | None = None,
                host_budget_bytes: int | None = None, speed_model: DeviceModel | None = None) -> "MeasureSettings":
        """Settings with each step count left as None filled with the device's default.

        The defaults are the device profile's (cuda warms up 3 steps and times 10: kernels autotune
        and the allocator settles; cpu 1 and 3: a step costs seconds; meta one untimed step: no
        compute); ``memory`` times nothing. The CLI and experiment files both come through here, so
        the same options name the same run.
        """
        warmup_steps, timed_steps = device.resolve_steps(command, warmup_steps, timed_steps)
        return cls(device=device, budget_bytes=budget_bytes, warmup_steps=warmup_steps, timed_steps=timed_steps,
                   checkpoint_segments=checkpoint_segments, timeout_s=timeout_s, precision=precision, gpu=gpu,
                   host_budget_bytes=host_budget_bytes, speed_model=speed_model)
