"""The package's shape: one subpackage per pipeline stage, imports only running downward.

Reads every module's imports (function-level ones too) with `ast`, so the picture is what the
code says, not what a docstring claims. On failure the message prints the offending edges.
"""

import ast
from pathlib import Path

import networkx as nx

import toast_lab as tl

PACKAGE = Path(tl.__file__).parent

# DESIGN.md's pipeline: a stage may import itself and earlier stages only. `zoo` is input data
# and `progress` the listener any stage tells of its long steps (both import nothing of ours);
# `cli` and the package root sit on top.
STAGES = {
    "zoo": 0, "progress": 0, "program": 1, "rules": 2, "analysis": 3, "plan": 4, "cost": 6,
    "strategies": 7, "plan_search": 7, "verification": 9, "lab": 10, "cli": 11, "": 11,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("toast_lab"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("toast_lab"):
                continue
            for alias in node.names:  # `from . import _export` imports a module
                sub = f"{target}.{alias.name}"
                out.add(sub if _exists(sub) else target)
    return out


def _exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        g.add_node(module)
        for target in _imports(path, module):
            if target != module:
                g.add_edge(module, target)
    return g


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_subpackage_is_a_known_stage():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages <= set(STAGES), f"unknown stages: {subpackages - set(STAGES)}"
    for sub in subpackages:
        doc = ast.get_docstring(ast.parse((PACKAGE / sub / "__init__.py").read_text()))
        assert doc and len(doc) > 80, \
            f"toast_lab/{sub}/__init__.py must say what it takes and gives"


def test_imports_only_run_downward():
    g = _graph()
    upward = []
    for a, b in g.edges:
        sa, sb = _stage(a), _stage(b)
        if b == "toast_lab" and STAGES[sa] < STAGES["cli"]:  # the root reaches every stage
            upward.append((a, b))
        elif sb and STAGES[sb] > STAGES[sa]:
            upward.append((a, b))
    assert not upward, "imports from a later stage into an earlier one:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in sorted(upward))


def test_no_import_cycles_between_modules():
    g = _graph()
    # A package's __init__ re-exports its modules: those edges are not dependencies.
    deps = nx.DiGraph((a, b) for a, b in g.edges if not b.startswith(a + "."))
    cycles = list(nx.simple_cycles(deps))
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c + c[:1])
                                                      for c in cycles[:10])


def _private_imports(path: Path, module: str) -> list[str]:
    """Each import in `path` of a private module (`_name`) or a private name of another
    subpackage, as "module -> what" (the root package and cli count as one subpackage each)."""
    tree = ast.parse(path.read_text())
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            imported = [(target, a.name) for a in node.names]
        else:
            continue
        for target, name in imported:
            if not target.startswith("toast_lab") or _stage(target) == _stage(module):
                continue
            if name is not None and _exists(f"{target}.{name}"):  # `from ..plan import _x`
                target, name = f"{target}.{name}", None
            parts = target.split(".")[1:] + ([name] if name else [])
            if any(p.startswith("_") for p in parts):
                found.append(f"{module} -> {target}" + (f".{name}" if name else ""))
    return found


def test_no_private_import_across_subpackages():
    """A subpackage's `__init__` says what it offers the others; what it keeps private stays
    so (its `_modules` and `_names` can change without another stage noticing)."""
    found = [line for path in sorted(PACKAGE.rglob("*.py"))
             for line in _private_imports(path, _module_name(path))]
    assert not found, ("private names imported from another subpackage (make them public "
                       "in that subpackage's __init__ and import them from there):\n"
                       + "\n".join(f"  {line}" for line in found))


# The cost model reads as small rooms: a module is one concern, a function one step. Lines as
# `ast` counts them (a function from its `def` line to its last line, decorators apart).
COST_PACKAGE = PACKAGE / "cost"
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 85


def _size_offenders(paths, max_module: int, max_function: int) -> list[str]:
    """Each module of `paths` over `max_module` lines and each function over `max_function`,
    as "path: N lines" and "path:line name: N lines"."""
    found = []
    for path in paths:
        text = path.read_text()
        if len(text.splitlines()) > max_module:
            found.append(f"{path}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > max_function:
                    found.append(f"{path}:{node.lineno} {node.name}: {length} lines")
    return found


def test_cost_model_modules_and_functions_are_small():
    paths = sorted(COST_PACKAGE.rglob("*.py"))  # the numba kernel (cost/_kernel) too
    assert any(p.parent.name == "_kernel" for p in paths)
    found = _size_offenders(paths, MAX_MODULE_LINES, MAX_FUNCTION_LINES)
    assert not found, (f"cost model modules over {MAX_MODULE_LINES} lines or functions over "
                       f"{MAX_FUNCTION_LINES} (split them by concern):\n"
                       + "\n".join(f"  {line}" for line in found))


def test_size_offenders_counts_modules_and_functions(tmp_path):
    small = tmp_path / "small.py"
    small.write_text("def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(5)))
    method = tmp_path / "method.py"
    method.write_text("class C:\n    def m(self):\n"
                      + "".join(f"        x{i} = {i}\n" for i in range(5)))
    assert _size_offenders([small], 6, 6) == []
    assert _size_offenders([small], 5, 6) == [f"{small}: 6 lines"]
    assert _size_offenders([small], 6, 5) == [f"{small}:1 f: 6 lines"]
    assert _size_offenders([method], 100, 5) == [f"{method}:2 m: 6 lines"]
