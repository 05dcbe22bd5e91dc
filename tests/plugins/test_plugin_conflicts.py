"""Conflicting backends are never both active; which one lost, to whom and why is reported.

The rule (dispatch/backend.py): ranked by the configured backend order, those outside it after
those in it, ties in discovery order; in rank order a backend that conflicts with an accepted
one loses; a winner whose register() fails is not active and its losers get their turn; a
backend already registered is never displaced.
"""

from __future__ import annotations

import itertools

import pytest

from dispatch.backend import Backend, _activate, load_registry
from tests.plugins.plugin_support import write_module
from tuner.cli import main

DOUBLE = """
    from dispatch.backend import Backend
    from dispatch.registry import ImplTable

    table = ImplTable({name!r})

    @table.register("Relu", "double")
    def _relu(node):
        return lambda x: x.clip(0)

    class Double(Backend):
        name = {name!r}
        conflicts = {conflicts!r}

        def version(self):
            return {name!r} + " 1"

        def register(self, registry):
            if {fail!r}:
                raise RuntimeError("cannot open device")
            registry.add_table(table)

    OPDISPATCH_BACKENDS = [Double]
"""


def _double(folder, name, conflicts=(), fail=False, file=None):
    write_module(folder, file or f"{name}.py",
                 DOUBLE.format(name=name, conflicts=tuple(conflicts), fail=fail))


def _active(reg, names):
    return {n for n in names if reg.backends[n].available}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("OPDISPATCH_BACKENDS", "native,numpy")
    return tmp_path / "plugins"


def test_neither_in_the_order_first_found_wins(folder):
    _double(folder, "alpha")
    _double(folder, "beta", conflicts=["alpha"])
    reg = load_registry(str(folder), fresh=True)
    assert _active(reg, ["alpha", "beta"]) == {"alpha"}
    beta = reg.backends["beta"]
    assert beta.lost_to == "alpha" and beta.implementations == 0
    assert beta.reason.startswith("conflicts with active backend 'alpha' (found first): "
                                  "'beta' declares a conflict with 'alpha'; 'alpha' wins because "
                                  "neither is in the configured backend order [native, numpy] "
                                  "(environment OPDISPATCH_BACKENDS) and it was found first")
    assert reg.backends["alpha"].lost_to is None
    assert {i.backend for i in reg.impls_for("Relu")} >= {"alpha"}
    assert "beta" not in {i.backend for i in reg.impls_for("Relu")}


def test_configured_order_decides_whoever_declared_it(folder, monkeypatch):
    _double(folder, "alpha")
    _double(folder, "beta", conflicts=["alpha"])
    monkeypatch.setenv("OPDISPATCH_BACKENDS", "beta,native,numpy")
    reg = load_registry(str(folder), fresh=True)
    assert _active(reg, ["alpha", "beta"]) == {"beta"}
    alpha = reg.backends["alpha"]
    assert alpha.lost_to == "beta"
    assert ("conflicts with active backend 'beta' (in backend order): 'beta' declares a conflict with 'alpha'"
            in alpha.reason)
    assert "put 'alpha' before 'beta' there" in alpha.reason

    monkeypatch.setenv("OPDISPATCH_BACKENDS", "alpha,beta")
    reg = load_registry(str(folder), fresh=True)
    assert _active(reg, ["alpha", "beta"]) == {"alpha"}
    assert "(first in backend order)" in reg.backends["beta"].reason
    assert ("configured backend order [alpha, beta] (environment OPDISPATCH_BACKENDS)"
            in reg.backends["beta"].reason)


def test_order_argument_and_mutual_declarations(folder):
    _double(folder, "alpha", conflicts=["beta"])
    _double(folder, "beta", conflicts=["alpha"])
    reg = load_registry(str(folder), fresh=True, order=["beta", "alpha"])
    assert _active(reg, ["alpha", "beta"]) == {"beta"}
    assert "'alpha' and 'beta' each declare a conflict with the other" in reg.backends["alpha"].reason
    assert "[beta, alpha] (argument)" in reg.backends["alpha"].reason


def test_failed_winner_lets_its_loser_in(folder):
    _double(folder, "alpha", fail=True)
    _double(folder, "beta", conflicts=["alpha"])
    reg = load_registry(str(folder), fresh=True)
    alpha, beta = reg.backends["alpha"], reg.backends["beta"]
    assert not alpha.available and "register() failed: RuntimeError: cannot open device" in alpha.reason
    assert beta.available and beta.reason is None and beta.lost_to is None
    assert "Relu.beta.double" in {i.name for i in reg.impls_for("Relu")}


def test_registered_backend_is_never_displaced(folder):
    # ranks: a (fails) < b < c; conflicts a-b and b-c. c is accepted with a; when a fails,
    # b may not displace the registered c.
    _double(folder, "a", fail=True, file="1.py")
    _double(folder, "b", conflicts=["a", "c"], file="2.py")
    _double(folder, "c", file="3.py")
    reg = load_registry(str(folder), fresh=True)
    assert _active(reg, ["a", "b", "c"]) == {"c"}
    assert reg.backends["b"].lost_to == "c"
    assert "(active first)" in reg.backends["b"].reason
    assert "failed to register" in reg.backends["b"].reason


def test_unavailable_backend_takes_part_in_no_conflict(folder):
    write_module(folder, "gone.py", """
        from dispatch.backend import Backend
        class Gone(Backend):
            name = "gone"
            def availability(self):
                return "libgone.so is not installed"
            def register(self, registry):
                raise AssertionError("must not be called")
        OPDISPATCH_BACKENDS = [Gone]
    """)
    _double(folder, "beta", conflicts=["gone", "nobody"])
    reg = load_registry(str(folder), fresh=True, order=["gone"])
    assert reg.backends["gone"].reason == "libgone.so is not installed"
    assert reg.backends["beta"].available


NAMES = ["p", "q", "r", "s"]
CONFLICTS = {"p": ["q"], "q": ["r"], "r": [], "s": ["p", "r"]}


@pytest.mark.parametrize("order", list(itertools.permutations(NAMES))[::5])
def test_never_both_active_and_every_loser_names_an_active_winner(folder, order):
    for k, name in enumerate(NAMES):
        _double(folder, name, conflicts=CONFLICTS[name], file=f"{k}_{name}.py")
    reg = load_registry(str(folder), fresh=True, order=order)
    active = _active(reg, NAMES)
    for a, b in itertools.combinations(sorted(active), 2):
        assert b not in CONFLICTS[a] and a not in CONFLICTS[b], (order, active)
    for name in set(NAMES) - active:
        st = reg.backends[name]
        assert st.lost_to in active and f"conflicts with active backend {st.lost_to!r}" in st.reason
    # the first in the order always wins
    assert order[0] in active


def test_cli_reports_the_loser_and_why(folder, capsys):
    _double(folder, "alpha")
    _double(folder, "beta", conflicts=["alpha"])
    assert main(["backends", "--plugin-path", str(folder)]) == 0
    out = capsys.readouterr().out
    alpha = next(line for line in out.splitlines() if line.startswith("alpha "))
    beta = next(line for line in out.splitlines() if line.startswith("beta "))
    assert "available" in alpha and "unavailable" not in alpha
    assert "unavailable: conflicts with active backend 'alpha' (found first)" in beta


class Late(Backend):
    name = "late"
    conflicts = ("numpy",)

    def register(self, registry):
        raise AssertionError("a loser is never registered")


def test_backend_added_after_discovery_loses_to_active_ones():
    reg = load_registry(fresh=True)
    _activate(reg, Late, "tests.plugins")
    st = reg.backends["late"]
    assert not st.available and st.lost_to == "numpy"
    assert "(active first)" in st.reason and "'late' declares a conflict with 'numpy'" in st.reason
    assert reg.backends["numpy"].available
