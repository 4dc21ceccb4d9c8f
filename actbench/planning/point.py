"""A point with its names resolved: what every layer below the command line receives.

A :class:`~actbench.schema.PointConfig` names its model, strategy, device and GPU; it is the point's
identity (its key) and what crosses a process boundary. :class:`Point` pairs it with the objects
those names stand for, looked up once: by the spec a command builds, and once more in a worker for
a point that arrived as JSON (docs/design.md §7).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actbench.core.devices import DeviceProfile, profile
from actbench.core.gpus import GpuSpec, gpu_spec
from actbench.planning.device_models import DeviceModel, selected_device_model
from actbench.schema import InputSize, ModelSpec, PointConfig
from actbench.strategies import Strategy, get
from actbench.training.tasks import Task, task_of


@dataclass(frozen=True, eq=False)
class Point:
    """``config`` and the strategy, device profile and GPU (None: an idealised device) it names, the
    device model its step time is priced on (None: not priced), and the task its model trains for
    (``actbench.training.tasks``; looked up from the model's name when not given).

    Two points are the same point when their keys are: compare ``key()``, not the objects."""

    config: PointConfig
    strategy: Strategy
    device: DeviceProfile
    gpu: GpuSpec | None = None
    speed_model: DeviceModel | None = None
    task: Task = field(default=None)  # type: ignore[assignment]  # filled by __post_init__

    def __post_init__(self) -> None:
        if self.task is None:
            object.__setattr__(self, "task", task_of(self.config.model.name))

    @classmethod
    def resolve(cls, config: PointConfig) -> "Point":
        """The objects ``config``'s names stand for; ValueError (one line) for a name nothing answers to."""
        return cls(config, get(config.strategy), profile(config.device),
                   None if config.gpu is None else gpu_spec(config.gpu), selected_device_model(config.gpu),
                   task_of(config.model.name))

    def key(self) -> str:
        return self.config.key()

    def describe(self) -> str:
        return self.config.describe()

    @property
    def model(self) -> ModelSpec:
        return self.config.model

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def image_size(self) -> int:
        return self.config.image_size

    @property
    def size(self) -> InputSize:
        return self.config.size

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def budget_bytes(self) -> int | None:
        return self.config.budget_bytes

    @property
    def host_budget_bytes(self) -> int | None:
        return self.config.host_budget_bytes

    @property
    def warmup_steps(self) -> int:
        return self.config.warmup_steps

    @property
    def timed_steps(self) -> int:
        return self.config.timed_steps

    @property
    def checkpoint_segments(self) -> int | None:
        return self.config.checkpoint_segments
