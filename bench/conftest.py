"""Shared fixtures for the benchmark suites (pytest-benchmark).

Run: python -m pytest bench -q --benchmark-enable --benchmark-columns=median,iqr,rounds
"""

from __future__ import annotations

import os

# before anything loads numpy: OpenBLAS threads must not spin between calls (see
# dispatch.BLAS_SPIN_ENV; mixed numpy/native plans and their measurements depend on it)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
