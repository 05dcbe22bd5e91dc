"""The floors of the house: nothing imports upward, no module imports itself back.

Floors (README, "Layout of the repository"): 1 core (``layouts/``, ``dispatch/``), 2 backends
(``impls/``), 3 the tuner and the applications on it (``tuner/``: candidates, measurement,
optimisation, validation, the store, reports, the plan source, the CLI). An edge from a lower
floor to a higher one fails, whether the import is at module level, inside a function or under
``TYPE_CHECKING``. Import cycles between modules fail too (imports under ``TYPE_CHECKING`` are
not executed and are left out of the cycle check). Then the behaviour those rules buy: the core
imports and runs an untuned plan with the tuner made unimportable.
"""

from __future__ import annotations

import ast
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


def _edges() -> dict[str, list[tuple[str, int, bool]]]:
    edges: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)
    for module, path in MODULES.items():
        for name, line, typing_only in _imports(path):
            target = _resolve(name)
            if target and target != module:
                edges[module].append((target, line, typing_only))
    return edges


def test_the_walk_sees_the_packages():
    assert {"dispatch.session", "dispatch.plan", "tuner.tune", "layouts.registry"} <= set(MODULES)
    assert any(t == "dispatch.errors" for t, _, _ in _edges()["layouts.registry"])


def test_nothing_imports_a_higher_floor():
    upward = []
    for module, targets in _edges().items():
        floor = FLOORS[module.split(".")[0]]
        for target, line, _ in targets:
            if FLOORS[target.split(".")[0]] > floor:
                upward.append(f"{_where(MODULES[module])}:{line} imports {target}")
    assert not upward, "imports that go up a floor:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = {m: {t for t, _, typing_only in targets if not typing_only}
             for m, targets in _edges().items()}
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

    for module in MODULES:
        if module not in index:
            strongly_connect(module)
    assert not cycles, f"modules that import each other (directly or around a loop): {cycles}"


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
