"""Fixtures of the plugin tests: a registry with the example plugin loaded from a plugin folder
(a copy, so that nothing is written next to the repository's sources)."""

from __future__ import annotations

import pytest

from dispatch.backend import load_registry
from tests.plugins.plugin_support import copy_plugin


@pytest.fixture(scope="module")
def example_registry(tmp_path_factory):
    """Every discovered backend plus the example plugin, loaded from a plugin folder."""
    folder = copy_plugin(tmp_path_factory.mktemp("plugins"))
    reg = load_registry(str(folder), fresh=True)
    status = reg.backends["example"]
    assert status.available, status.reason
    return reg
