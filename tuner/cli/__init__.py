"""The ``opdispatch`` command line: the application floor, on top of the tuner.

``opdispatch`` (and ``python -m tuner.cli``) runs :func:`main`: :mod:`tuner.cli.commands` holds the
parser and the ``backends``, ``config``, ``run``, ``tune`` and ``example`` commands,
:mod:`tuner.cli.plans` the ``plans`` commands, :mod:`tuner.cli.reports` ``report``, ``explain``
and ``profile``, and :mod:`tuner.cli.args` the argument helpers they share.
"""

from __future__ import annotations

from tuner.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
