"""Test-wide settings: the plan store lives in a temporary folder, never in the user's cache,
so that a developer's tuned plans cannot change what the tests run (and the tests cannot
write into them)."""

from __future__ import annotations

import os
import tempfile


def pytest_configure(config):
    if "OPDISPATCH_STORE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="opdispatch-test-store-")
        os.environ["OPDISPATCH_STORE"] = os.path.join(folder, "plans.sqlite")
