"""The environment every Python child of actbench starts with (workers, builds, benchmarks, checks)."""

from __future__ import annotations

import os
from pathlib import Path

import actbench

#: The folder that holds this package: the only entry a child's ``PYTHONPATH`` keeps.
PACKAGE_ROOT = str(Path(actbench.__file__).resolve().parent.parent)


def python_child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The user's environment without their ``PYTHONPATH`` (a folder there could shadow ``json`` or
    ``torch``); only this package's root is on it, so a child started with ``-P`` in a private
    directory imports this actbench and nothing the user left lying around."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = PACKAGE_ROOT
    env.update(extra or {})
    return env
