"""The generation tests' shared fixture: the reference tokens of the tiny decoders
(:mod:`tests.generation.decoders`), computed once per test session."""

from __future__ import annotations

import pytest

from tests.generation.decoders import MODELS, PROMPT, reference_greedy


@pytest.fixture(scope="session")
def reference_tokens() -> dict[str, list[int]]:
    """128 greedy tokens of each tiny decoder after :data:`PROMPT`."""
    return {family: reference_greedy(path, PROMPT, 128) for family, path in MODELS.items()}
