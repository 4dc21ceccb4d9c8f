"""Parsers for command-line values; each raises ValueError naming the bad value and what is allowed."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Sequence

from actbench.schema import LIMITS, MAX_LIST_VALUES, column_range
from actbench.strategies import BASELINE, LEVEL_NAMES, canonical

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


#: The most bytes a size option may say: what a row's ``budget_bytes`` and ``host_budget_bytes`` hold, so
#: a budget the command takes is one its rows can be read back with.
MAX_SIZE_BYTES = column_range("budget_bytes")[1]
#: What a size option allows, said by every message about one (--budget, --host-budget, experiment files).
SIZE_ALLOWED = (f"a size in bytes of at least 1 and at most {MAX_SIZE_BYTES} (2^63 - 1, just under 8388608TiB), "
                "like 16GiB or 512MiB (a number with an optional unit B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")


def parse_bytes(text: str, what: str = "budget") -> int:
    """'16GiB' -> 17179869184; '1.5GB' -> 1500000000; plain numbers are bytes (exact: no float rounding).

    A ValueError names the text given and says ``what`` must be :data:`SIZE_ALLOWED`.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse {what} '{text}': it must be {SIZE_ALLOWED}")
    exact = Decimal(match.group(1)) * _UNITS[match.group(2).lower()]
    if not 1 <= exact <= MAX_SIZE_BYTES:
        raise ValueError(f"{what} must be {SIZE_ALLOWED}, got '{text}'")
    if exact != int(exact):
        raise ValueError(f"{what} '{text}' is not a whole number of bytes: it must be {SIZE_ALLOWED}")
    return int(exact)


def parse_levels(text: str | None) -> tuple[str, ...]:
    """'L1..L5', 'L1,L3', 'all' (or empty) -> level names in order."""
    if text is None or not text.strip():
        return ()
    spec = text.strip()
    allowed = "levels are L0..L5; write e.g. L1..L5, L1,L3 or all"
    if spec.lower() == "all":
        return LEVEL_NAMES
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip().upper()
        if ".." in part:
            lo, _, hi = part.partition("..")
            if lo not in LEVEL_NAMES or hi not in LEVEL_NAMES or LEVEL_NAMES.index(lo) > LEVEL_NAMES.index(hi):
                raise ValueError(f"bad level range '{part}': {allowed}")
            out.extend(LEVEL_NAMES[LEVEL_NAMES.index(lo):LEVEL_NAMES.index(hi) + 1])
        elif part in LEVEL_NAMES:
            out.append(part)
        elif part == "ALL":
            raise ValueError(f"bad levels '{text}': 'all' stands alone (it names every level); {allowed}")
        else:
            raise ValueError(f"bad level '{part}': {allowed}")
    return tuple(dict.fromkeys(out))


def parse_strategies(text: str | None) -> tuple[str, ...]:
    """'fp32,swap,checkpoint' (level names accepted too) -> names in order, deduplicated.

    A name may carry a parameter (``compile@0.5``) or combine a strategy with an ActNN level
    (``checkpoint+L2``); each is recorded in its one spelling (``strategies.canonical``), and a refused
    combination is a ValueError saying why in one line.
    """
    if text is None or not text.strip():
        return ()
    out = []
    for part in text.split(","):
        name = part.strip()
        if name.upper() in LEVEL_NAMES:
            name = name.upper()
        out.append(canonical(name))
    return tuple(dict.fromkeys(out))


def combine_strategies(strategies: tuple[str, ...], levels: tuple[str, ...], baseline: bool) -> tuple[str, ...]:
    """--strategies and --levels add up; fp32 leads as the baseline unless disabled."""
    combined = list(strategies) + list(levels)
    if baseline and BASELINE not in combined:
        combined.insert(0, BASELINE)
    if not combined:
        raise ValueError("no strategies to run: give --strategies or --levels, or drop --no-baseline")
    return tuple(dict.fromkeys(combined))


def check_int(value: int, what: str = "batch size", largest: int = LIMITS["batch"], smallest: int = 1) -> int:
    """``value`` itself when it is a count from ``smallest`` to ``largest``; ValueError naming ``what``,
    the value and the range."""
    if not smallest <= value <= largest:
        raise ValueError(f"{what} must be between {smallest} and {largest}, got {value}")
    return value


def parse_int_range(text: str, what: str = "batch", largest: int = LIMITS["batch"],
                    max_values: int | None = MAX_LIST_VALUES) -> tuple[int, ...]:
    """'16:1024:16' (start:stop:step, stop included), '8', or '2,4,8' -> positive ints up to ``largest``.

    A range is sized before it is expanded: more than ``max_values`` values is an error, not a
    list that fills the memory (None: a search range, bounded by ``largest`` alone).
    """
    spec = text.strip()
    try:
        if ":" in spec:
            parts = [whole_number(p) for p in spec.split(":")]
            if len(parts) == 2:
                parts.append(1)
            if len(parts) != 3:
                raise ValueError
            values: Sequence[int] = range(parts[0], parts[1] + 1, parts[2]) if parts[2] > 0 else ()
        else:
            values = tuple(whole_number(p) for p in spec.split(","))
    except ValueError:
        raise ValueError(f"bad {what} '{text}': use START:STOP:STEP (e.g. 16:1024:16), N, or N,M,...") from None
    if ":" in spec and parts[2] <= 0:
        raise ValueError(f"bad {what} range '{text}': STEP must be at least 1 in START:STOP:STEP")
    if isinstance(values, range):
        last = values[-1] if values else values.start
        if max(values.start, last) > largest:
            raise ValueError(f"{what} sizes must be at most {largest}, got {max(values.start, last)} in '{text}'")
        if max_values is not None and len(values) > max_values:
            raise ValueError(f"bad {what} range '{text}': {len(values)} values, at most {max_values} "
                             f"(use a larger step, or --find-max to search a range)")
        values = tuple(values)
    if not values:
        raise ValueError(f"bad {what} range '{text}': it contains no values (START:STOP:STEP needs START <= STOP, "
                         "e.g. 16:1024:16)")
    bad = [v for v in values if v <= 0]
    if bad:
        raise ValueError(f"{what} sizes must be positive, got {bad[0]} in '{text}'")
    huge = [v for v in values if v > largest]
    if huge:
        raise ValueError(f"{what} sizes must be at most {largest}, got {huge[0]} in '{text}'")
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
        raise ValueError(f"bad {what} '{text}': it lists {twice[0]} twice (each value once)")
    return values


def whole_number(text: str, signed: bool = True) -> int:
    """An integer written in ASCII digits, with an optional sign when ``signed``, white space around it
    allowed; ValueError(text) otherwise. Python's int() also takes '1_0' and other scripts' digits,
    which a count on the command line or in a table actbench wrote should not be."""
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*" if signed else r"\s*[0-9]+\s*", text):
        raise ValueError(text)
    return int(text)
