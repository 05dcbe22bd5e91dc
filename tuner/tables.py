"""Aligned terminal tables through tabulate, fitted to a width on request: the command line's
tables and the reports' (:mod:`tuner.report.render`). Imports nothing heavy (tabulate only when a
table is drawn), so that the light commands stay quick to start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def terminal_width(default: int = 100) -> int:
    """The terminal's width in columns (``COLUMNS`` first; ``default`` when not a terminal)."""
    import shutil

    return max(40, shutil.get_terminal_size((default, 24)).columns)


def aligned(rows: Sequence[Sequence[Any]], *, max_width: int = 48,
            numeric: Sequence[int] = (), width: int | None = None,
            fixed: Sequence[int] = ()) -> str:
    """An aligned terminal table (tabulate's ``simple`` format): header, a rule, the rows;
    ``numeric`` columns right-aligned. Cells longer than ``max_width`` are cut, except in the
    last column. With ``width``, the widest columns (not the ``fixed`` ones: names a reader
    searches for) are wrapped until the table fits it."""
    from tabulate import tabulate

    if not rows:
        return ""
    cells = [[str(c) for c in r] for r in rows]
    ncol = len(cells[0])
    for r in cells[1:]:
        for k in range(ncol - 1):
            if len(r[k]) > max_width:
                r[k] = r[k][: max_width - 1] + "…"
    widths = [max(len(r[k]) for r in cells) for k in range(ncol)]
    limits: list[int | None] = [None] * ncol
    if width is not None:
        # tabulate does not wrap headers: no column narrower than its header
        floor = [widths[k] if k in fixed else max(6, len(cells[0][k])) for k in range(ncol)]
        last = ncol - 1
        # the other columns give way first (to 20 characters), then the last (to 24), then all
        for cols, keep in ((range(last), 20), ((last,), 24), (range(ncol), 0)):
            while sum(widths) + 2 * last > width:
                can = [j for j in cols if widths[j] > max(floor[j], keep)]
                if not can:
                    break
                k = max(can, key=lambda j: widths[j])
                widths[k] -= 1
                limits[k] = widths[k]
    align = ["right" if k in numeric else "left" for k in range(ncol)]
    import tabulate as _tabulate

    padding, _tabulate.MIN_PADDING = _tabulate.MIN_PADDING, 0  # headers as wide as they are
    try:
        text = tabulate(cells[1:], headers=cells[0], tablefmt="simple", colalign=align,
                        disable_numparse=True, maxcolwidths=limits if width is not None else None)
    finally:
        _tabulate.MIN_PADDING = padding
    return "\n".join(line.rstrip() for line in text.splitlines())
