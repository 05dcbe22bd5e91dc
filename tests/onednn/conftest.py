"""The oneDNN tests need the compiled module ``_opdispatch_onednn``, which is built only when
CMake finds oneDNN: without it every test here is skipped, with the reason."""

from __future__ import annotations

import pytest

from impls.onednn import _module


def pytest_collection_modifyitems(config, items):
    reason = _module.error()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"the oneDNN backend is unavailable: {reason}")
    for item in items:
        if "tests/onednn" in str(item.fspath):
            item.add_marker(skip)
