"""The seams of docs/design.md §7 hold: a torch-free schema, one strategy registry, device profiles.

Each test here fails when someone reintroduces what the design removed: torch loaded by reading
results, a strategy list spelled outside the registry, a device name branched on outside
``actbench/devices.py``, an import cycle.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "actbench"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_reading_and_plotting_results_does_not_import_torch() -> None:
    code = ("import sys\nimport actbench.report, actbench.plots, actbench.analysis, actbench.schema, "
            "actbench.results, actbench.strategies, actbench.devices\n"
            "print('torch' in sys.modules)")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_result_row_is_composed_from_point_and_measurement() -> None:
    from dataclasses import fields

    from actbench.schema import COLUMNS, Measurement, ModelSpec, PointConfig, ResultRow

    names = [f.name for f in fields(ResultRow)]
    assert tuple(names) == COLUMNS
    assert {f.name for f in fields(Measurement)} <= set(names)
    point = PointConfig(ModelSpec("resnet152", extra_blocks=3), "L3", 8, 64, "meta", budget_bytes=10)
    row = ResultRow.build(point, Measurement("ok", peak_alloc_bytes=5), "run", "env")
    assert (row.model, row.extra_blocks, row.strategy, row.batch_size, row.image_size, row.device,
            row.budget_bytes, row.peak_alloc_bytes, row.key) == ("resnet152", 3, "L3", 8, 64, "meta", 10, 5,
                                                                 point.key())
    # the key of a point is what resumes committed runs: its recipe must not drift
    assert PointConfig(ModelSpec("resnet18"), "fp32", 2, 32, "cpu").key() == "5f07a606d92fe6d3"


def test_registry_lists_every_strategy_in_table_order_with_what_it_needs() -> None:
    from actbench import strategies
    from actbench.actnn.levels import level_config

    assert strategies.ALL_STRATEGIES[:3] == ("fp32", "swap", "checkpoint")
    assert strategies.ALL_STRATEGIES[3:9] == strategies.LEVEL_NAMES
    for name, s in strategies.registered().items():
        assert s.name == name and s.description and re.fullmatch(r"#[0-9a-f]{6}", s.colour), name
    # the level strategies declare what their LevelConfig says (allocator setting, host memory)
    for level in strategies.LEVEL_NAMES:
        cfg, s = level_config(level), strategies.get(level)
        assert s.cuda_alloc_conf == cfg.cuda_alloc_conf and s.uses_host_memory == cfg.swap, level
    assert strategies.get("L5").same_on_meta_as == "L4"
    with pytest.raises(ValueError, match="unknown strategy 'fp64'; known: fp32, swap"):
        strategies.get("fp64")


def test_cli_choices_and_plot_colours_come_from_the_registry() -> None:
    from actbench import strategies
    from actbench.parsing import parse_strategies
    from actbench.plots import PALETTE

    assert parse_strategies(",".join(strategies.ALL_STRATEGIES)) == strategies.ALL_STRATEGIES
    for name in strategies.ALL_STRATEGIES:
        assert PALETTE[name] == strategies.colour(name)


_DEVICE_BRANCH = re.compile(r"""(==|!=|\bin\b|\bis\b)\s*\(?\s*["'](cpu|cuda|meta)["']|["'](cpu|cuda|meta)["']\s*(==|!=)""")


def test_no_device_name_branching_outside_the_device_profiles() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "devices.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _DEVICE_BRANCH.search(code):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {line.strip()}")
    assert not offenders, "device branching outside actbench/devices.py:\n" + "\n".join(offenders)


def _module_imports(path: Path) -> set[str]:
    """actbench modules imported anywhere in a module, lazily inside functions too (TYPE_CHECKING aside)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("actbench"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("actbench"))
    return found


def test_no_import_cycles_between_modules() -> None:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = path
    graph = {name: {m for m in _module_imports(path) if m in modules and m != name} for name, path in modules.items()}
    # a package imports its own submodules to re-export them; that is not a cycle between peers
    cycles = []
    for a, deps in graph.items():
        for b in deps:
            if a in graph.get(b, ()) and not (b.startswith(a + ".") or a.startswith(b + ".")):
                cycles.append(tuple(sorted((a, b))))
    assert not sorted(set(cycles)), f"import cycles: {sorted(set(cycles))}"


def test_code_cites_only_files_in_the_repository() -> None:
    root = PACKAGE.parent
    stale = [f"{p.relative_to(root)}" for p in [*PACKAGE.rglob("*.py"), *(root / "csrc").rglob("*.*"),
                                               *(root / "tests").glob("*.py"), *(root / "scripts").glob("*")]
             if re.search(r"(?<![/\w])DESIGN\.md", p.read_text(errors="replace"))]
    assert not stale, f"cite docs/design.md, not a file outside the repository: {stale}"
    assert (root / "docs" / "design.md").is_file()


def test_results_readme_lists_the_registered_strategies() -> None:
    from actbench import strategies

    text = (PACKAGE.parent / "results" / "README.md").read_text()
    block = text.split("<!-- strategies:begin -->\n", 1)[1].split("\n<!-- strategies:end -->", 1)[0]
    assert block == strategies.markdown_table(), "regenerate with actbench.strategies.markdown_table()"


def _calls(node: ast.AST) -> set[str]:
    """Dotted names of every function a node calls (``torch._check``, ``_check_fake_input``)."""
    names = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        f, parts = call.func, []
        while isinstance(f, ast.Attribute):
            parts.append(f.attr)
            f = f.value
        if isinstance(f, ast.Name):
            names.add(".".join([f.id, *reversed(parts)]))
    return names


def test_every_op_has_a_fake_kernel_in_ops_that_checks_its_arguments() -> None:
    """Each op's fake kernel is a module-level function of actbench/ops.py, named in its table of
    fakes, and checks shapes and dtypes with torch._check (itself or through a helper there)."""
    from actbench import ops

    tree = ast.parse((PACKAGE / "ops.py").read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    table = next((n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                  and any(isinstance(t, ast.Name) and t.id == "_FAKES" for t in
                          (n.targets if isinstance(n, ast.Assign) else [n.target]))), None)
    assert isinstance(table, ast.Dict), "actbench/ops.py needs a _FAKES table: op name -> fake kernel"
    fakes = {k.value: v.id for k, v in zip(table.keys, table.values)}
    assert set(fakes) == set(ops.OPS), f"ops without a fake kernel: {sorted(set(ops.OPS) - set(fakes))}"

    def checks(name: str, depth: int = 2) -> bool:
        called = _calls(functions[name])
        return "torch._check" in called or depth > 0 and any(
            c in functions and checks(c, depth - 1) for c in called)

    unchecked = [op for op, fn in fakes.items() if fn not in functions or not checks(fn)]
    assert not unchecked, f"fake kernels that check nothing with torch._check: {unchecked}"


def _switch_bodies(text: str) -> list[tuple[int, str]]:
    """(line, body) of every ``switch (...) { ... }`` in C++/CUDA source, braces matched."""
    out = []
    for m in re.finditer(r"\bswitch\s*\(", text):
        start = text.index("{", m.end())
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        out.append((text.count("\n", 0, m.start()) + 1, text[start + 1:i]))
    return out


def test_every_dtype_switch_in_csrc_fails_loudly_by_default() -> None:
    """A switch over a dtype (or mask) code names every case and fails in ``default:`` -- with
    TORCH_CHECK(false, ...) in torch code, an error code in the CUDA launchers (turned into one) --
    instead of running some other dtype's loop on an unknown code."""
    root = PACKAGE.parent / "csrc"
    quiet = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".cpp", ".cu", ".h"):
            continue
        for line, body in _switch_bodies(path.read_text()):
            tail = body.split("default:", 1)[1] if "default:" in body else ""
            first = tail.split(";", 1)[0]
            if not re.search(r"TORCH_CHECK\(\s*false|return\s+cudaError", first):
                quiet.append(f"{path.relative_to(root.parent)}:{line}")
    assert not quiet, f"switches whose default does not fail loudly: {quiet}"
