"""No value reaches a shell, and no child runs the user's code (docs/design.md §9, "Isolation").

- Slurm options (``--slurm KEY=VALUE`` and an experiment file's ``[slurm]``) become ``#SBATCH``
  lines of a shell script: a control character, a shell metacharacter or a list where one value
  belongs is refused in one line before anything is submitted (a fake ``sbatch`` on the PATH
  records whether it was called), and accepted options are one ``#SBATCH`` line each.
- Every Python child actbench starts (bench-harness' commands, workers, the extension check) runs
  with ``-P`` in a private directory and without the user's ``PYTHONPATH``: a ``json.py`` or
  ``torch.py`` planted in the working directory or on ``PYTHONPATH`` never runs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actbench.cli import app
from actbench.experiments import ExperimentError, load_experiment
from actbench.execution.execution_options import SlurmOptions

MEMORY = ["memory", "resnet18", "--device", "meta", "--batch", "2", "--image-size", "32", "--strategies", "fp32",
          "--no-baseline"]


def _fake_slurm(folder: Path, marker: Path, tools: tuple[str, ...] = ("sbatch", "srun")) -> Path:
    """Scripts named like Slurm's tools that only record that they ran."""
    folder.mkdir()
    for tool in tools:
        script = folder / tool
        script.write_text(f"#!/bin/sh\necho {tool} >> '{marker}'\nexit 1\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture
def slurm_path(tmp_path: Path, monkeypatch) -> Path:
    """A PATH with a fake sbatch and srun first; the marker file each writes when called."""
    marker = tmp_path / "slurm-called"
    tools = _fake_slurm(tmp_path / "bin", marker)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return marker


def _one_line_refusal(result, needle: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.mark.parametrize("option, needle", [
    ("partition=gpu\ntouch /tmp/actbench-pwned", "partition"),
    ("account=lab\r#SBATCH --qos=high", "account"),
    ("qos=high\ntouch /tmp/actbench-pwned", "qos"),
    ("qos=$(touch /tmp/actbench-pwned)", "qos"),
    ("constraint=a100;reboot", "constraint"),
    ("time=60\n#SBATCH --exclusive", "time"),
    ("exclu\x1bsive", "option name"),
    ("output=/tmp/elsewhere", "output"),
    ("gpus-per-job=" + "9" * 5000, "gpus-per-job"),
    ("qos=a\r", "qos"),  # a trailing control character is refused, not stripped
    ("partition=gpu\n", "partition"),
    ("time=10\r", "time"),
    ("cpus-per-job=2\n", "cpus-per-job"),
])
def test_slurm_options_that_would_inject_lines_are_refused(tmp_path: Path, slurm_path: Path, option: str,
                                                           needle: str) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*MEMORY, "--executor", "slurm", "--slurm", option, "--out", str(out)])
    _one_line_refusal(result, needle)
    assert not slurm_path.exists(), "sbatch was called"
    assert not out.exists()


@pytest.mark.parametrize("table, needle", [
    ('partition = "gpu\\ntouch /tmp/actbench-pwned"', "partition"),
    ('partition = ["gpu", "cpu"]', "partition"),
    ('qos = ["high"]', "qos"),
    ('qos = { level = "high" }', "qos"),
    ('sbatch = ["--qos=high\\nreboot"]', "qos"),
    ('sbatch = ["--partition=gpu"]', "partition"),
    ('sbatch = ["--time=60"]', "time"),
    ('time = 1e400', "time"),
])
def test_experiment_slurm_tables_are_checked_as_the_command_line(tmp_path: Path, slurm_path: Path, table: str,
                                                                 needle: str) -> None:
    path = tmp_path / "exp.toml"
    path.write_text('name = "x"\ndescription = "x"\n[[steps]]\ncommand = "memory"\nmodels = ["resnet18"]\n'
                    'strategies = ["fp32"]\ndevice = "meta"\nimage_size = 32\nbatch = "2"\n'
                    f"[slurm]\n{table}\n")
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert needle in str(info.value) and "\n" not in str(info.value) and "[slurm]" in str(info.value)
    result = CliRunner().invoke(app, ["run", str(path), "--executor", "slurm", "--out", str(tmp_path / "out")])
    _one_line_refusal(result, needle)
    assert not slurm_path.exists() and not (tmp_path / "out").exists()


def test_accepted_slurm_options_are_one_sbatch_line_each(tmp_path: Path) -> None:
    from submitit.slurm.slurm import _make_sbatch_string

    options = SlurmOptions.parse(["partition=gpu,gpu2", "account=lab-1", "time=1:30:00", "qos=high",
                                  "constraint=a100", "exclusive", "mail-user=me@example.org"])
    script = _make_sbatch_string(command="true", folder=str(tmp_path), **options.parameters(1, "actbench-x"))
    header = script.split("# command")[0]
    body = [line for line in header.splitlines() if line and not line.startswith("#")]
    assert body == [], script
    for flag in ("--partition=gpu,gpu2", "--account=lab-1", "--time=90", "--qos=high", "--constraint=a100",
                 "--exclusive", "--mail-user=me@example.org"):
        assert sum(1 for line in header.splitlines() if line == f"#SBATCH {flag}") == 1, (flag, script)


def test_slurm_without_srun_is_one_line(tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "slurm-called"
    tools = _fake_slurm(tmp_path / "bin", marker, tools=("sbatch",))
    monkeypatch.setenv("PATH", str(tools))
    result = CliRunner().invoke(app, [*MEMORY, "--executor", "slurm", "--out", str(tmp_path / "out")])
    _one_line_refusal(result, "srun")
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["memory", "run", "run-table"])
def test_slurm_options_without_the_slurm_executor_are_refused(tmp_path: Path, command: str) -> None:
    """--slurm, or an experiment's [slurm] table, do nothing on the local executor: refused, not ignored."""
    if command.startswith("run"):
        path = tmp_path / "exp.toml"
        table = '[slurm]\npartition = "gpu"\n' if command == "run-table" else ""
        path.write_text(f'name = "x"\ndescription = "x"\n{table}[[steps]]\ncommand = "memory"\nmodels = ["resnet18"]\n'
                        'strategies = ["fp32"]\ndevice = "meta"\nimage_size = 32\nbatch = "2"\n')
        args = ["run", str(path)]
    else:
        args = MEMORY
    slurm = [] if command == "run-table" else ["--slurm", "partition=gpu"]
    result = CliRunner().invoke(app, [*args, *slurm, "--out", str(tmp_path / "out")])
    _one_line_refusal(result, "--executor slurm")
    assert not (tmp_path / "out").exists()


# --- children never run the user's code -----------------------------------------------------------
POISON = "import pathlib\npathlib.Path({marker!r}).write_text('ran {name}')\nraise SystemExit(97)\n"


@pytest.fixture
def poisoned(tmp_path: Path, monkeypatch) -> Path:
    """A working directory and a PYTHONPATH folder whose json.py and torch.py write a marker file."""
    marker = tmp_path / "poison-ran"
    for folder in (tmp_path / "cwd", tmp_path / "pythonpath"):
        folder.mkdir()
        for name in ("json", "torch"):
            (folder / f"{name}.py").write_text(POISON.format(marker=str(marker), name=f"{folder.name}/{name}"))
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pythonpath"))
    return marker


@pytest.mark.memory_gb(2.0)  # 1.93 GB measured, children included
def test_bench_harness_children_ignore_the_cwd_and_pythonpath(poisoned: Path, tmp_path: Path) -> None:
    from actbench.studies.harness_cost import _run

    _run(tuple(MEMORY), tmp_path / "out", lambda _: None)
    assert not poisoned.exists(), poisoned.read_text()
    assert list((tmp_path / "out").glob("*/rows.jsonl"))


@pytest.mark.memory_gb(2.2)  # 2.06 GB measured, children included
def test_workers_ignore_the_users_pythonpath(poisoned: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["memory", "resnet18", "--device", "cpu", "--batch", "2", "--image-size", "16",
                                      "--strategies", "fp32", "--no-baseline", "--out", str(tmp_path / "out")])
    assert not poisoned.exists(), poisoned.read_text()
    assert result.exit_code == 0, result.output
    rows = list((tmp_path / "out").glob("*/rows.jsonl"))
    assert rows and '"status": "ok"' in rows[0].read_text()


def test_the_extension_check_child_ignores_the_cwd_and_pythonpath(poisoned: Path) -> None:
    import time

    from actbench.cli.progress import _ensure_in_child

    said: list[str] = []
    problem = _ensure_in_child(said.append, time.monotonic())
    assert not poisoned.exists(), poisoned.read_text()
    assert problem is None, problem


def test_slurm_tasks_start_python_with_safe_path(tmp_path: Path, slurm_path: Path) -> None:
    from actbench.execution.slurm import _submitit_executor

    executor = _submitit_executor(None, tmp_path / "slurm", SlurmOptions(), 0, "actbench-x")
    command = executor._submitit_command_str
    assert command.split()[1:4] == ["-P", "-u", "-m"] and "submitit.core._submit" in command, command


# --- every other string that reaches the sbatch script --------------------------------------------
EXPERIMENT = ('name = "x"\ndescription = "x"\n[[steps]]\ncommand = "memory"\nmodels = ["resnet18"]\n'
              'strategies = ["fp32"]\ndevice = "meta"\nimage_size = 32\nbatch = "2"\n')


@pytest.mark.parametrize("name", ["o\ntouch /tmp/actbench-pwned", "o\r#SBATCH --qos=high", "o\x1b[2J", "o\x7f",
                                  "o\tx", "o\x00x"])
@pytest.mark.parametrize("command", ["memory", "run"])
def test_out_with_control_characters_never_reaches_the_sbatch_script(tmp_path: Path, slurm_path: Path,
                                                                     monkeypatch, command: str, name: str) -> None:
    """--out becomes the job array's log folder, an #SBATCH line: refused when the options are parsed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.toml").write_text(EXPERIMENT)
    args = ["run", str(tmp_path / "exp.toml")] if command == "run" else MEMORY
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(app, [*args, "--executor", "slurm", "--out", name])
    _one_line_refusal(result, repr(name))
    assert "control character" in result.stderr
    assert not slurm_path.exists(), "sbatch was called"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("folder, name", [("slurm\nreboot", "actbench-x"), ("slurm", "actbench-x\nreboot")])
def test_the_slurm_folder_and_job_name_are_checked_before_the_script_is_written(tmp_path: Path, slurm_path: Path,
                                                                                folder: str, name: str) -> None:
    """What the edge cannot see (a working directory of any name) is checked where the script is made."""
    from actbench.execution.slurm import SubmitError, _submitit_executor

    with pytest.raises(SubmitError, match="control character") as info:
        _submitit_executor(None, tmp_path / folder, SlurmOptions(), 0, name)
    assert "\n" not in str(info.value) and info.value.code == 2
    assert not (tmp_path / folder).exists()


@pytest.mark.parametrize("command", ["memory", "run"])
def test_a_failed_submission_is_one_line(tmp_path: Path, monkeypatch, command: str) -> None:
    """sbatch exits non-zero (a bad partition, a full queue): one line with what it said, exit 1."""
    marker = tmp_path / "slurm-called"
    tools = _fake_slurm(tmp_path / "bin", marker)
    (tools / "sbatch").write_text(f"#!/bin/sh\necho sbatch >> '{marker}'\n"
                                  "echo 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "exp.toml").write_text(EXPERIMENT)
    args = ["run", str(tmp_path / "exp.toml")] if command == "run" else MEMORY
    result = CliRunner().invoke(app, [*args, "--executor", "slurm", "--out", str(tmp_path / "out")])
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]  # run names its step too
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output, result.output
    assert len(errors) == 1 and "sbatch failed with status 1" in errors[0] and "invalid partition" in errors[0], errors
    assert errors[0].startswith("actbench: error: ") and result.stderr.strip().endswith(errors[0])
    assert marker.read_text() == "sbatch\n"
