"""The OpenBLAS thread setting the package makes before numpy loads (nothing else in here).

OpenBLAS worker threads spin for 2**28 cycles (~0.1 s) after each call before they sleep. In a
plan that mixes numpy (OpenBLAS) kernels with native (OpenMP) kernels the spinning threads hold
the cores the next native kernel needs, and a 1 ms kernel takes 4-8 ms (the scheduler's time
slice): measured on resnet50, a mixed plan ran in 276 ms instead of 62 ms. 2**4 cycles makes them
sleep at once. It only works if set before numpy loads OpenBLAS, so it is a default set when
``dispatch`` is imported (the CLI imports it first); a program that imports numpy before dispatch
should set the variable itself (:func:`blas_threads_settled` tells).
"""

from __future__ import annotations

import os
import sys

#: The environment variable (and value) that makes OpenBLAS threads sleep right after a call.
BLAS_SPIN_ENV = ("OPENBLAS_THREAD_TIMEOUT", "4")
_BLAS_SETTLED = "numpy" not in sys.modules or BLAS_SPIN_ENV[0] in os.environ
if "numpy" not in sys.modules:
    os.environ.setdefault(*BLAS_SPIN_ENV)


def blas_threads_settled() -> bool:
    """Whether OpenBLAS worker threads sleep right after each call in this process (see
    ``BLAS_SPIN_ENV``): False when numpy was imported before dispatch without the variable."""
    return _BLAS_SETTLED
