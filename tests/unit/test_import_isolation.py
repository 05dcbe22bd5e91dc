"""Importing the core must not import optional heavy libraries."""

from __future__ import annotations

import subprocess
import sys


def test_import_dispatch_does_not_import_onnxruntime():
    code = (
        "import sys, dispatch, layouts, impls, tuner\n"
        "from dispatch.backend import load_registry\n"
        "load_registry()\n"
        "heavy = [m for m in ('onnxruntime', 'torch', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
