"""The native tests need the compiled module: its absence is a failure, not a skip, because an
installed package always builds it (set OPDISPATCH_ALLOW_NO_NATIVE=1 to skip on purpose)."""

from __future__ import annotations

import os

import pytest

from impls.native import _module


def pytest_collection_modifyitems(config, items):
    if _module.error() is None:
        return
    if os.environ.get("OPDISPATCH_ALLOW_NO_NATIVE") == "1":
        skip = pytest.mark.skip(reason=_module.error() or "")
        for item in items:
            if "tests/native" in str(item.fspath):
                item.add_marker(skip)
        return
    raise pytest.UsageError(f"native tests cannot run: {_module.error()}")
