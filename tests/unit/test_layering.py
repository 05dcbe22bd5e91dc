"""The floors of the house: nothing imports upward, no module imports itself back.

Floors (README, "Layout of the repository"): 1 core (``layouts/``, ``dispatch/``), 2 backends
(``impls/``), 3 the tuner and the applications on it (``tuner/``: candidates, measurement,
optimisation, validation, the store, reports, the plan source, the CLI). An edge from a lower
floor to a higher one fails, whether the import is at module level, inside a function or under
``TYPE_CHECKING``. Import cycles between modules fail too, counting every import statement (module
level, inside functions and under ``TYPE_CHECKING``: a type-only tie is still a tie) and the package
``__init__`` each import runs: importing ``a.b.c`` from module ``m`` runs ``a/__init__`` and
``a/b/__init__``, except the packages above ``m``, which are already running. Within the core,
``layouts`` sits below ``dispatch`` and imports nothing from it. Then the behaviour those rules
buy: the core imports and runs an untuned plan with the tuner made unimportable.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = {"layouts": 1, "dispatch": 1, "impls": 2, "tuner": 3}
#: The largest module the house allows (lines); a module above it holds more than one concept.
MAX_MODULE_LINES = 600
#: The longest line (characters): ruff's ``line-length`` in pyproject.toml.
MAX_LINE_CHARS = 110


def _modules() -> dict[str, Path]:
    out = {}
    for package in FLOORS:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, under TYPE_CHECKING)`` for every absolute import in ``path``."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno, typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((f"{node.module}.{a.name}", node.lineno, typing_only) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(path.read_text()), False)
    return found


def _packages_above(module: str) -> list[str]:
    """The packages whose ``__init__`` importing ``module`` runs, outermost first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _edges() -> dict[str, list[tuple[str, int, bool]]]:
    """Every module an import in each module runs: the imported module and the package
    ``__init__``s above it, less the packages above the importer (already running)."""
    edges: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)
    for module, path in MODULES.items():
        running = {module, *_packages_above(module)}
        seen: set[tuple[str, int]] = set()
        for name, line, typing_only in _imports(path):
            target = _resolve(name)
            if target is None:
                continue
            for runs in [*_packages_above(target), target]:
                if runs in MODULES and runs not in running and (runs, line) not in seen:
                    seen.add((runs, line))
                    edges[module].append((runs, line, typing_only))
    return edges


def test_the_walk_sees_the_packages():
    assert {"dispatch.session", "dispatch.plan", "tuner.tune", "layouts.registry"} <= set(MODULES)
    assert any(t == "dispatch.registry" for t, _, _ in _edges()["dispatch.session"])


def test_nothing_imports_a_higher_floor():
    upward = []
    for module, targets in _edges().items():
        floor = FLOORS[module.split(".")[0]]
        for target, line, _ in targets:
            if FLOORS[target.split(".")[0]] > floor:
                upward.append(f"{_where(MODULES[module])}:{line} imports {target}")
    assert not upward, "imports that go up a floor:\n" + "\n".join(upward)


def _cycles(edges: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    graph = {m: {t for t, _, _ in targets} for m, targets in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongly_connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongly_connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            strongly_connect(module)
    return sorted(cycles)


def test_no_import_cycles():
    edges = _edges()
    cycles = _cycles(edges)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(f"{len(component)} modules: {component}")
        lines.extend(f"    {_where(MODULES[m])}:{line} imports {t}" for m in component
                     for t, line, _ in edges.get(m, ()) if t in members)
    assert not cycles, "modules that import each other (directly or around a loop):\n" + "\n".join(lines)


def test_the_cycle_walk_counts_type_checking_function_level_and_package_imports(tmp_path, monkeypatch):
    """A tie under ``TYPE_CHECKING``, one inside a function and one through a package
    ``__init__`` each close a loop; importing one's own package does not."""
    low, high, pkg, sub = (tmp_path / f"{n}.py" for n in ("low", "high", "pkg", "sub"))
    low.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dispatch.high import H\n")
    high.write_text("def f():\n    from dispatch.low import L\n    return L\n")
    pkg.write_text("from dispatch.pkg.sub import S\n")
    sub.write_text("from dispatch.pkg import S\nfrom dispatch.pkg.low2 import X\n")
    (tmp_path / "low2.py").write_text("from dispatch.pkg.sub import S\n")
    for name, path in {"dispatch.low": low, "dispatch.high": high, "dispatch.pkg": pkg,
                       "dispatch.pkg.sub": sub, "dispatch.pkg.low2": tmp_path / "low2.py"}.items():
        monkeypatch.setitem(MODULES, name, path)
    cycles = _cycles(_edges())
    assert ["dispatch.high", "dispatch.low"] in cycles
    assert ["dispatch.pkg.low2", "dispatch.pkg.sub"] in cycles
    assert not [c for c in cycles if "dispatch.pkg" in c]


def test_a_cross_package_import_runs_the_package_init(tmp_path, monkeypatch):
    """``from dispatch.errors import X`` in ``layouts`` runs ``dispatch/__init__``: an edge to it."""
    bad = tmp_path / "bad.py"
    bad.write_text("from dispatch.errors import DispatchError\n")
    monkeypatch.setitem(MODULES, "layouts.bad", bad)
    assert {t for t, _, _ in _edges()["layouts.bad"]} == {"dispatch", "dispatch.errors"}


def test_no_module_takes_a_name_from_its_own_package():
    """``from dispatch import Session`` inside ``dispatch`` reads a half-run ``__init__``: the loop
    the package walk leaves out (the package is already running). Submodules are fine."""
    found = []
    for module, path in MODULES.items():
        above = set(_packages_above(module))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in above:
                found.extend(f"{_where(path)}:{node.lineno} takes {node.module}.{a.name}"
                             for a in node.names if f"{node.module}.{a.name}" not in MODULES)
    assert not found, "names taken from a package that is still running:\n" + "\n".join(found)


def test_layouts_imports_nothing_from_dispatch():
    """``layouts`` is the floor below ``dispatch``: the errors both need live in ``layouts``."""
    up = [f"{_where(MODULES[m])}:{line} imports {t}" for m, targets in _edges().items()
          if m.split(".")[0] == "layouts" for t, line, _ in targets if t.split(".")[0] == "dispatch"]
    assert not up, "layouts imports dispatch:\n" + "\n".join(up)


def test_a_seeded_upward_import_is_caught(tmp_path, monkeypatch):
    """The walk is not vacuous: a core module with a function-level tuner import is flagged."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tuner.store import PlanStore\n    return PlanStore\n")
    assert [(n, t) for n, _, t in _imports(bad)] == [("tuner.store.PlanStore", False)]
    monkeypatch.setitem(MODULES, "dispatch.bad", bad)
    with pytest.raises(AssertionError, match=r"bad.py:2 imports tuner.store"):
        test_nothing_imports_a_higher_floor()


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_module_is_a_hall(package):
    long = {_where(p): n for m, p in MODULES.items() if m.split(".")[0] == package
            and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_product_line_is_longer_than_110_characters():
    """Every line of ``dispatch``, ``layouts``, ``impls`` and ``tuner`` fits ruff's line-length,
    checked here as well, so that a run of the tests alone catches a long line."""
    long = [f"{_where(p)}:{k} ({len(line)} characters)" for p in MODULES.values()
            for k, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_LINE_CHARS]
    assert not long, f"lines over {MAX_LINE_CHARS} characters:\n" + "\n".join(long)


def test_a_seeded_long_line_is_caught(tmp_path, monkeypatch):
    """The line check is not vacuous: a core module with a 116-character line is flagged."""
    wide = tmp_path / "wide.py"
    wide.write_text("x = 1\n" + "y = '" + "a" * 110 + "'\n")
    monkeypatch.setitem(MODULES, "dispatch.wide", wide)
    with pytest.raises(AssertionError, match=r"wide.py:2 \(116 characters\)"):
        test_no_product_line_is_longer_than_110_characters()


def test_the_core_runs_an_untuned_plan_without_the_tuner(tmp_path):
    """``tuner`` made unimportable: ``import dispatch`` and a Session on an untuned plan work,
    the Session says why no stored plan was looked up, and nothing of the tuner was loaded."""
    code = textwrap.dedent("""
        import sys
        class NoTuner:
            def find_spec(self, name, path=None, target=None):
                if name == "tuner" or name.startswith("tuner."):
                    raise ImportError(f"{name} is made unimportable by this test")
                return None
        sys.meta_path.insert(0, NoTuner())
        import numpy as np
        import dispatch
        from dispatch.zoo import light_model
        model = light_model("squeezenet")
        sess = dispatch.Session(model, backends=["numpy"])
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
        assert y.shape == (1, 1000, 1, 1), y.shape
        assert sess.plan_source == "heuristic", sess.plan_source
        assert "no plan source" in sess.plan_note, sess.plan_note
        assert not [m for m in sys.modules if m == "tuner" or m.startswith("tuner.")]
        try:
            dispatch.Session(model, backends=["numpy"], require_plan=True)
        except Exception as exc:
            assert "needs a plan store" in str(exc) and "plan source" in str(exc), exc
        else:
            raise AssertionError("require_plan=True without a plan source did not raise")
        print("ok", sess.plan_note)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok")


def test_importing_layouts_loads_neither_the_session_nor_the_tuner():
    code = ("import sys, layouts\n"
            "loaded = [m for m in ('dispatch.session', 'tuner', 'pandas', 'onnx') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_layouts_first_sets_the_openblas_default_dispatch_sets():
    """``layouts`` imports nothing from ``dispatch``, yet a program that imports it (and so
    numpy) first gets the OpenBLAS default :data:`dispatch.blas.BLAS_SPIN_ENV` all the same."""
    from dispatch.blas import BLAS_SPIN_ENV

    code = ("import os, sys, layouts.registry\n"
            "assert 'numpy' in sys.modules and 'dispatch' not in sys.modules, sorted(sys.modules)\n"
            f"assert os.environ.get({BLAS_SPIN_ENV[0]!r}) == {BLAS_SPIN_ENV[1]!r}\n")
    env = {k: v for k, v in os.environ.items() if k != BLAS_SPIN_ENV[0]}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr
