"""Backends shipped with opdispatch, one subpackage per backend with the same module names."""

from __future__ import annotations

import dispatch  # noqa: F401  (first: it sets the OpenBLAS thread default before numpy loads)
