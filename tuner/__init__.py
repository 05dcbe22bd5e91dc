"""The warm-up tuner: candidates, measurements, conversion-aware optimisation, validation and
the SQLite plan store."""

from __future__ import annotations

import dispatch  # noqa: F401  (first: it sets the OpenBLAS thread default before numpy loads)
