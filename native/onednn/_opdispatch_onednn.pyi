"""Type stub of the compiled module ``_opdispatch_onednn`` (opdispatch's oneDNN backend).

Built only when CMake finds oneDNN. Every primitive takes float32 C-contiguous arrays in the
physical shape of its format (outer dims in memory order, then the inner blocks), validates
them in C++ (ValueError on bad input; RuntimeError when oneDNN refuses a case) and releases
the GIL while it runs. Primitives are created once (per plan) and executed on a stream per
thread.
"""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

build_id: str
compiler: str
#: (major, minor, patch) of the oneDNN headers the module was compiled against
header_version: tuple[int, int, int]

def dnnl_version() -> tuple[int, int, int, str]:
    """(major, minor, patch, commit hash) of the oneDNN library loaded at run time."""

def cpu_isa() -> str: ...
def cpu_runtime() -> str: ...
def num_threads() -> int: ...
def set_num_threads(n: int) -> None:
    """Threads for oneDNN's primitives (OpenMP: applied to each executing thread); 0 = default."""

def known_tags(rank: int = 0) -> list[str]: ...

# layouts
def physical_shape(dims: Sequence[int], tag: str) -> list[int]: ...
def reorder(x: F32, dims: Sequence[int], src: str, dst: str) -> F32:
    """A tensor of logical `dims` from format `src` to format `dst` (padding zero-filled)."""

# convolution: params = [N, C, H, W, M, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, group]
def conv_formats(
    params: Sequence[int],
    bias: bool,
    src: str = "any",
    dst: str = "any",
    sum: bool = False,
    eltwise: str = "",
    alpha: float = 0.0,
    beta: float = 0.0,
) -> dict[str, str]:
    """{'src', 'weights', 'dst' (tags, '' when unnamed), 'src_desc', 'weights_desc',
    'dst_desc', 'impl'} of the primitive oneDNN would create."""

class Conv:
    src_shape: list[int]
    dst_shape: list[int]
    weights_shape: list[int]
    weights_format: str
    weights_in_place: bool
    #: the residual is read in place (binary-add post-op), else copied for the sum post-op
    residual_in_place: bool
    impl: str
    def __init__(
        self,
        params: Sequence[int],
        bias: bool,
        src: str,
        dst: str,
        weights: str,
        sum: bool = False,
        eltwise: str = "",
        alpha: float = 0.0,
        beta: float = 0.0,
    ) -> None: ...
    def set_weights(self, w: F32, tag: str) -> None: ...
    def __call__(
        self, x: F32, w: F32 | None = None, b: F32 | None = None, residual: F32 | None = None
    ) -> F32: ...

# matmul
def matmul_formats(
    src: Sequence[int], weights: Sequence[int], bias: bool, src_tag: str, eltwise: str = ""
) -> dict[str, str]: ...

class MatMul:
    src_shape: list[int]
    dst_shape: list[int]
    weights_shape: list[int]
    weights_format: str
    weights_in_place: bool
    impl: str
    def __init__(
        self,
        src: Sequence[int],
        weights: Sequence[int],
        bias: bool,
        src_tag: str,
        weights_tag: str,
        sum: bool = False,
        eltwise: str = "",
        alpha: float = 0.0,
        beta: float = 0.0,
    ) -> None: ...
    def set_weights(self, w: F32, tag: str) -> None: ...
    def __call__(
        self, a: F32, w: F32 | None = None, b: F32 | None = None, residual: F32 | None = None
    ) -> F32: ...

# pooling: params = [N, C, H, W, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR]
class Pool:
    src_shape: list[int]
    dst_shape: list[int]
    impl: str
    def __init__(self, params: Sequence[int], kind: str, tag: str) -> None: ...
    def __call__(self, x: F32) -> F32: ...

# eltwise and binary
def eltwise_kinds() -> list[str]: ...
def binary_kinds() -> list[str]: ...

class Eltwise:
    impl: str
    def __init__(self, kind: str, alpha: float, beta: float, dims: Sequence[int], tag: str) -> None: ...
    def __call__(self, x: F32) -> F32: ...

class Binary:
    impl: str
    def __init__(
        self,
        kind: str,
        dims: Sequence[int],
        tag: str,
        b_dims: Sequence[int],
        b_tag: str,
        eltwise: str = "",
    ) -> None: ...
    def __call__(self, a: F32, b: F32) -> F32: ...

# batch normalization (inference)
class BatchNorm:
    impl: str
    def __init__(
        self,
        dims: Sequence[int],
        tag: str,
        epsilon: float,
        relu: bool,
        scale: F32,
        shift: F32,
        mean: F32,
        var: F32,
    ) -> None: ...
    def __call__(self, x: F32) -> F32: ...
