"""Shared fixtures for the benchmark suites (pytest-benchmark).

Run: python -m pytest bench -q --benchmark-enable --benchmark-columns=median,iqr,rounds
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
