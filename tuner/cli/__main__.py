"""``python -m tuner.cli``: the ``opdispatch`` command."""

from __future__ import annotations

import sys

from tuner.cli.commands import main

sys.exit(main())
