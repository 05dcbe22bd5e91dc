"""Test-wide settings: the plan store lives in a temporary folder, never in the user's cache,
so that a developer's tuned plans cannot change what the tests run (and the tests cannot
write into them), one per pytest-xdist worker; the graph cache is off (every test imports its
model afresh; the cache's own tests turn it on in a temporary folder)."""

from __future__ import annotations

import os

# before anything loads numpy: OpenBLAS threads must not spin between calls (see
# dispatch.BLAS_SPIN_ENV; mixed numpy/native plans and their measurements depend on it)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
import tempfile

import pytest

#: set when this conftest chose the store (so that pytest-xdist's workers, which inherit the
#: controller's environment, each choose a store of their own instead of sharing its one)
_OWN_STORE = "OPDISPATCH_TEST_OWN_STORE"


def pytest_configure(config):
    if "OPDISPATCH_STORE" not in os.environ or os.environ.get(_OWN_STORE) == "1":
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        folder = tempfile.mkdtemp(prefix=f"opdispatch-test-store-{worker}-")
        os.environ["OPDISPATCH_STORE"] = os.path.join(folder, "plans.sqlite")
        os.environ[_OWN_STORE] = "1"
    os.environ.setdefault("OPDISPATCH_GRAPH_CACHE", "off")
    os.environ.setdefault("OPDISPATCH_COMPILED_CACHE", "off")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, the README's test command): the tests that
    share a module- or session-scoped fixture of this suite run on one worker (their group is
    the broadest place such a fixture is defined: a module, or a folder's conftest), so that an
    expensive fixture (a tuned model, a live server) is set up once, not once per worker; every
    other test is handed out one by one."""
    if not config.pluginmanager.hasplugin("xdist"):
        return

    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        homes = {d.baseid for defs in info.name2fixturedefs.values() for d in defs
                 if d.scope in ("module", "package", "session") and d.baseid.startswith("tests/")}
        if homes:
            group = min(homes, key=len)
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid:
                _suffix_group(item, group)


def _suffix_group(item, group: str) -> None:
    """The group suffix xdist's scheduler reads from a node id (``ID@GROUP``). pytest-xdist
    3.8 writes it into ``item._nodeid``, which pytest 9 no longer reads (its node ids are
    structured: pytest-dev/pytest-xdist#1386, fix pending in #1388), so loadgroup silently
    stops grouping; this writes it where pytest 9 keeps the id. Where neither works the tests
    are merely handed out one by one."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest 8: xdist's own suffix works
        return
    item._id = coerce_node_id(f"{item.nodeid}@{group}")
