"""scripts/gpu_check.sh, rehearsed without a GPU: a loan is one short run, so a step that would fail on
a misspelled option or a missing file must fail here first.

The rehearsal runs the whole script with ``$PYTHON`` pointing to a stand-in that parses each step's
command line and runs nothing: an ``actbench`` command through the CLI's own parser (option names,
choices, ranges), a script under scripts/ through its own argparse parser, pytest's test files by
existence. ``nvidia-smi`` is a stand-in too. What is checked besides the command lines is the script's
own plumbing: one ``rc=`` line per step in summary.txt, results.tgz packed, exit status 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

# The stand-in for python: parse, do not run. Exit 2 with one line on what would have failed.
STAND_IN = '''
import argparse, runpy, sys
from pathlib import Path

args = sys.argv[1:]
if args[:2] == ["-m", "actbench"]:
    import typer  # not click: newer Typer releases carry their own copy of it
    from actbench.cli.app import app
    name, rest = args[2], args[3:]
    command = typer.main.get_command(app).commands.get(name)
    if command is None:
        sys.exit(f"gpu_check rehearsal: actbench has no command {name!r}")
    try:
        command.make_context(name, rest)
    except Exception as exc:  # the parser's usage errors; any other is a failed parse too
        message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        sys.exit(f"gpu_check rehearsal: actbench {name}: {message}")
    sys.exit(0)
if args[:2] == ["-m", "pytest"]:
    missing = [a for a in args if a.startswith("tests/") and not Path(a).is_file()]
    sys.exit(f"gpu_check rehearsal: no test file {missing}" if missing else 0)
if args[0] == "-c":
    sys.exit(0)
script = Path(args[0])
if not script.is_file():
    sys.exit(f"gpu_check rehearsal: no script {script}")
if "argparse" in script.read_text():
    parse = argparse.ArgumentParser.parse_args
    def parse_only(self, argv=None, namespace=None):
        parse(self, argv, namespace)
        raise SystemExit(0)
    argparse.ArgumentParser.parse_args = parse_only
    sys.argv = args
    runpy.run_path(str(script), run_name="__main__")
sys.exit(0)
'''


def _step_names(text: str) -> list[str]:
    """The steps the script declares, in order; the loop's ``"${name}_cuda"`` steps expanded from its task list."""
    names = re.findall(r"^\s*step ([a-z0-9_]+) ", text, flags=re.M)
    tasks = re.search(r'^for task in (.+); do$', text, flags=re.M)
    assert tasks, "the loop over tasks is gone: update this test"
    for task in re.findall(r'"(\w+) ', tasks[1]):
        names += [f"{task}_cuda", f"{task}_meta"]
    return names


def _rehearsal_env(folder: Path, **extra: str) -> dict[str, str]:
    """The environment of a rehearsal under ``folder``: the python and nvidia-smi stand-ins written there,
    ``$OUT`` at ``folder/out``, ``HOME`` (the extension cache's parent) inside ``folder``."""
    tools = folder / "bin"
    tools.mkdir()
    (tools / "python").write_text(f"#!{sys.executable}\n{STAND_IN}")
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'name, memory.total [MiB], driver_version'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PYTHON": str(tools / "python"), "OUT": str(folder / "out"), "HOME": str(folder),
           "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", **extra}
    if "GPU_CHECK_STEPS" not in extra:
        env.pop("GPU_CHECK_STEPS", None)
    return env


def test_gpu_check_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.memory_gb(2.0)  # 1.86 GB measured, children included
def test_gpu_check_rehearsal_parses_every_step(tmp_path: Path) -> None:
    """Every step's command line parses, every step reports rc=0, and what comes back is packed."""
    env = _rehearsal_env(tmp_path, GPU_CHECK_SECONDS="540")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    log = (out / "gpu_check.log").read_text()
    assert done.returncode == 0, log[-4000:]
    summary = (out / "summary.txt").read_text().splitlines()
    reported = [line.split(" rc=")[0] for line in summary]
    assert reported == _step_names(SCRIPT.read_text())
    assert all(" rc=0 " in line for line in summary), "\n".join(summary)
    with tarfile.open(out / "results.tgz") as packed:
        packed.getmembers()  # a whole archive, not a part left by an interrupted pack


def test_gpu_check_rehearsal_fails_on_a_misspelled_option(tmp_path: Path) -> None:
    """The rehearsal can fail: a copy of the script with one option misspelled reports that step's rc."""
    text = SCRIPT.read_text()
    assert "--sizes-mib 1,16,256" in text, "bench_kernels' line changed: update this test"
    tree = tmp_path / "tree"  # the repository's files, with the misspelled copy of the script
    (tree / "scripts").mkdir(parents=True)
    (tree / "actbench").symlink_to(ROOT / "actbench")
    (tree / "tests").symlink_to(ROOT / "tests")
    for f in (ROOT / "scripts").iterdir():
        if f.name != SCRIPT.name:
            (tree / "scripts" / f.name).symlink_to(f)
    copy = tree / "scripts" / SCRIPT.name
    copy.write_text(text.replace("--sizes-mib 1,16,256", "--size-mib 1,16,256"))
    env = _rehearsal_env(tmp_path, GPU_CHECK_STEPS="bench_kernels bench_actnn")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(copy)], capture_output=True, text=True, env=env, timeout=120)
    summary = (out / "summary.txt").read_text()
    assert done.returncode != 0
    assert re.search(r"^bench_kernels rc=[1-9]", summary, flags=re.M), summary
    assert re.search(r"^bench_actnn rc=0 ", summary, flags=re.M), summary
    assert "No such option: --size-mib" in (out / "gpu_check.log").read_text()

