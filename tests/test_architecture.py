"""The seams of docs/design.md §7 hold: a torch-free schema, one strategy registry, device profiles.

Each test here fails when someone reintroduces what the design removed: torch loaded by reading
results, a strategy list spelled outside the registry, a device name branched on outside
``actbench/core/devices.py``, an import cycle.
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
    code = ("import sys\nimport actbench.reporting.report, actbench.reporting.plots, actbench.reporting.analysis, "
            "actbench.reporting.runs, actbench.reporting.scale, actbench.reporting.speed, actbench.reporting.claims, "
            "actbench.reporting.throughput_figure, actbench.reporting.style, actbench.reporting.markdown, actbench.schema, "
            "actbench.store.results, actbench.store.reading, actbench.store.outputs, actbench.strategies, "
            "actbench.core.devices, actbench.store.accuracy_rows\n"
            "print('torch' in sys.modules)")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_finding_the_committed_runs_of_both_kinds_does_not_import_torch() -> None:
    """``plot`` and ``report`` find harness rows and accuracy rows (results/cpu holds the latter)."""
    results = PACKAGE.parent / "results"
    code = ("import sys\nfrom pathlib import Path\nfrom actbench.reporting.runs import find_result_runs\n"
            f"found = find_result_runs(Path({str(results)!r}))\n"
            "print(bool(found.accuracy), bool(found.harness), 'torch' in sys.modules)")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True True False"


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
    from actbench.execution.parsing import parse_strategies
    from actbench.reporting.plots import PALETTE

    assert parse_strategies(",".join(strategies.ALL_STRATEGIES)) == strategies.ALL_STRATEGIES
    for name in strategies.ALL_STRATEGIES:
        assert PALETTE[name] == strategies.colour(name)


DEVICE_NAMES = {"cpu", "cuda", "meta"}


def _names_a_device(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.partition(":")[0] in DEVICE_NAMES
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_a_device(e) for e in node.elts)


def _device_branches(tree: ast.AST) -> list[tuple[int, str]]:
    """Every decision on a device's name: comparisons and membership either way round, prefix tests,
    match cases, tables keyed by device names, and the tensor attributes ``is_cuda``/``is_cpu``/``is_meta``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = any(_names_a_device(x) for x in (node.left, *node.comparators))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = node.func.attr in ("startswith", "endswith") and any(_names_a_device(a) for a in node.args)
        elif isinstance(node, ast.match_case):
            hit = isinstance(node.pattern, ast.MatchValue) and _names_a_device(node.pattern.value)
        elif isinstance(node, ast.Dict):
            hit = any(k is not None and _names_a_device(k) for k in node.keys)
        else:
            hit = isinstance(node, ast.Attribute) and node.attr in ("is_cuda", "is_cpu", "is_meta")
        if hit:
            where = node.pattern if isinstance(node, ast.match_case) else node
            found.append((where.lineno, ast.unparse(where)[:100]))
    return sorted(found)


def test_device_branch_finder_sees_every_form() -> None:
    code = ("a = d == 'cuda'\nb = 'cpu' in devices\nc = name in ('cpu', 'meta')\nd = n.startswith('cuda')\n"
            "match n:\n    case 'meta':\n        pass\ne = {'cuda': 1}[n]\nf = t.is_meta\ng = t.to('cpu')\n")
    assert [line for line, _ in _device_branches(ast.parse(code))] == [1, 2, 3, 4, 6, 8, 9]


def test_no_device_name_branching_outside_the_device_profiles() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "devices.py":
            continue
        for lineno, code in _device_branches(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {code}")
    assert not offenders, "device branching outside actbench/core/devices.py:\n" + "\n".join(offenders)


#: What turns a strategy, device or GPU name into its object (registries' own helpers included).
LOOKUPS = {"profile", "PROFILES", "gpu_spec", "GPU_SPECS", "gpu_speed_model",
           "selected_device_model", "get", "get_strategy", "cuda_alloc_conf", "is_actnn_level", "canonical",
           "task_of"}
#: The edges, where names come in: the command line, experiment files, a spec and its parser, the
#: worker (a point arrives there as JSON), the one resolution of a point, the registries themselves
#: (and the model-name check every command runs first), and what reads names back from result files
#: or runs commands of its own (kernels, calibration).
EDGES = ("cli/", "experiments.py", "execution/specs.py", "execution/parsing.py", "worker.py", "planning/point.py",
         "core/devices.py", "core/gpus.py", "strategies/", "training/tasks/", "training/model_names.py",
         "planning/device_models.py", "store/", "reporting/",
         "kernels/bench.py", "measure/calibrate.py", "measure/host_probes.py", "studies/")


def _name_lookups(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls and subscripts of a lookup: ``profile(name)``, ``strategies.get(name)``, ``PROFILES[name]``."""
    found = []
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else node.value if isinstance(node, ast.Subscript) else None
        if target is None:
            continue
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        receiver = ast.unparse(target.value) if isinstance(target, ast.Attribute) else ""
        if name in LOOKUPS and (name != "get" or receiver in ("strategies", "registry")):
            found.append((node.lineno, ast.unparse(node)[:100]))
    return sorted(found)


def test_name_lookup_finder_sees_calls_and_tables() -> None:
    code = ("a = profile(point.device)\nb = strategies.get(name).order\nc = PROFILES[d].predicts\n"
            "d = options.get('x')\ne = point.device.predicts\nf = gpu_spec(g)\n")
    assert [line for line, _ in _name_lookups(ast.parse(code))] == [1, 2, 3, 6]


def test_below_the_edge_nothing_looks_a_strategy_device_or_gpu_up_by_name() -> None:
    """A point is resolved once (planning/point.py, or a command's spec); every layer below receives
    the objects, so no module between the edge and the training step parses a name again."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(EDGES):
            continue
        for lineno, code in _name_lookups(ast.parse(path.read_text())):
            offenders.append(f"actbench/{rel}:{lineno}: {code}")
    assert not offenders, "names looked up below the edge:\n" + "\n".join(offenders)


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        modules[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return modules


def _module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """actbench modules a module imports anywhere, lazily inside functions too (TYPE_CHECKING aside).

    ``from pkg import sub`` depends on the submodule ``sub`` when it is one, on ``pkg`` otherwise."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("actbench"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("actbench"))
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _module_imports(path, modules) if m in modules and m != name}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan): every import cycle, any length."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_sees_long_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"a"}, "e": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "d"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_of_any_length() -> None:
    """Lazy imports count: a module imported inside a function still has to be importable first."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_type_checking_imports_name_existing_modules() -> None:
    modules = _modules()
    missing = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for inner in ast.walk(node):
                    if (isinstance(inner, ast.ImportFrom) and inner.module and inner.module.startswith("actbench")
                            and inner.module not in modules):
                        missing.append(f"{name}: {inner.module}")
    assert not missing, f"TYPE_CHECKING imports of modules that do not exist: {missing}"


def test_code_cites_only_files_in_the_repository() -> None:
    root = PACKAGE.parent
    stale = [f"{p.relative_to(root)}" for p in [*PACKAGE.rglob("*.py"), *(root / "csrc").rglob("*.*"),
                                               *(root / "tests").glob("*.py"), *(root / "scripts").glob("*")]
             if p.is_file() and re.search(r"(?<![/\w])DESIGN\.md", p.read_text(errors="replace"))]
    assert not stale, f"cite docs/design.md, not a file outside the repository: {stale}"
    assert (root / "docs" / "design.md").is_file()


def test_results_readme_lists_the_registered_strategies() -> None:
    from actbench import strategies

    text = (PACKAGE.parent / "results" / "README.md").read_text()
    block = text.split("<!-- strategies:begin -->\n", 1)[1].split("\n<!-- strategies:end -->", 1)[0]
    assert block == strategies.markdown_table(), "regenerate with actbench.strategies.markdown_table()"


#: private names that PyTorch documents for use (the fake kernels' shape checks)
_DOCUMENTED_PRIVATE = re.compile(r"_check(_\w+)?$")


def _torch_aliases(tree: ast.AST) -> dict[str, str]:
    """Module-level names bound to a torch attribute chain (``_aten = torch.ops.aten``) -> that chain."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            dotted = ast.unparse(node.value)
            if dotted.split(".")[0] == "torch" and re.fullmatch(r"[\w.]+", dotted):
                aliases[node.targets[0].id] = dotted
    return aliases


def _private_torch_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every private torch name a module reaches: imports, attribute chains
    (through aliases too), and ``getattr``/``hasattr`` on torch by a private or computed name."""
    uses = []
    aliases = _torch_aliases(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # report whole chains once

    def torch_chain(node: ast.AST) -> str | None:
        dotted = ast.unparse(node)
        if not re.fullmatch(r"[\w.]+", dotted):
            return None
        head, _, rest = dotted.partition(".")
        dotted = aliases[head] + ("." + rest if rest else "") if head in aliases else dotted
        return dotted if dotted.split(".")[0] == "torch" else None

    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "torch"]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = torch_chain(node)
            names = [dotted] if dotted else []
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and torch_chain(node.args[0])):
            name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "_<computed>"
            names = [f"{torch_chain(node.args[0])}.{name}"]
        private = [n for n in names if any(p.startswith("_") and not p.endswith("__")
                                           and not _DOCUMENTED_PRIVATE.fullmatch(p) for p in n.split(".")[1:])]
        if private:
            uses.append((node.lineno, private[-1]))
    return uses


def test_private_torch_finder_sees_imports_and_attributes() -> None:
    code = ("import torch._dynamo\nfrom torch.utils._pytree import tree_map\nx = torch._C._nn.avg_pool2d\n"
            "y = torch.ops.aten._softmax_backward_data\ntorch._check(True)\nz = torch.nn.functional.relu\n"
            "a = torch.ops.aten\nb = a._convolution\nc = getattr(a, '_efficient')\nd = [getattr(a, n) for n in m]\n"
            "e = a.convolution\nf = getattr(torch.nn, 'Conv2d')\n")
    assert [line for line, _ in _private_torch_uses(ast.parse(code))] == [1, 2, 3, 4, 8, 9, 10]


def test_no_private_torch_api_outside_compat() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "compat.py":
            continue
        for lineno, name in _private_torch_uses(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {name}")
    assert not offenders, "private torch API outside actbench/core/compat.py:\n" + "\n".join(sorted(set(offenders)))


def _option_types() -> list[tuple[str, str, type]]:
    """(command, parameter, its type without Annotated/Optional) of every CLI command."""
    import enum
    import types
    import typing

    from actbench.cli import app

    found = []
    for info in app.registered_commands:
        hints = typing.get_type_hints(info.callback, include_extras=True)
        for name, hint in hints.items():
            if name == "return":
                continue
            if typing.get_origin(hint) is typing.Annotated:
                hint = typing.get_args(hint)[0]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
                hint = args[0]
            command = info.name or info.callback.__name__.replace("_", "-")
            found.append((command, name, hint if isinstance(hint, type) else object))
    assert any(isinstance(t, type) and issubclass(t, enum.Enum) for _, _, t in found)
    return found


def test_an_option_that_is_a_choice_anywhere_is_a_choice_everywhere() -> None:
    """``--device`` (and every other option offered as a fixed set somewhere) is an enum in every command,
    so ``--help`` lists the values and a wrong one gets a one-line error naming them."""
    import enum

    options = _option_types()
    choices = {name for _, name, t in options if issubclass(t, enum.Enum)}
    plain = sorted(f"{command} --{name.replace('_', '-')}" for command, name, t in options
                   if name in choices and not issubclass(t, enum.Enum))
    assert "device" in choices
    assert not plain, f"options that are a fixed set elsewhere but plain strings here: {plain}"


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
    """Each op's fake kernel is a module-level function of actbench/kernels/ops.py, named in its table of
    fakes, and checks shapes and dtypes with torch._check (itself or through a helper there)."""
    from actbench.kernels import ops

    tree = ast.parse((PACKAGE / "kernels" / "ops.py").read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    table = next((n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                  and any(isinstance(t, ast.Name) and t.id == "_FAKES" for t in
                          (n.targets if isinstance(n, ast.Assign) else [n.target]))), None)
    assert isinstance(table, ast.Dict), "actbench/kernels/ops.py needs a _FAKES table: op name -> fake kernel"
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


def test_prose_speaks_of_the_project_not_of_how_work_was_filed() -> None:
    """Code, tests, scripts and docs explain themselves: no pointers to filed work or its numbered parts,
    and modules are modules (the words are assembled here so that this file does not hold them)."""
    words = re.compile(r"\b(" + "iss" + r"ues?|it" + r"em \d+|it" + r"ems \d+|ro" + r"oms?)\b", re.I)
    root = PACKAGE.parent
    files = [*PACKAGE.rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "scripts").glob("*"),
             *(root / "csrc").rglob("*.*"), *(root / "docs").glob("*.md"), *(root / "experiments").glob("*.toml"),
             root / "README.md", root / "results" / "README.md"]
    found = [f"{p.relative_to(root)}:{n}: {line.strip()[:80]}" for p in files if p.is_file()
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if words.search(line)]
    assert not found, "\n".join(found)


#: what a module and a function may grow to before they are split (docs/design.md §7)
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_TOP_LEVEL_MODULES = 500, 60, 5


def _long_functions(tree: ast.AST, limit: int) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function or method longer than ``limit`` lines, nested ones too."""
    return [(node.lineno, node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_long_function_finder_measures_nested_functions() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    code = f"class A:\n    def f(self):\n{body}\n        return 1\n\ndef g():\n    return 2\n"
    assert [(line, name) for line, name, _ in _long_functions(ast.parse(code), 60)] == [(2, "f")]


def test_modules_and_functions_stay_small_and_the_package_top_shows_only_entry_points() -> None:
    """Modules of at most 500 lines, functions of at most 60, and at most five modules at the top of
    actbench/ (entry points and the torch-free schema): a layer's parts each do one thing."""
    big, long = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            big.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
        long += [f"{path.relative_to(PACKAGE.parent)}:{line}: {name} ({n} lines)"
                 for line, name, n in _long_functions(ast.parse(text), MAX_FUNCTION_LINES)]
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert not big, "modules over 500 lines:\n" + "\n".join(big)
    assert not long, "functions over 60 lines:\n" + "\n".join(long)
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
