"""The plugin's implementation tables, filled by its modules' decorators.

``impls`` holds the ``example`` backend's implementations. ``reference`` holds the reference
semantics of the operators this plugin brings, as implementations of the reference backend
(``dispatch.registry.REFERENCE_BACKEND``): the tuner checks every candidate against that
backend's implementation of the same operator.
"""

from __future__ import annotations

from dispatch.registry import REFERENCE_BACKEND, ImplTable

BACKEND = "example"

impls = ImplTable(BACKEND)
reference = ImplTable(REFERENCE_BACKEND)
