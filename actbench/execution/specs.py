"""One spec per measuring command, shared by the CLI and experiment files (docs/design.md §7).

``actbench sweep-batch resnet50 --levels L3 --budget 16GiB`` and an experiment step with
``command = "sweep-batch"`` build the same :class:`CommandSpec`; its validation and defaults live
here once, and :meth:`CommandSpec.plan` turns it into a :class:`RunPlan`: the run directory's name,
the library config, the search that executes it, how many points it may take, what a dry run
prints and the summary it writes. The CLI only parses options and renders; experiment files only
describe.

A bad value raises :class:`SpecError` naming the field; the CLI prints it as ``--field-name ...``
and an experiment file as ``steps[i].field_name: ...`` — the same check, in each one's vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from actbench.core.devices import DEVICE_NAMES, PROFILES
from actbench.schema import DEFAULT_PRECISION, PRECISIONS
from actbench.schema import DEFAULT_TIMEOUT_S, DIMENSIONS, LIMITS, MAX_LIST_VALUES, PLAN_DIMENSIONS, column_range

#: Commands that measure (or predict) points through the runner.
MEASURING_COMMANDS: tuple[str, ...] = ("sweep-batch", "throughput", "memory", "max-scale", "plan")
#: plan predicts, always on the predicting device.
PLAN_DEVICE = next(name for name, p in PROFILES.items() if p.predicts)
#: The CLI option of a field, where it is not ``--`` + the field with dashes.
OPTION_NAMES = {"timeout_s": "--timeout", "model": "MODEL"}
#: What a command compares when the user names no strategy: fp32 against ActNN L3, the paper's
#: main comparison. ``--levels`` / ``--strategies`` replace it (experiment files always say).
DEFAULT_STRATEGIES: tuple[str, ...] = ("fp32", "L3")
#: Commands that search for the largest size that fits: on a predicting device nothing runs out
#: of memory, so they need a budget to say where "fits" ends.
SEARCHING_COMMANDS: tuple[str, ...] = ("sweep-batch", "max-scale", "plan")


class SpecError(ValueError):
    """A bad value of one field; ``field`` names it, ``problem`` says what is wrong and what is allowed."""

    def __init__(self, field: str, problem: str, whole: bool = False) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
        self.whole = whole  # the problem is a complete sentence of its own (from a parser)

    def as_option(self) -> str:
        """The message in the CLI's vocabulary: ``--stop-after must be >= 1, got 0``."""
        if self.whole:
            return self.problem
        option = OPTION_NAMES.get(self.field, "--" + self.field.replace("_", "-"))
        return f"{option} {self.problem}"


def _positive_finite(field: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise SpecError(field, f"must be a positive number of seconds, got {value}")


@dataclass(frozen=True)
class RunPlan:
    """One run directory's worth of work: a library config and the search that executes it."""

    name: str
    command: str
    config: Any
    search: Callable[[Any, Callable], Any]
    points: int
    preview: tuple[str, ...]
    summary: Callable[[Any], dict[str, Any]] | None

    @property
    def device(self):
        """The device profile the run measures (or predicts) on."""
        return self.config.settings.device


@dataclass(frozen=True)
class CommandSpec:
    """A measuring command's options, with the CLI's defaults. ``strategies`` is the final list.

    ``batch``: "START:STOP:STEP", "N" or "N,M,..."; max-scale and plan: one batch size, which the CLI
    gives as a number and an experiment file may give as text. ``image_size``: "N" (square) or "HxW";
    None: the model's task's default (``frames`` likewise, video models only). ``budget``:
    e.g. "16GiB" (plan: required). ``warmup_steps``/``timed_steps``: None = the device's default.
    ``dim``/``low``/``high``/``step``: max-scale and plan only (None = the dimension's default range).
    """

    command: str
    model: str
    strategies: tuple[str, ...]
    batch: str | int = "64"
    image_size: str | int | None = None
    device: str = "cuda"
    budget: str | None = None
    stop_after: int = 2
    find_max: bool = False
    dim: str | None = None
    low: int | None = None
    high: int | None = None
    step: int | None = None
    warmup_steps: int | None = None
    timed_steps: int | None = None
    checkpoint_segments: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    extra_blocks: int = 0
    width_per_group: int | None = None
    precision: str = DEFAULT_PRECISION
    gpu: str | None = None
    host_budget: str | None = None
    frames: int | None = None

    def __post_init__(self) -> None:
        self._validate()

    # --- validation, once for every front end ------------------------------------------------------
    def _validate(self) -> None:
        self._validate_what()
        searches_a_dim = self._validate_sizes()
        self._validate_memory()
        self._validate_steps()
        self._checked("timed_steps", self.settings)
        if searches_a_dim:
            self._checked("dim", self._search_config)
        self._refuse_what_does_nothing()

    def _validate_what(self) -> None:
        """The command, model, strategies, precision and device (strategies parsed into their names)."""
        from actbench.execution.parsing import parse_strategies

        if self.command not in MEASURING_COMMANDS:
            raise SpecError("command", f"must be one of {', '.join(MEASURING_COMMANDS)}, got '{self.command}'")
        self._checked("model", lambda: _validate_model(self.model_spec()))
        if not self.strategies:
            raise SpecError("strategies", "is empty: give strategies or levels")
        object.__setattr__(self, "strategies", self._checked("strategies",
                                                             lambda: parse_strategies(",".join(self.strategies))))
        object.__setattr__(self, "precision", getattr(self.precision, "value", self.precision))  # a CLI enum
        if self.precision not in PRECISIONS:
            raise SpecError("precision", f"must be one of {', '.join(PRECISIONS)}, got '{self.precision}'")
        if self.device not in DEVICE_NAMES:
            raise SpecError("device", f"must be one of {', '.join(DEVICE_NAMES)}, got '{self.device}'")
        if self.command == "plan" and self.device != PLAN_DEVICE:
            raise SpecError("device", f"plan predicts on {PLAN_DEVICE}, got '{self.device}'")
        if PROFILES[self.device].predicts:
            from actbench import strategies

            for name in self.strategies:
                reason = strategies.get(name).not_on_meta
                if reason is not None:
                    raise SpecError("strategies", f"strategy '{name}' cannot run on {self.device}: {reason}")

    def _validate_sizes(self) -> bool:
        """Image size, batches and the searched dimension's range; True for a command that searches a dim."""
        from actbench.schema import SizeError

        try:
            self.input_size()
        except SizeError as exc:
            raise SpecError(exc.field, exc.problem, whole=exc.whole) from None
        batch_sizes = self._checked("batch", self.batch_sizes)
        searches_a_dim = self.command in ("max-scale", "plan")
        if searches_a_dim:
            if len(batch_sizes) != 1:
                raise SpecError("batch", f"{self.command} takes one batch size, got '{self.batch}'")
            allowed = PLAN_DIMENSIONS if self.command == "plan" else DIMENSIONS
            if self.dim not in allowed:
                raise SpecError("dim", f"must be one of {', '.join(allowed)}, got {self.dim!r}")
        elif any(v is not None for v in (self.dim, self.low, self.high, self.step)):
            raise SpecError("dim", f"dim/low/high/step apply to max-scale and plan only, not {self.command}")
        for name, dim in (("extra_blocks", "depth"), ("width_per_group", "width")):
            value = getattr(self, name)
            if value is not None and value > LIMITS[dim]:
                raise SpecError(name, f"must be at most {LIMITS[dim]}, got {value}")
        if searches_a_dim:
            limit = LIMITS["batch" if self.dim == "batch" else self.dim]
            for name in ("low", "high"):
                value = getattr(self, name)
                if value is not None and value > limit:
                    raise SpecError(name, f"must be at most {limit} for --dim {self.dim}, got {value}")
            if self.dim == "resolution" and self.low is not None:
                self._check_smallest_side(self.low)
        return searches_a_dim

    def _check_smallest_side(self, side: int) -> None:
        """A resolution search's --low is a size the model trains at (the check every --image-size gets)."""
        from actbench.schema import SizeError
        from actbench.training.tasks import input_size_for

        try:
            input_size_for(self.model, side, self.frames)
        except SizeError as exc:
            raise SpecError("low", exc.problem if exc.whole else f"is the smallest side searched: {exc.problem}",
                            whole=exc.whole) from None

    def _validate_memory(self) -> None:
        """The device memory (--budget or --gpu, one of them where a search needs it) and the host budget."""
        if self.gpu is not None:
            from actbench.core.gpus import GPU_NAMES

            if self.gpu not in GPU_NAMES:
                raise SpecError("gpu", f"must be one of {', '.join(GPU_NAMES)}, got '{self.gpu}'")
            if not PROFILES[self.device].predicts:
                raise SpecError("gpu", f"plans a prediction for a GPU model (--device {PLAN_DEVICE}); on {self.device} "
                                       f"the device itself is measured, got --gpu {self.gpu}")
            if self.budget is not None:
                raise SpecError("budget", f"and --gpu both set the device memory: give one (--gpu {self.gpu} plans for "
                                          f"what that GPU leaves to PyTorch; --budget is a plain cap), got --budget "
                                          f"{self.budget}")
        if self.host_budget is not None:
            _size("host_budget", self.host_budget)
        if self.budget is not None:
            _size("budget", self.budget)
        elif self.gpu is not None:
            pass
        elif self.command == "plan":
            raise SpecError("budget", "is required: plan predicts the largest size under a memory budget (e.g. 16GiB, "
                                      "or --gpu t4)")
        elif self.command in SEARCHING_COMMANDS and PROFILES[self.device].predicts:
            raise SpecError("budget", f"is required for {self.command} on {self.device}: a prediction never runs out "
                                      "of memory, so without a budget every size fits and a search finds only lower "
                                      "bounds (e.g. --budget 16GiB, or --gpu t4)")

    def _validate_steps(self) -> None:
        """How a point runs: the scan's stop, the child's timeout, warm-up, timed steps, checkpoint segments."""
        if self.stop_after <= 0:
            raise SpecError("stop_after", f"must be >= 1, got {self.stop_after}")
        _positive_finite("timeout_s", self.timeout_s)
        for name in ("warmup_steps", "timed_steps"):
            value = getattr(self, name)
            low, high = column_range(name)  # what a row may hold, so its readers keep the row
            if value is not None and not low <= value <= high:
                raise SpecError(name, f"must be in {low}..{high}, got {value}")
        if self.checkpoint_segments is not None and self.checkpoint_segments <= 0:
            raise SpecError("checkpoint_segments", f"must be > 0, got {self.checkpoint_segments}")
        if PROFILES[self.device].predicts and self.timed_steps:
            raise SpecError("timed_steps", f"must be 0 on {self.device}: it predicts memory only (no compute to time), "
                                           f"got {self.timed_steps}")

    def _refuse_what_does_nothing(self) -> None:
        """Options that change nothing in this mode are refused, so a row never records what was not used."""
        from actbench import strategies

        predicts = PROFILES[self.device].predicts
        if self.command == "throughput" and predicts:
            raise SpecError("device", f"{self.device} predicts memory only, no throughput: measure small sizes with "
                                      "--device cpu --image-size 64 --batch 2, or predict memory with `actbench "
                                      f"memory {self.model} --device {self.device}`")
        if self.command == "throughput" and self.timed_steps == 0:
            raise SpecError("timed_steps", "must be at least 1 for throughput: it times training steps (0 times "
                                           "nothing; `actbench memory` measures memory alone), got 0")
        meta_warmup = PROFILES[self.device].default_steps[0]
        if predicts and self.warmup_steps is not None and self.warmup_steps != meta_warmup:
            raise SpecError("warmup_steps", f"does nothing on {self.device}: it predicts one untimed step (no compute "
                                            f"to warm up), got {self.warmup_steps}")
        if self.host_budget is not None and not any(strategies.get(s).uses_host_memory for s in self.strategies):
            swapping = [s for s in strategies.ALL_STRATEGIES if strategies.get(s).uses_host_memory]
            raise SpecError("host_budget", f"limits the pinned host memory of strategies that swap "
                                           f"({', '.join(swapping)}); none of {', '.join(self.strategies)} does, got "
                                           f"--host-budget {self.host_budget}")
        if self.checkpoint_segments is not None:
            self._check_segments(self.checkpoint_segments)

    def _check_segments(self, asked: int) -> None:
        """--checkpoint-segments only with a strategy that cuts segments, and only a number the model makes."""
        if not any(_cuts_segments(s) for s in self.strategies):
            raise SpecError("checkpoint_segments", f"applies to {', '.join(SEGMENTED_STRATEGIES)} and checkpoint+L0..L2 "
                                                   f"(they checkpoint segments); none of {', '.join(self.strategies)} "
                                                   f"does, got {asked}")
        exact = self._exact_segments()
        if asked in exact:
            return
        label = self.model_spec().label()
        if not exact or asked > exact[-1]:
            most = exact[-1] if exact else 0
            raise SpecError("checkpoint_segments", f"must be at most {most} ({label} can be cut into at most {most} "
                                                   f"checkpoint segments), got {asked}")
        raise SpecError("checkpoint_segments", f"must be one of {_spans(exact)} for {label} (the segment counts it "
                                               "is cut into exactly: a segment never spans two block containers nor "
                                               f"starts at an in-place module), got {asked}")

    def _exact_segments(self) -> tuple[int, ...]:
        """The segment counts checkpointing makes exactly of this model (built on meta, nothing computed);
        a depth search: of its smallest model."""
        import dataclasses

        import torch

        from actbench.strategies.mechanics.checkpointing import exact_segment_counts
        from actbench.training.tasks import task_of

        spec = self.model_spec()
        if self.dim == "depth":
            spec = dataclasses.replace(spec, extra_blocks=self.low or 0)
        with torch.device("meta"):
            model = task_of(spec.name).build(spec, self.input_size())
        return exact_segment_counts(model)

    @staticmethod
    def _checked(field: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except SpecError:
            raise
        except ValueError as exc:
            raise SpecError(field, str(exc), whole=True) from None

    # --- what the spec means ------------------------------------------------------------------------
    def model_spec(self):
        from actbench.schema import ModelSpec

        return ModelSpec(self.model, extra_blocks=self.extra_blocks, width_per_group=self.width_per_group)

    def input_size(self):
        """The size every point trains at (the model's task's default where not given); ValueError (one
        line) for one it cannot train at."""
        from actbench.training.tasks import input_size_for

        return input_size_for(self.model, self.image_size, self.frames)

    def batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes given (with --find-max, a search range: only its ends matter, any length)."""
        from actbench.execution.parsing import check_int, parse_int_range

        if isinstance(self.batch, int):
            return (check_int(self.batch),)
        values = parse_int_range(self.batch, "batch", max_values=None if self.find_max else MAX_LIST_VALUES)
        if self.find_max and max(values) // 4 * 4 < min(values):
            raise ValueError(f"bad batch '{self.batch}': --find-max searches the multiples of 4 from its smallest "
                             f"to its largest value, and {min(values)}..{max(values)} holds none (e.g. 4:512)")
        return values

    def budget_bytes(self) -> int | None:
        """--budget, or what the --gpu profile leaves to PyTorch's allocator (docs/design.md §10)."""
        from actbench.execution.parsing import parse_bytes

        if self.gpu is not None:
            from actbench.core.gpus import gpu_spec

            return gpu_spec(self.gpu).usable_bytes
        return None if self.budget is None else parse_bytes(self.budget)

    def host_budget_bytes(self) -> int | None:
        from actbench.execution.parsing import parse_bytes

        return None if self.host_budget is None else parse_bytes(self.host_budget)

    def settings(self):
        """How each point is measured: the device's profile and the GPU, resolved here once; step counts
        filled in by the device profile."""
        from actbench.core.gpus import gpu_spec
        from actbench.planning.device_models import selected_device_model
        from actbench.planning.settings import MeasureSettings

        gpu = None if self.gpu is None else gpu_spec(self.gpu)
        return MeasureSettings.resolve(PROFILES[self.device], self.command, self.budget_bytes(), self.warmup_steps,
                                       self.timed_steps, self.checkpoint_segments, self.timeout_s, self.precision,
                                       gpu, self.host_budget_bytes(), selected_device_model(self.gpu))

    def resolved_strategies(self):
        """The strategies the spec names, as the objects every layer below receives."""
        from actbench import strategies

        return tuple(strategies.get(name) for name in self.strategies)

    def gpu_tag(self) -> str:
        """`` (t4: reserved bytes, caching-allocator model)`` after a budget planned for a GPU spec."""
        return "" if self.gpu is None else f" ({self.gpu}: predicted reserved bytes, caching-allocator model)"

    def precision_tag(self) -> str:
        """`` bf16`` / `` fp16`` after a strategy's name in previews; nothing at fp32."""
        return "" if self.precision == DEFAULT_PRECISION else f" {self.precision}"

    def _search_config(self):
        from actbench.planning.configs import ScaleConfig, plan_defaults, validate_max_scale, validate_plan, with_defaults

        (batch_size,) = self.batch_sizes()
        defaults, validate = (plan_defaults, validate_plan) if self.command == "plan" else (with_defaults,
                                                                                             validate_max_scale)
        lo, hi, st = defaults(self.dim, self.low, self.high, self.step)
        cfg = ScaleConfig(self.dim, self.model, self.resolved_strategies(), batch_size, self.input_size(), lo, hi,
                          st, self.settings(), command=self.command)
        validate(cfg)
        return cfg

    def plan(self) -> RunPlan:
        """The run this spec asks for (run-directory name, config, search, point count, preview)."""
        from actbench.store.results import run_name
        from actbench.planning.configs import GridConfig, SweepConfig
        from actbench.planning.guided import search_probes
        from actbench.planning.search import run_grid, run_max_scale, run_plan, run_sweep

        settings = self.settings()
        spec = self.model_spec()
        size = self.input_size()
        if self.command == "sweep-batch":
            cfg = SweepConfig(spec, self.resolved_strategies(), self.batch_sizes(), size, settings,
                              self.stop_after, self.find_max)
            cands = cfg.candidates()
            per = search_probes(len(cands)) if self.find_max else len(cands)
            how = (f"model-guided search over {len(cands)} batch sizes {cands[0]}..{cands[-1]} (multiples of 4), "
                   f"usually <= {search_probes(len(cands))} points" if self.find_max
                   else f"batches {', '.join(map(str, cands))}")
            preview = tuple(f"{s}{self.precision_tag()}: {spec.label()} {size.label()} {self.device}: {how}"
                            for s in self.strategies)
            name = run_name("sweep-batch", spec.label(), self.device, size, cfg.identity())
            return RunPlan(name, self.command, cfg, run_sweep, per * len(self.strategies), preview,
                           self._summary("max_batch"))
        if self.command == "max-scale":
            cfg = self._search_config()
            cands = cfg.candidates()
            preview = tuple(f"{s}{self.precision_tag()}: {self.model} batch {cfg.batch_size}: model-guided search of {self.dim} over {cfg.low}..{cfg.high} "
                            f"step {cfg.step} ({len(cands)} candidates, usually <= {search_probes(len(cands))} points)"
                            for s in self.strategies)
            name = run_name(f"max-scale-{self.dim}", self.model, self.device, size, cfg.identity())
            return RunPlan(name, self.command, cfg, run_max_scale, search_probes(len(cands)) * len(self.strategies),
                           preview, self._summary("max", dim=self.dim))
        if self.command == "plan":
            from actbench.schema import format_bytes

            cfg = self._search_config()
            cands = cfg.candidates()
            preview = tuple(f"{s}{self.precision_tag()}: {self.model} {size.label()} {PLAN_DEVICE}: search of {self.dim} over "
                            f"{cfg.low}..{cfg.high} step {cfg.step} ({len(cands)} candidates) under "
                            f"{format_bytes(settings.budget_bytes)}{self.gpu_tag()}" for s in self.strategies)
            name = run_name(f"plan-{self.dim}", self.model, PLAN_DEVICE, size, cfg.identity())
            return RunPlan(name, self.command, cfg, run_plan, 4 * len(self.strategies), preview,
                           self._summary("max", dim=self.dim, budget_bytes=settings.budget_bytes))
        cfg = GridConfig(self.command, spec, self.resolved_strategies(), self.batch_sizes(), size, settings)
        name = run_name(self.command, spec.label(), self.device, size, cfg.identity())
        points = cfg.points()
        return RunPlan(name, self.command, cfg, run_grid, len(points), tuple(p.describe() for p in points), None)

    def _summary(self, what: str, **extra: Any) -> Callable[[Any], dict[str, Any]]:
        command = self.command

        def make(outcome) -> dict[str, Any]:
            return {"command": command, **extra, what: outcome.summary()}

        return make

    def describe(self) -> str:
        what = f"dim {self.dim}" if self.dim is not None else f"batch {self.batch}"
        return (f"{self.command} {self.model_spec().label()} [{','.join(self.strategies)}]{self.precision_tag()} "
                f"{what} {self.input_size().label()} {self.device}" + (f" budget {self.budget}" if self.budget else "")
                + (f" gpu {self.gpu}" if self.gpu else "") + (f" host budget {self.host_budget}" if self.host_budget else ""))



#: Strategies that cut the model into checkpoint segments (``--checkpoint-segments`` sets how many);
#: ``checkpoint+L0`` .. ``checkpoint+L2`` are ``checkpoint`` with a level inside.
SEGMENTED_STRATEGIES: tuple[str, ...] = ("checkpoint", "sac")


def _cuts_segments(strategy: str) -> bool:
    return strategy.split("+")[0].split("@")[0] in SEGMENTED_STRATEGIES


def _spans(values: tuple[int, ...]) -> str:
    """(1, 2, 3, 5) -> '1..3, 5'."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)


def _size(field: str, text: str) -> int:
    """``text`` as bytes, or a SpecError naming ``field``, the text and what a size may be."""
    from actbench.execution.parsing import parse_bytes

    word = field.replace("_", " ")
    try:
        return parse_bytes(text, word)
    except ValueError as exc:
        raise SpecError(field, str(exc).removeprefix(word + " ")) from None


def _validate_model(spec) -> None:
    from actbench.training.model_names import validate_model_spec

    validate_model_spec(spec)


__all__ = ["CommandSpec", "DEFAULT_STRATEGIES", "MEASURING_COMMANDS", "PLAN_DEVICE", "RunPlan", "SEARCHING_COMMANDS",
           "SpecError"]
