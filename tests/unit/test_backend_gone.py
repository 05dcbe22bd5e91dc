"""A backend that disappears between tuning and production.

A plugin backend ``relu_plugin`` (written into a plugin folder by the test; it registers one
PREFERRED Relu) is present when a plan is stored, then gone (its folder no longer on the
plugin path: "uninstalled") or present but unavailable (its library missing). A stored plan
that runs steps on it is invalid, with the reason; a stored plan that runs nothing on it is
still used, with a note. Plans checked directly (``validate_plan``) name the backend and why.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.errors import PlanError, PlanNotFoundError
from dispatch.plan import Plan
from dispatch.plan_check import validate_plan
from tests.builders import small_cnn
from tuner.store import PlanStore
from tuner.tune import plan_key

PLUGIN = '''
import numpy as np

from dispatch.backend import Backend
from dispatch.registry import ImplTable, Priority

table = ImplTable("relu_plugin")


@table.register("Relu", "maximum", priority=Priority.PREFERRED)
def _relu(node):
    """Relu as np.maximum."""
    return lambda x: np.maximum(x, 0)


class ReluPlugin(Backend):
    """A plugin backend with one Relu."""

    name = "relu_plugin"

    def availability(self):
        return {missing!r}

    def version(self):
        return {version!r}

    def register(self, registry):
        registry.add_table(table)


OPDISPATCH_BACKENDS = [ReluPlugin]
'''


def _plugin_folder(root, module: str, *, missing: str | None = None, version: str = "1.0"):
    folder = root / module
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(PLUGIN.format(missing=missing, version=version)))
    return str(folder)


def _x():
    return np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)


@pytest.fixture
def tuned_with_plugin(tmp_path):
    """A store holding a plan for small_cnn, keyed and stamped as the tuner would, made while
    relu_plugin was installed; returns (store path, registry with the plugin, the plan)."""
    registry = load_registry(_plugin_folder(tmp_path, "relu_plugin_ok"), fresh=True)
    assert registry.backends["relu_plugin"].available
    store = tmp_path / "plans.sqlite"
    PlanStore(store).close()

    graph = Session(small_cnn(), registry=registry, store=False).graph
    relus = [n for n in graph.nodes if n.op_type == "Relu"]

    def put(use_plugin: bool = True):
        """Store the untuned plan (its Relus on relu_plugin, or on the numpy reference)."""
        overrides = {n.name: "Relu.relu_plugin.maximum" if use_plugin
                     else registry.reference_impl(n).name for n in relus}
        sess = Session(small_cnn(), registry=registry, store=store, overrides=overrides)
        key = plan_key(sess.graph, registry, sess._allowed_backends(), "latency")
        plan = sess.plan
        plan.provenance = dict(plan.provenance, source="tuned", software=key.software)
        with PlanStore(store) as plans:
            plans.put_plan(key, plan)
        return plan

    return store, registry, put


def test_a_plan_on_a_backend_that_was_uninstalled_is_not_used(tuned_with_plugin):
    store, registry, put = tuned_with_plugin
    plan = put()
    assert plan.backends_used().get("relu_plugin") == 3  # the three Relus
    assert Session(small_cnn(), registry=registry, store=store).plan_source == "store"

    without = load_registry(fresh=True)  # the plugin folder is no longer on the path
    sess = Session(small_cnn(), registry=without, store=store)
    assert sess.plan_source == "heuristic"
    assert "runs on backend 'relu_plugin' (3 step(s) or conversion(s)), which is not installed" \
        in sess.plan_note
    np.testing.assert_allclose(
        sess.run(None, {"x": _x()})[0],
        Session(small_cnn(), registry=without, store=False, backends=["numpy"]).run(None, {"x": _x()})[0],
        rtol=1e-5, atol=1e-6)
    with pytest.raises(PlanNotFoundError, match="backend 'relu_plugin'.*not installed"):
        Session(small_cnn(), registry=without, store=store, require_plan=True)


def test_a_plan_on_a_backend_whose_library_is_missing_is_not_used(tuned_with_plugin, tmp_path):
    store, _, put = tuned_with_plugin
    put()
    broken = load_registry(_plugin_folder(tmp_path, "relu_plugin_nolib",
                                          missing="librelu.so.1: cannot open shared object file"),
                           fresh=True)
    assert not broken.backends["relu_plugin"].available
    sess = Session(small_cnn(), registry=broken, store=store)
    assert sess.plan_source == "heuristic"
    assert "librelu.so.1: cannot open shared object file" in sess.plan_note
    with pytest.raises(PlanNotFoundError, match="librelu.so.1"):
        Session(small_cnn(), registry=broken, store=store, require_plan=True)


def test_a_plan_that_does_not_use_the_vanished_backend_is_still_used(tuned_with_plugin):
    store, _, put = tuned_with_plugin
    plan = put(use_plugin=False)
    assert "relu_plugin" not in plan.backends_used()

    sess = Session(small_cnn(), registry=load_registry(fresh=True), store=store)
    assert sess.plan_source == "store", sess.plan_note
    assert "backend(s) 'relu_plugin' were also available" in sess.plan_note
    assert "the plan runs nothing on them" in sess.plan_note


def test_a_plan_is_not_reused_when_a_used_backend_changed_version(tuned_with_plugin, tmp_path):
    store, _, put = tuned_with_plugin
    put()
    newer = load_registry(_plugin_folder(tmp_path, "relu_plugin_v2", version="2.0"), fresh=True)
    sess = Session(small_cnn(), registry=newer, store=store)
    assert sess.plan_source == "heuristic"
    assert "relu_plugin: 1.0 -> 2.0" in sess.plan_note


def test_validate_plan_names_the_missing_backend_and_the_version(tuned_with_plugin, tmp_path):
    _, registry, put = tuned_with_plugin
    plan = put()
    graph = Session(small_cnn(), registry=registry, store=False).graph
    validate_plan(plan, graph, registry)  # as stored: fine where it was made

    with pytest.raises(PlanError, match=r"backend 'relu_plugin', which is not installed here.*"
                                        r"available backends: native, numpy"):
        validate_plan(plan, graph, load_registry(fresh=True))
    nolib = load_registry(_plugin_folder(tmp_path, "relu_plugin_gone", missing="no librelu"),
                          fresh=True)
    with pytest.raises(PlanError, match="not available here: no librelu"):
        validate_plan(plan, graph, nolib)
    newer = load_registry(_plugin_folder(tmp_path, "relu_plugin_new", version="2.0"), fresh=True)
    with pytest.raises(PlanError, match=r"tuned with backend 'relu_plugin' version '1.0'; this "
                                        r"process has version '2.0'"):
        validate_plan(plan, graph, newer)
    # a given plan (not from the store) is refused the same way, before anything runs
    with pytest.raises(PlanError, match="relu_plugin"):
        Session(small_cnn(), registry=load_registry(fresh=True), store=False, plan=plan)


def test_a_heuristic_plan_has_no_recorded_versions_to_check(tuned_with_plugin):
    _, registry, _ = tuned_with_plugin
    sess = Session(small_cnn(), registry=registry, store=False)
    assert "software" not in sess.plan.provenance
    validate_plan(Plan.from_json(sess.plan.to_json()), sess.graph, registry)


def test_usable_here_follows_the_same_rules(tuned_with_plugin, tmp_path):
    """What `opdispatch plans list` shows in its "usable here" column."""
    import subprocess
    import sys
    from pathlib import Path

    from tuner.plan_lookup import usable_here

    store, registry, put = tuned_with_plugin
    put()
    with PlanStore(store, readonly=True) as plans:
        (stored,) = plans.all_plans()
    assert usable_here(stored, registry) == (True, "")
    ok, why = usable_here(stored, load_registry(fresh=True))
    assert not ok and "runs on backend 'relu_plugin' (3 step(s)" in why and "not installed" in why

    put(use_plugin=False)
    with PlanStore(store, readonly=True) as plans:
        (stored,) = plans.all_plans()
    assert usable_here(stored, load_registry(fresh=True)) == (
        True, "backend(s) relu_plugin gone, unused by the plan")

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPDISPATCH_PLUGIN_PATH"}
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "plans", "list", "--store", str(store)],
                          env={**env, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "yes (backend(s) relu_plugin gone" in proc.stdout  # the table cuts long cells
