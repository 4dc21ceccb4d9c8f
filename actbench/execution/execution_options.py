"""How a run executes, never what it measures: :class:`ExecutionOptions` (``--executor``, ``--jobs``,
``--gpus``, ``--isolate``) and the Slurm job array's resources (:class:`SlurmOptions`, ``--slurm`` or
an experiment file's ``[slurm]`` table), each checked to one line naming the option before anything
is written (docs/design.md §7, "Executors and isolation").
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from actbench.core.devices import DeviceProfile

EXECUTORS = ("local", "slurm")

# --- options --------------------------------------------------------------------------------------
#: ``--slurm KEY=VALUE`` keys with a meaning of their own; any other key is passed to sbatch as ``--KEY=VALUE``.
SLURM_KEYS = ("partition", "account", "time", "gpus-per-job", "cpus-per-job", "array-parallelism", "poll")
#: sbatch options the job array sets itself (its tasks, logs, signal, name, resources): never from ``--slurm``.
SLURM_RESERVED = ("array", "output", "error", "open-mode", "signal", "job-name", "wrap", "gpus-per-node",
                  "cpus-per-task", "partition", "account", "time")
#: What an option's value may hold: it becomes part of an ``#SBATCH`` line of a shell script, so no
#: control characters (a new line would be a command) and no shell metacharacters.
SLURM_VALUE = re.compile(r"[A-Za-z0-9_.,:=+/@%-]{1,200}")
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}(,[A-Za-z0-9_.+-]{1,64}){0,15}")  # partition(s), account
SLURM_COUNT_MAX = 1_000_000
SLURM_VALUE_HELP = "letters, digits and _ . , : = + / @ % -"


@dataclass(frozen=True)
class SlurmOptions:
    """The job array's resources. ``time_min``: each task's limit; ``gpus_per_job`` None: one on a
    device that needs a GPU, none otherwise; ``sbatch``: extra ``#SBATCH --KEY=VALUE`` lines (value
    ``True``: a bare flag); ``poll_s``: how often the submitter looks at the jobs and the rows;
    ``given``: the keys set (so an option given where it does nothing can be refused)."""

    partition: str | None = None
    account: str | None = None
    time_min: int = 60
    gpus_per_job: int | None = None
    cpus_per_job: int | None = None
    array_parallelism: int | None = None
    sbatch: tuple[tuple[str, Any], ...] = ()
    poll_s: float = 15.0
    given: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, items: Iterable[str] | Mapping[str, Any] | None, base: "SlurmOptions | None" = None,
              where: str = "--slurm") -> "SlurmOptions":
        """Options from ``KEY=VALUE`` strings (the CLI) or a table (an experiment file's ``[slurm]``),
        over ``base``; ValueError naming ``where`` and the key for a bad key or value."""
        values = dataclasses.asdict(base or cls())
        extra = dict(values.pop("sbatch"))
        given = list(values.pop("given"))
        for raw_key, value in _pairs(items, where):
            key = _key(raw_key, where)
            given.append(key)
            if key == "sbatch":  # a table's list of raw options: ["--qos=high", "--exclusive"]
                if not isinstance(value, (list, tuple, str)):
                    raise ValueError(f"{where}: sbatch must be a list of options like \"--qos=high\", "
                                     f"got {short_repr(value)}")
                raw = cls.parse(list(value) if isinstance(value, (list, tuple)) else [value], where=where)
                own = [k for k in raw.given if k not in dict(raw.sbatch)]
                if own:  # a key of its own would be parsed here and then dropped: say where it belongs
                    raise ValueError(f"{where}: sbatch lists other sbatch options only; {own[0]} is a key of its "
                                     f"own: write {own[0]} = VALUE in the table (keys: {', '.join(SLURM_KEYS)})")
                extra.update(raw.sbatch)
                continue
            _scalar(value, key, where)
            if key in ("partition", "account"):
                values[key] = _text(value, key, where, SLURM_NAME, "names of letters, digits and _ . + - "
                                    "(a comma list for several partitions)")
            elif key == "time":
                values["time_min"] = parse_time_minutes(value, where)
            elif key in ("gpus-per-job", "cpus-per-job", "array-parallelism"):
                values[key.replace("-", "_")] = _count(value, key, where, minimum=0 if key == "gpus-per-job" else 1)
            elif key == "poll":
                values["poll_s"] = _number(value, key, where)
            elif key in SLURM_RESERVED:
                raise ValueError(f"{where}: {key} is set by actbench's job array itself; allowed keys: "
                                 f"{', '.join(SLURM_KEYS)} or another sbatch option")
            else:
                extra[key] = value if value is True else _text(value, key, where, SLURM_VALUE, SLURM_VALUE_HELP)
        return cls(**values, sbatch=tuple(extra.items()), given=tuple(dict.fromkeys(given)))

    def parameters(self, gpus: int, name: str) -> dict[str, Any]:
        """submitit ``SlurmExecutor`` parameters for an array of tasks with ``gpus`` GPUs each."""
        params: dict[str, Any] = {"time": self.time_min, "job_name": name, "signal_delay_s": 120}
        for key, value in (("partition", self.partition), ("account", self.account),
                           ("cpus_per_task", self.cpus_per_job), ("array_parallelism", self.array_parallelism)):
            if value is not None:
                params[key] = value
        if gpus:
            params["gpus_per_node"] = gpus
        if self.sbatch:
            params["additional_parameters"] = dict(self.sbatch)
        return params


def _pairs(items: Iterable[str] | Mapping[str, Any] | None, where: str) -> list[tuple[str, Any]]:
    """(key, value) pairs of a table, or of ``KEY=VALUE`` strings (a bare ``KEY``: the value True)."""
    if isinstance(items, Mapping):
        return [(str(k), v) for k, v in items.items()]
    if isinstance(items, str):
        items = [items]
    pairs = []
    for item in items or ():
        if not isinstance(item, str):
            raise ValueError(f"{where}: expected KEY=VALUE strings, got {short_repr(item)}")
        key, eq, value = item.partition("=")
        pairs.append((key, value if eq else True))
    return pairs


def _refuse_control(value: Any, key: str, where: str) -> None:
    """A control character (a new line, a carriage return) is refused, not stripped: one is never meant."""
    if isinstance(value, str) and re.search(r"[\x00-\x1f\x7f]", value):
        raise ValueError(f"{where}: {key} must be printable (no new line, carriage return or other control "
                         f"character), got {short_repr(value)}")


def _key(raw_key: str, where: str) -> str:
    _refuse_control(raw_key, "an option name", where)
    key = raw_key.strip().lstrip("-").replace("_", "-")
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,63}", key):
        raise ValueError(f"{where}: bad option name {short_repr(raw_key)} (expected KEY=VALUE with a lower-case name, "
                         "e.g. partition=gpu)")
    return key


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 5000-digit integer has no repr at all)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 60:
        return "an integer of more than 60 digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _scalar(value: Any, key: str, where: str) -> None:
    """A key that takes one value got one: a string, a number or true (a flag), never a list or table."""
    if isinstance(value, bool):
        if value is False:
            raise ValueError(f"{where}: {key} = false sets nothing; leave {key} out, or give it a value")
        return
    if not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}: {key} takes one value (a string or a number), got {type(value).__name__} "
                         f"{short_repr(value)}")


def _text(value: Any, key: str, where: str, pattern: "re.Pattern[str]" = SLURM_VALUE,
          allowed: str = SLURM_VALUE_HELP) -> str:
    _refuse_control(value, key, where)
    if value is True or not str(value).strip():
        raise ValueError(f"{where}: {key} needs a value ({key}=VALUE)")
    text = "" if isinstance(value, int) and abs(value) > 10 ** 60 else str(value).strip()
    if not pattern.fullmatch(text):
        raise ValueError(f"{where}: {key} must be {allowed} (at most 200 characters; it becomes an #SBATCH line), "
                         f"got {short_repr(value)}")
    return text


def _number(value: Any, key: str, where: str) -> float:
    try:
        number = float(value) if len(str(value)) <= 100 else math.nan
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= 86400) or value is True:
        raise ValueError(f"{where}: {key} must be a positive number of seconds up to 86400, got {short_repr(value)}")
    return number


def _count(value: Any, key: str, where: str, minimum: int = 1) -> int:
    _refuse_control(value, key, where)
    text = str(value).strip() if not isinstance(value, int) or abs(value) < 10 ** 60 else ""
    number = int(text) if re.fullmatch(r"\d{1,7}", text) and not isinstance(value, (bool, float)) else -1
    if number < minimum or number > SLURM_COUNT_MAX:
        raise ValueError(f"{where}: {key} must be an integer from {minimum} to {SLURM_COUNT_MAX}, "
                         f"got {short_repr(value)}")
    return number


def parse_time_minutes(value: Any, where: str = "--slurm") -> int:
    """Slurm's time formats -> whole minutes (rounded up): ``90``, ``1:30:00``, ``2-00:00:00``, ``45:00``."""
    text = "" if isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) > 10 ** 60) else str(value)
    match = re.fullmatch(r"(?:(\d{1,3})-)?(\d{1,7})(?::(\d{1,2}))?(?::(\d{1,2}))?", text.strip(" "))
    if not match:
        raise ValueError(f"{where}: time must be minutes or [D-]HH:MM:SS, got {short_repr(value)}")
    days, a, b, c = match.groups()
    numbers = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        numbers += [0] * (3 - len(numbers))
        seconds = int(days) * 86400 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    elif len(numbers) == 1:  # minutes
        seconds = numbers[0] * 60
    elif len(numbers) == 2:  # MM:SS
        seconds = numbers[0] * 60 + numbers[1]
    else:  # HH:MM:SS
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    if not 0 < seconds <= 365 * 86400:
        raise ValueError(f"{where}: time must be positive and at most a year, got {short_repr(value)}")
    return math.ceil(seconds / 60)


def parse_gpus(text: str | None) -> tuple[int, ...]:
    """``--gpus 0,1,3`` -> (0, 1, 3): distinct GPU indices, in order."""
    if text is None or not str(text).strip():
        return ()
    try:
        gpus = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise ValueError(f"--gpus must be GPU indices like 0,1,2, got '{text}'") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus must be distinct GPU indices >= 0, got '{text}'")
    return gpus


@dataclass(frozen=True)
class ExecutionOptions:
    """How a run executes (never what it measures). ``jobs``: points at once on cpu and meta;
    ``gpus``: one point at a time per GPU, each child pinned to its GPU; ``isolate``: a fresh child
    per point instead of a persistent worker; ``slurm``: the job array's resources."""

    executor: str = "local"
    jobs: int = 1
    gpus: tuple[int, ...] = ()
    isolate: bool = False
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    def __post_init__(self) -> None:
        if self.slurm.given and self.executor != "slurm":
            raise ValueError(f"--slurm {', '.join(self.slurm.given)} applies only to --executor slurm "
                             f"(this run uses --executor {self.executor}); add --executor slurm or drop --slurm")

    @property
    def width(self) -> int:
        """Points that may run at once here."""
        return len(self.gpus) or self.jobs

    def check(self, device: DeviceProfile, executor_class: Any = None) -> None:
        """One-line ValueError for options that do not go together (before anything is written).

        A device whose profile captures its environment in a child is one the parent must not
        initialise: a GPU, shared out with ``--gpus``, never with ``--jobs``.
        """
        if self.executor not in EXECUTORS:
            raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got '{self.executor}'")
        if self.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.jobs}")
        if self.executor == "local":
            from actbench.execution.executors import cpu_count

            if self.jobs > cpu_count():  # beyond the cores, points only queue for them
                raise ValueError(f"--jobs must be between 1 and {cpu_count()} (this machine's cores: each point "
                                 f"at once takes one), got {self.jobs}")
        on_gpus = device.environment_in_child
        if self.gpus and self.jobs > 1:
            raise ValueError("--jobs and --gpus do not go together: --gpus runs one point per GPU at a time")
        if self.gpus and not on_gpus:
            raise ValueError(f"--gpus pins points to GPUs; on {device.name} use --jobs N (points at once)")
        if self.jobs > 1 and on_gpus:
            raise ValueError(f"--jobs {self.jobs} would put {self.jobs} points on one GPU at once (their memory "
                             f"figures would mix); use --gpus 0,1,... for one point per GPU")
        if self.executor == "slurm":
            if self.gpus:
                raise ValueError("--gpus applies to --executor local; on Slurm use --slurm gpus-per-job=N")
            missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
            if executor_class is None and missing:
                raise ValueError(f"--executor slurm: no Slurm here ({missing[0]} is not on PATH); run on the "
                                 "cluster's login node, or use --executor local")
