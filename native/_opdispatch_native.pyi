"""Type stub of the compiled module ``_opdispatch_native`` (opdispatch's C++ kernels).

Every kernel takes float32 C-contiguous arrays, validates shapes in C++ (ValueError on bad
input) and releases the GIL while it runs.
"""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

build_id: str
compiler: str
openmp: bool

def cpu_flags() -> list[str]: ...
def supported_isas() -> list[str]: ...
def isa() -> str: ...
def set_isa(name: str) -> None: ...
def num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...

# layouts
def nchw_to_nhwc(x: F32) -> F32: ...
def nhwc_to_nchw(x: F32) -> F32: ...
def nchw_to_blocked(x: F32, block: int) -> F32: ...
def blocked_to_nchw(x: F32, shape: Sequence[int], block: int) -> F32: ...
def nhwc_to_blocked(x: F32, block: int) -> F32: ...
def blocked_to_nhwc(x: F32, shape: Sequence[int], block: int) -> F32: ...
def zero_block_tail(x: F32, shape: Sequence[int], block: int) -> None: ...
def copy(x: F32) -> F32: ...

# elementwise
def relu(x: F32) -> F32: ...
def clip(x: F32, lo: float, hi: float) -> F32: ...
def binary_same(op: str, a: F32, b: F32, relu: bool = False) -> F32: ...
def binary_broadcast(op: str, a: F32, b: F32) -> F32: ...
def sum_n(xs: Sequence[F32]) -> F32: ...
# conv stubs
# gemm stubs
# pool/norm/concat stubs
def pool2d(
    x: F32,
    layout: str,
    kind: str,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    ceil_mode: bool = False,
    count_include_pad: bool = False,
    channels: int = -1,
) -> F32:
    """2-D 'max' / 'avg' pooling of a rank-4 activation in `layout` (std, nhwc, nchw8c, nchw16c;
    blocked layouts need the logical `channels`); pads = (top, left, bottom, right)."""

def global_pool(x: F32, layout: str, kind: str, channels: int = -1) -> F32:
    """GlobalMaxPool ('max') / GlobalAveragePool ('avg'); the output keeps `layout` (std: any
    rank >= 3)."""

def channel_affine(
    x: F32, layout: str, scale: F32 | None = None, bias: F32 | None = None, channels: int = -1
) -> F32:
    """x * scale[c] + bias[c] per channel in `layout` (std: rank >= 2; blocked layouts need
    `channels` and get zero padding channels)."""

def fold_batchnorm(
    scale: F32, bias: F32, mean: F32, var: F32, epsilon: float
) -> tuple[F32, F32]:
    """(a, b) with a = scale / sqrt(var + epsilon), b = bias - mean * a (in double)."""

def concat(xs: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """Concat of C-contiguous arrays of one fixed-size dtype along `axis`."""

def concat_channels(xs: Sequence[F32], layout: str, channels: Sequence[int]) -> F32:
    """Channel Concat of rank-4 activations in nhwc / nchw8c / nchw16c (`channels`: each
    input's logical channel count)."""
