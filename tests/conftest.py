"""Test-wide settings: the plan store lives in a temporary folder, never in the user's cache,
so that a developer's tuned plans cannot change what the tests run (and the tests cannot
write into them), one per pytest-xdist worker; the graph cache is off (every test imports its model afresh; the cache's
own tests turn it on in a temporary folder)."""

from __future__ import annotations

import os

# before anything loads numpy: OpenBLAS threads must not spin between calls (see
# dispatch.BLAS_SPIN_ENV; mixed numpy/native plans and their measurements depend on it)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
import tempfile


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
