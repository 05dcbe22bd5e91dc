"""numpy kernels of the exporters' index and layout operators (issue 14) against onnx's
reference evaluator: GatherND, ScatterND, GatherElements, ScatterElements, Einsum, Resize,
ConvTranspose, InstanceNormalization, GroupNormalization, DepthToSpace and SpaceToDepth.

Every case runs on every registered implementation of its op that supports the node (and some
implementation must support it). Where onnx's evaluator is not an oracle the expected values
are computed by hand in the targeted tests below: GatherElements with indices smaller than
the data (the evaluator requires equal shapes), Resize nearest with NaN / inf neighbours (the
evaluator computes a 0 / 1 weighted sum, so 0 * inf spreads NaN) and ``pytorch_half_pixel``
with one output element (the evaluator maps it to -0.5, the spec and onnxruntime to 0).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from impls.numpy.backend import MODULES
from impls.numpy.table import impls
from tests.support import make_node, reference_outputs, run_impl

for _mod in MODULES:
    importlib.import_module(f"impls.numpy.{_mod}")

RNG = np.random.default_rng(14)
OPS = ("GatherND", "ScatterND", "GatherElements", "ScatterElements", "Einsum", "Resize",
       "ConvTranspose", "InstanceNormalization", "GroupNormalization", "DepthToSpace",
       "SpaceToDepth")


def f32(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def i64(*values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32v(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def ints(*shape: int, lo: int, hi: int, dtype: Any = np.int64) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


@dataclass
class Case:
    op: str
    name: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 21
    const: tuple[int, ...] = ()


CASES: list[Case] = []


def case(op: str, name: str, inputs: list, attrs: dict | None = None, **kw: Any) -> None:
    CASES.append(Case(op, name, list(inputs), attrs or {}, **kw))


# -- GatherND / ScatterND --------------------------------------------------------------------
case("GatherND", "scalars", [f32(2, 3), i64([0, 1], [1, -1], [-2, 0])])
case("GatherND", "rows", [f32(4, 3), i64([1], [-1], [0])])
case("GatherND", "slices_3d", [f32(2, 3, 4), i64([[0, 1]], [[1, -3]])])
case("GatherND", "batch1", [f32(2, 3, 4), i64([1], [0])], {"batch_dims": 1})
case("GatherND", "batch1_tuples", [f32(2, 3, 4), i64([[1, 3], [0, -1]], [[2, 2], [0, 0]])],
     {"batch_dims": 1})
case("GatherND", "batch2", [f32(2, 3, 4, 5), ints(2, 3, 2, 2, lo=-4, hi=4)], {"batch_dims": 2})
case("GatherND", "int32_data", [ints(3, 3, lo=-9, hi=9, dtype=np.int32), i64([2, 1], [0, 0])])
case("GatherND", "opset11", [f32(3, 4), i64([[2]], [[0]])], opset=11)
case("GatherND", "opset12", [f32(2, 3), i64([1], [0])], {"batch_dims": 1}, opset=12)

_data = f32(4, 3, 2)
case("ScatterND", "slices", [_data, i64([1], [-1]), f32(2, 3, 2)], opset=13)
case("ScatterND", "elements", [_data, i64([0, 0, 1], [3, 2, -1]), f32v(5.0, 7.0)], opset=13)
for _red, _opset in (("add", 16), ("mul", 16), ("max", 18), ("min", 18)):
    case("ScatterND", f"{_red}_dup", [_data, i64([1, 2], [1, 2], [0, -3]), f32(3, 2)],
         {"reduction": _red}, opset=_opset)
case("ScatterND", "int32_add", [ints(5, lo=-9, hi=9, dtype=np.int32), i64([1], [1], [4]),
                                ints(3, lo=-9, hi=9, dtype=np.int32)], {"reduction": "add"})
case("ScatterND", "rank1_k_full", [f32(8), i64([4], [3], [1], [7]), f32v(9, 10, 11, 12)])

# -- GatherElements / ScatterElements --------------------------------------------------------
case("GatherElements", "axis0", [f32(3, 3), i64([1, 2, 0], [2, 0, -1])])
case("GatherElements", "axis1", [f32(2, 2), i64([0, 0], [1, 0])], {"axis": 1})
case("GatherElements", "axis2", [f32(2, 3, 4), ints(2, 3, 5, lo=-4, hi=4)], {"axis": 2})
case("GatherElements", "int32_idx", [f32(3, 4), ints(5, 4, lo=-3, hi=3, dtype=np.int32)])
case("GatherElements", "int64_data", [ints(3, 4, lo=-99, hi=99), ints(3, 2, lo=0, hi=4)],
     {"axis": 1})

case("ScatterElements", "axis0", [np.zeros((3, 3), np.float32), i64([1, 0, 2], [0, 2, 1]),
                                  f32(2, 3)])
case("ScatterElements", "axis1_neg", [f32(1, 5), np.array([[1, -2]], np.int64), f32(1, 2)],
     {"axis": 1})
case("ScatterElements", "axis_m1_3d", [f32(2, 3, 4), ints(2, 3, 2, lo=-4, hi=4),
                                       f32(2, 3, 2)], {"axis": -1})
for _red, _opset in (("add", 16), ("mul", 16), ("max", 18), ("min", 18)):
    case("ScatterElements", f"{_red}_dup", [f32(3, 4), i64([1, 1, 1, 0], [1, -2, 0, 0]),
                                            f32(2, 4)], {"reduction": _red}, opset=_opset)
case("ScatterElements", "int32_idx", [f32(4, 3), ints(2, 3, lo=-4, hi=4, dtype=np.int32),
                                      f32(2, 3)], opset=13)

# -- Einsum ----------------------------------------------------------------------------------
for _name, _eq, _shapes in (
    ("matmul", "ij,jk->ik", [(3, 4), (4, 5)]),
    ("batch_matmul", "bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("transpose", "ij->ji", [(3, 4)]),
    ("trace", "ii", [(4, 4)]),
    ("diagonal", "ii->i", [(4, 4)]),
    ("batch_diagonal", "...ii->...i", [(2, 3, 3)]),
    ("ellipsis", "...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("implicit", "ij,jk", [(3, 4), (4, 5)]),
    ("implicit_upper", "bA,Ac", [(3, 4), (4, 2)]),
    ("spaces", " ij , jk -> ki ", [(3, 4), (4, 5)]),
    ("sum_all", "ij->", [(3, 4)]),
    ("outer", "i,j->ij", [(3,), (4,)]),
    ("three", "ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bilinear", "bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
):
    case("Einsum", _name, [f32(*s) for s in _shapes], {"equation": _eq}, opset=12)
case("Einsum", "float64", [f32(3, 4, dtype=np.float64), f32(4, 2, dtype=np.float64)],
     {"equation": "ij,jk->ik"})
case("Einsum", "float16", [f32(3, 4, dtype=np.float16), f32(4, 2, dtype=np.float16)],
     {"equation": "ij,jk->ik"})
case("Einsum", "int32", [ints(3, 4, lo=-9, hi=9, dtype=np.int32),
                         ints(4, 2, lo=-9, hi=9, dtype=np.int32)], {"equation": "ij,jk->ik"})

# -- Resize ----------------------------------------------------------------------------------
_img = f32(1, 2, 4, 5)


def resize(name: str, attrs: dict, *, scales: list[float] | None = None,
           sizes: list[int] | None = None, roi: list[float] | None = None,
           x: np.ndarray = _img, opset: int = 19) -> None:
    ins = [x, None if roi is None else np.array(roi, np.float32),
           None if scales is None else np.array(scales, np.float32)]
    if sizes is not None:
        ins.append(np.array(sizes, np.int64))
    case("Resize", name, ins, attrs, opset=opset, const=(1, 2, 3))


for _nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
    for _ctm in ("asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel"):
        resize(f"nearest_{_nm}_{_ctm}_up", {"nearest_mode": _nm,
                                            "coordinate_transformation_mode": _ctm},
               scales=[1, 1, 2.0, 1.5])
        resize(f"nearest_{_nm}_{_ctm}_sizes", {"nearest_mode": _nm,
                                               "coordinate_transformation_mode": _ctm},
               sizes=[1, 2, 3, 8])
for _mode in ("linear", "cubic"):
    for _ctm in ("half_pixel", "align_corners", "pytorch_half_pixel", "asymmetric",
                 "half_pixel_symmetric"):
        resize(f"{_mode}_{_ctm}_up", {"mode": _mode, "coordinate_transformation_mode": _ctm},
               scales=[1, 1, 2.0, 2.0])
        resize(f"{_mode}_{_ctm}_down", {"mode": _mode, "coordinate_transformation_mode": _ctm},
               scales=[1, 1, 0.6, 0.8])
        resize(f"{_mode}_{_ctm}_sizes", {"mode": _mode, "coordinate_transformation_mode": _ctm},
               sizes=[1, 2, 7, 3])
    resize(f"{_mode}_antialias_down", {"mode": _mode, "antialias": 1}, scales=[1, 1, 0.5, 0.4])
    resize(f"{_mode}_antialias_sizes", {"mode": _mode, "antialias": 1}, sizes=[1, 2, 3, 2])
    resize(f"{_mode}_tf_crop", {"mode": _mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                                "extrapolation_value": 10.0},
           sizes=[1, 2, 3, 4], roi=[0, 0, 0.4, -0.2, 1, 1, 0.9, 1.3])
resize("cubic_a05_exclude_outside", {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
       scales=[1, 1, 1.7, 0.7])
resize("nearest_tf_crop_axes", {"coordinate_transformation_mode": "tf_crop_and_resize",
                                 "axes": [3, 2]}, sizes=[6, 5], roi=[0.1, -0.3, 1.2, 0.8])
resize("linear_axes", {"mode": "linear", "axes": [3]}, scales=[2.5])
resize("nearest_axes_sizes", {"axes": [2, 3]}, sizes=[7, 2])
for _policy in ("not_larger", "not_smaller"):
    resize(f"nearest_{_policy}", {"keep_aspect_ratio_policy": _policy, "axes": [2, 3]},
           sizes=[7, 8])
    resize(f"linear_{_policy}", {"mode": "linear", "keep_aspect_ratio_policy": _policy},
           sizes=[1, 2, 3, 9])
resize("linear_opset11", {"mode": "linear"}, scales=[1, 1, 1.5, 2], roi=[], opset=11)
resize("nearest_opset13", {}, scales=[1, 1, 3, 3], opset=13)
resize("linear_opset18_3d", {"mode": "linear"}, scales=[1, 1, 2.5], x=f32(2, 3, 5), opset=18)
resize("nearest_5d", {"nearest_mode": "floor"}, scales=[1, 1, 2, 0.5, 2], x=f32(1, 2, 3, 4, 2))
resize("linear_uint8", {"mode": "linear"}, scales=[1, 1, 1.5, 2.5],
       x=ints(1, 1, 4, 4, lo=0, hi=256, dtype=np.uint8))
resize("cubic_int8", {"mode": "cubic"}, scales=[1, 1, 2, 2],
       x=ints(1, 1, 3, 3, lo=-128, hi=128, dtype=np.int8))
resize("nearest_int64", {}, sizes=[1, 2, 9, 2], x=ints(1, 2, 4, 5, lo=-(2**40), hi=2**40))
resize("linear_float64", {"mode": "linear"}, scales=[1, 1, 2, 2],
       x=f32(1, 1, 3, 3, dtype=np.float64))
resize("linear_float16", {"mode": "linear"}, scales=[1, 1, 2, 2],
       x=f32(1, 1, 3, 3, dtype=np.float16))

# -- ConvTranspose ---------------------------------------------------------------------------
_ct = [
    ("2d", (1, 3, 4, 4), (3, 2, 3, 3), {}),
    ("2d_bias", (2, 3, 3, 4), (3, 4, 3, 2), {"bias": True}),
    ("strides", (1, 2, 3, 3), (2, 3, 3, 3), {"strides": [3, 2]}),
    ("pads", (1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 2, 0, 1]}),
    ("output_padding", (1, 2, 3, 3), (2, 3, 3, 3),
     {"strides": [3, 2], "output_padding": [1, 1], "pads": [1, 0, 1, 1]}),
    ("output_shape", (1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ("output_shape_upper", (1, 1, 3, 3), (1, 2, 3, 3),
     {"strides": [3, 2], "output_shape": [9, 7], "auto_pad": "SAME_UPPER"}),
    ("dilations", (1, 2, 4, 4), (2, 2, 2, 3), {"dilations": [2, 3]}),
    ("depthwise", (2, 3, 3, 3), (3, 1, 2, 2), {"group": 3, "strides": [2, 2]}),
    ("same_upper", (1, 2, 3, 3), (2, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("same_lower", (1, 2, 3, 3), (2, 2, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("valid", (1, 2, 3, 3), (2, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 1]}),
    ("1d", (2, 3, 5), (3, 2, 3), {"strides": [2], "pads": [1, 1], "bias": True}),
    ("3d", (1, 2, 3, 4, 2), (2, 2, 3, 2, 2), {"strides": [2, 1, 2], "dilations": [1, 2, 1]}),
    ("kernel_1x1_stride2", (1, 4, 3, 3), (4, 2, 1, 1), {"strides": [2, 2]}),
]
for _name, _xs, _ws, _attrs in _ct:
    _attrs = dict(_attrs)
    _ins = [f32(*_xs), f32(*_ws)]
    if _attrs.pop("bias", False):
        _ins.append(f32(_ws[1] * _attrs.get("group", 1)))
    case("ConvTranspose", _name, _ins, _attrs, const=(1, 2), opset=11 if _name == "2d" else 21)
case("ConvTranspose", "float64", [f32(1, 2, 3, 3, dtype=np.float64), f32(2, 2, 2, 2, dtype=np.float64)],
     {"strides": [2, 2]})
case("ConvTranspose", "float16", [f32(1, 2, 3, 3, dtype=np.float16), f32(2, 2, 2, 2, dtype=np.float16)],
     {"strides": [2, 2]})

# -- InstanceNormalization / GroupNormalization ----------------------------------------------
for _shape in ((2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 2, 4)):
    _c = _shape[1]
    case("InstanceNormalization", f"rank{len(_shape)}", [f32(*_shape) * 3 + 1, f32(_c), f32(_c)],
         {"epsilon": 1e-3})
case("InstanceNormalization", "float64", [f32(2, 3, 6, dtype=np.float64), f32(3, dtype=np.float64),
                                          f32(3, dtype=np.float64)], opset=6)
case("InstanceNormalization", "float16", [f32(2, 3, 6, dtype=np.float16), f32(3, dtype=np.float16),
                                          f32(3, dtype=np.float16)])
for _g in (1, 2, 4):
    case("GroupNormalization", f"opset18_g{_g}", [f32(2, 4, 3, 3), f32(_g), f32(_g)],
         {"num_groups": _g}, opset=18)
    case("GroupNormalization", f"opset21_g{_g}", [f32(2, 4, 3, 3), f32(4), f32(4)],
         {"num_groups": _g, "epsilon": 1e-2}, opset=21)
case("GroupNormalization", "opset21_rank3", [f32(3, 6, 5), f32(6), f32(6)], {"num_groups": 3})
case("GroupNormalization", "opset21_stash_double",
     [f32(2, 4, 5, dtype=np.float64), f32(4, dtype=np.float64), f32(4, dtype=np.float64)],
     {"num_groups": 2, "stash_type": 11})

# -- DepthToSpace / SpaceToDepth -------------------------------------------------------------
case("DepthToSpace", "dcr", [f32(2, 8, 3, 2)], {"blocksize": 2})
case("DepthToSpace", "crd", [f32(1, 18, 2, 3)], {"blocksize": 3, "mode": "CRD"})
case("DepthToSpace", "opset11_int", [ints(1, 4, 2, 2, lo=0, hi=99)], {"blocksize": 2}, opset=11)
case("SpaceToDepth", "dcr", [f32(2, 3, 4, 6)], {"blocksize": 2}, opset=13)
case("SpaceToDepth", "crd", [f32(1, 2, 6, 3)], {"blocksize": 3, "mode": "CRD"}, opset=28)
case("SpaceToDepth", "dcr_mode_attr", [f32(1, 2, 4, 4)], {"blocksize": 2, "mode": "DCR"}, opset=28)


# -- the generic comparison ------------------------------------------------------------------


def _build(c: Case) -> tuple[Any, Any]:
    return make_node(c.op, c.inputs, c.attrs, opset=c.opset, const_inputs=c.const)


def _params() -> list[Any]:
    out = []
    for c in CASES:
        node, _ = _build(c)
        for impl in impls:
            if impl.op == c.op and impl.supports(node) is None:
                out.append(pytest.param(impl, c, id=f"{impl.name}-{c.name}-opset{c.opset}"))
    return out


PARAMS = _params()


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{what}: {type(got).__name__}, not ndarray"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.flags.c_contiguous, f"{what}: not row-major contiguous"
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    tol = {np.dtype(np.float16): 3e-3, np.dtype(np.float32): 2e-5}.get(got.dtype, 1e-6)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


@pytest.mark.parametrize(("impl", "c"), PARAMS)
def test_matches_reference(impl: Any, c: Case) -> None:
    node, proto = _build(c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = reference_outputs(proto, c.inputs, c.opset)
    got = run_impl(impl, node, c.inputs)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"{impl.name} {c.name} output {k}")


@pytest.mark.parametrize("c", CASES, ids=[f"{c.op}-{c.name}" for c in CASES])
def test_every_case_is_supported(c: Case) -> None:
    node, _ = _build(c)
    reasons = [i.supports(node) for i in impls if i.op == c.op]
    assert reasons and any(r is None for r in reasons), f"{c.op} {c.name}: {reasons}"


def test_every_op_and_implementation_is_exercised() -> None:
    tested = {p.values[0].name for p in PARAMS}
    mine = {i.name for i in impls if i.op in OPS}
    assert mine and mine - tested == set()
    assert {c.op for c in CASES} == set(OPS)


# -- targeted behaviour ----------------------------------------------------------------------


def _impl(op: str) -> Any:
    (impl,) = [i for i in impls if i.op == op]
    return impl


def _run(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> np.ndarray:
    node, _ = make_node(op, inputs, attrs, **kw)
    impl = _impl(op)
    assert impl.supports(node) is None, impl.supports(node)
    return run_impl(impl, node, inputs)[0]


def _reason(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> str | None:
    node, _ = make_node(op, inputs, attrs, **kw)
    return _impl(op).supports(node)


def test_gather_nd_out_of_range_raises() -> None:
    with pytest.raises(IndexError, match="outside"):
        _run("GatherND", [f32(2, 3), i64([0, 3])])
    with pytest.raises(IndexError, match="outside"):
        _run("GatherND", [f32(2, 3), i64([-3, 0])])


def test_gather_nd_empty_indices() -> None:
    y = _run("GatherND", [f32(2, 3), np.zeros((0, 1), np.int64)])
    assert y.shape == (0, 3) and y.dtype == np.float32


def test_scatter_nd_does_not_write_into_its_input() -> None:
    data = f32(3, 2)
    keep = data.copy()
    y = _run("ScatterND", [data, i64([1]), f32(1, 2)], {"reduction": "add"})
    np.testing.assert_array_equal(data, keep)
    assert not np.shares_memory(y, data)


def test_scatter_reductions_accumulate_duplicates() -> None:
    data = np.array([1.0, 2.0, 3.0], np.float32)
    idx = i64([0], [0], [2], [0])
    upd = np.array([10.0, 20.0, 5.0, 0.5], np.float32)
    assert _run("ScatterND", [data, idx, upd], {"reduction": "add"}).tolist() == [31.5, 2.0, 8.0]
    assert _run("ScatterND", [data, idx, upd], {"reduction": "mul"}).tolist() == [100.0, 2.0, 15.0]
    assert _run("ScatterND", [data, idx, upd], {"reduction": "max"}).tolist() == [20.0, 2.0, 5.0]
    assert _run("ScatterND", [data, idx, upd], {"reduction": "min"}).tolist() == [0.5, 2.0, 3.0]
    y = _run("ScatterElements", [data, i64(0, -3, 2, 0), upd], {"reduction": "add"})
    assert y.tolist() == [31.5, 2.0, 8.0]


def test_scatter_max_propagates_nan() -> None:
    data = np.array([1.0, np.nan, 3.0], np.float32)
    upd = np.array([np.nan, 5.0], np.float32)
    y = _run("ScatterElements", [data, i64(0, 1), upd], {"reduction": "max"})
    assert np.isnan(y[0]) and np.isnan(y[1]) and y[2] == 3.0


def test_scatter_reductions_need_their_opset() -> None:
    ins = [f32(3), i64([0]), f32(1)]
    assert "not defined at opset 16" in _reason("ScatterND", ins, {"reduction": "max"}, opset=16)
    assert "not defined at opset 13" in _reason("ScatterND", ins, {"reduction": "add"}, opset=13)
    assert _reason("ScatterND", ins, {"reduction": "max"}, opset=18) is None
    bools = [np.zeros(3, bool), i64([0]), np.ones(1, bool)]
    assert "bool" in _reason("ScatterND", bools, {"reduction": "add"})
    assert _reason("ScatterND", bools) is None


def test_gather_elements_smaller_indices_than_data() -> None:
    """torch.gather semantics: indices may be smaller than data on the other axes."""
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = i64([2, -1], [0, 1])
    y = _run("GatherElements", [data, idx], {"axis": 1})
    np.testing.assert_array_equal(y, [[2.0, 3.0], [4.0, 5.0]])
    y = _run("GatherElements", [data, idx], {"axis": -1})  # the evaluator fails on axis < 0
    np.testing.assert_array_equal(y, [[2.0, 3.0], [4.0, 5.0]])
    with pytest.raises(IndexError):
        _run("GatherElements", [data, i64([4])], {"axis": 1})


def test_einsum_keeps_float32_and_returns_arrays() -> None:
    y = _run("Einsum", [f32(3, 4)], {"equation": "ij->"})
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == ()
    assert "2 input terms for 1 inputs" in _reason("Einsum", [f32(3)], {"equation": "i,i"})
    assert "does not fit" in _reason("Einsum", [f32(3, 4)], {"equation": "ijk->i"})


def test_resize_nearest_copies_nonfinite_values_exactly() -> None:
    x = np.array([[[[np.nan, 1.0, np.inf, -np.inf]]]], np.float32)
    y = _run("Resize", [x, None, np.array([1, 1, 1, 2], np.float32)],
             {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
             const_inputs=(2,))
    want = np.array([np.nan, np.nan, 1.0, 1.0, np.inf, np.inf, -np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(y.reshape(-1), want)


def test_resize_pytorch_half_pixel_single_output_is_coordinate_zero() -> None:
    """The spec (and onnxruntime): length_resized 1 maps to x_original = 0 (the reference
    evaluator takes -0.5, which differs in cubic mode)."""
    x = f32(1, 1, 1, 6)
    y = _run("Resize", [x, None, None, i64(1, 1, 1, 1)],
             {"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
             const_inputs=(3,))
    np.testing.assert_allclose(y.reshape(-1), x[0, 0, 0, :1], rtol=1e-6)


def test_resize_refusals() -> None:
    x = f32(1, 1, 2, 2)
    scales = np.array([1, 1, 2, 2], np.float32)
    assert "opset 10" in _reason("Resize", [x, scales], opset=10)
    assert "antialias" in _reason("Resize", [x, None, scales], {"antialias": 1})
    assert "exclude_outside" in _reason("Resize", [x, None, scales],
                                        {"mode": "linear", "exclude_outside": 1})
    assert "not defined at opset 13" in _reason(
        "Resize", [x, None, scales], {"coordinate_transformation_mode": "half_pixel_symmetric"},
        opset=13)
    assert "both" in _reason("Resize", [x, None, scales, i64(1, 1, 4, 4)], const_inputs=(2, 3))
    assert _reason("Resize", [x, np.zeros(0, np.float32), scales],
                   {"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, opset=11) is None


def test_resize_cubic_near_float32_max_stays_finite() -> None:
    """Cubic weights are partly negative and above 1 (e.g. 0.59 + 0.59 - 0.09 - 0.09): a
    float32 sum of values ~3e38 overflows on the way; the reference sums in float64."""
    x = np.full((1, 1, 4, 4), 3e38, np.float32)
    y = _run("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "cubic"},
             const_inputs=(2,))
    np.testing.assert_allclose(y, np.full((1, 1, 8, 8), 3e38, np.float32), rtol=1e-6)


def test_resize_tf_half_pixel_for_nn() -> None:
    """Opset 11's tf_half_pixel_for_nn: x_original = (x_resized + 0.5) / scale."""
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    y = _run("Resize", [x, np.zeros(0, np.float32), np.array([1, 1, 1, 0.5], np.float32)],
             {"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, opset=11,
             const_inputs=(1, 2))
    # outputs 0, 1 -> x_original 1, 3 -> elements 1 and 3
    np.testing.assert_array_equal(y.reshape(-1), [1.0, 3.0])


def test_resize_large_input_is_vectorised() -> None:
    """A 2x bilinear upsample of a (1, 8, 64, 64) map runs in a handful of numpy passes."""
    x = f32(1, 8, 64, 64)
    y = _run("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "linear"},
             const_inputs=(2,))
    assert y.shape == (1, 8, 128, 128) and y.dtype == np.float32
    # half_pixel x2: output 2k + 1 sits at 0.25 past input k (interior pixels)
    np.testing.assert_allclose(y[0, :, 3, 3], 0.75 * 0.75 * x[0, :, 1, 1] + 0.75 * 0.25 * (
        x[0, :, 1, 2] + x[0, :, 2, 1]) + 0.0625 * x[0, :, 2, 2], rtol=1e-5, atol=1e-6)


def test_conv_transpose_output_padding_holds_the_bias() -> None:
    x = np.ones((1, 1, 2, 2), np.float32)
    w = np.ones((1, 1, 1, 1), np.float32)
    b = np.array([0.5], np.float32)
    y = _run("ConvTranspose", [x, w, b], {"strides": [2, 2], "output_padding": [1, 1]},
             const_inputs=(1, 2))
    np.testing.assert_array_equal(y[0, 0], [[1.5, 0.5, 1.5, 0.5], [0.5] * 4,
                                            [1.5, 0.5, 1.5, 0.5], [0.5] * 4])


def test_conv_transpose_groups_are_independent_convolutions() -> None:
    """group=2 with 3 output channels per group equals two group-1 ConvTransposes side by side
    (the evaluator assumes one output channel per group, so it cannot be the oracle here)."""
    x, w, b = f32(2, 4, 3, 3), f32(4, 3, 3, 2), f32(6)
    attrs = {"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}
    y = _run("ConvTranspose", [x, w, b], {**attrs, "group": 2}, const_inputs=(1, 2))
    parts = []
    for g in range(2):
        ins = [x[:, 2 * g : 2 * g + 2], w[2 * g : 2 * g + 2], b[3 * g : 3 * g + 3]]
        _, proto = make_node("ConvTranspose", ins, attrs)
        parts.append(reference_outputs(proto, ins)[0])
    np.testing.assert_allclose(y, np.concatenate(parts, axis=1), rtol=1e-5, atol=1e-5)


def test_resize_negative_axes_and_exact_int64() -> None:
    x = ints(1, 2, 3, 4, lo=-(2**62), hi=2**62)
    y = _run("Resize", [x, None, None, i64(8)], {"axes": [-1], "nearest_mode": "floor",
                                                 "coordinate_transformation_mode": "asymmetric"},
             const_inputs=(3,))
    np.testing.assert_array_equal(y, np.repeat(x, 2, axis=-1))  # no float64 round trip


def test_conv_transpose_refusals() -> None:
    x, w = f32(1, 4, 3, 3), f32(4, 2, 3, 3)
    assert "divisible by group=3" in _reason("ConvTranspose", [x, w], {"group": 3})
    assert "kernel_shape" in _reason("ConvTranspose", [x, w], {"kernel_shape": [2, 2]})
    assert "float" in _reason("ConvTranspose", [x.astype(np.int32), w.astype(np.int32)])


def test_group_norm_parameter_shapes_follow_the_opset() -> None:
    x = f32(1, 4, 2, 2)
    assert "one value per group" in _reason("GroupNormalization", [x, f32(4), f32(4)],
                                            {"num_groups": 2}, opset=18)
    assert "one value per channel" in _reason("GroupNormalization", [x, f32(2), f32(2)],
                                              {"num_groups": 2}, opset=21)
    assert "not divisible" in _reason("GroupNormalization", [x, f32(4), f32(4)], {"num_groups": 3})


def test_depth_space_refusals() -> None:
    assert "divisible" in _reason("DepthToSpace", [f32(1, 6, 2, 2)], {"blocksize": 2})
    assert "rank-4" in _reason("SpaceToDepth", [f32(1, 4, 4)], {"blocksize": 2})
    # before opset 28 SpaceToDepth has no mode: CRD is ignored (DCR), as onnx defines it
    x = f32(1, 1, 4, 4)
    dcr = _run("SpaceToDepth", [x], {"blocksize": 2}, opset=13)
    assert np.array_equal(_run("SpaceToDepth", [x], {"blocksize": 2, "mode": "CRD"}, opset=13), dcr)


# -- what the region backends are refused (impls/region_quirks.py, measured differences) ------


def _node(op: str, inputs: list, attrs: dict | None = None, *, out: tuple[int, ...] | None = None,
          dtype: Any = np.float32, **kw: Any) -> Any:
    node, _ = make_node(op, inputs, attrs, output_shapes=[out], output_dtypes=[dtype], **kw)
    return node


_X = np.zeros((1, 2, 4, 5), np.float32)
_S = np.array([1, 1, 1.3, 1.5], np.float32)  # fractional resized lengths 5.2 and 7.5
QUIRKS = [
    # (what, node, the library, words of its reason)
    ("align_corners fractional", _node("Resize", [_X, None, _S],
                                       {"coordinate_transformation_mode": "align_corners"},
                                       out=(1, 2, 5, 7), const_inputs=(2,)), "both", "integer output length"),
    ("tf_crop fractional", _node("Resize", [_X, np.zeros(8, np.float32), _S],
                                 {"coordinate_transformation_mode": "tf_crop_and_resize"},
                                 out=(1, 2, 5, 7), const_inputs=(1, 2)), "both", "tf_crop_and_resize"),
    ("half_pixel_symmetric", _node("Resize", [_X, None, _S],
                                   {"coordinate_transformation_mode": "half_pixel_symmetric"},
                                   out=(1, 2, 5, 7), const_inputs=(2,)), "ov", "does not convert"),
    ("antialias", _node("Resize", [_X, None, _S], {"mode": "linear", "antialias": 1}, out=(1, 2, 5, 7),
                        const_inputs=(2,)), "ov", "antialiased"),
    ("channel resize", _node("Resize", [_X, None, np.array([1, 2, 1, 1], np.float32)], {"mode": "linear"},
                             out=(1, 4, 4, 5), const_inputs=(2,)), "ov", "channel"),
    ("channel and spatial resize", _node("Resize", [_X, None, np.array([1, 2, 2, 2], np.float32)],
                                         {"mode": "linear"}, out=(1, 4, 8, 10), const_inputs=(2,)),
     "both", "Resize"),
    ("rank 6", _node("Resize", [np.zeros((1, 1, 1, 2, 2, 2), np.float32), None,
                                np.array([1, 1, 1, 2, 1, 1], np.float32)], out=(1, 1, 1, 4, 2, 2),
                     const_inputs=(2,)), "ov", "crashes"),
    ("uint8 linear", _node("Resize", [_X.astype(np.uint8), None, np.array([1, 1, 2, 2], np.float32)],
                           {"mode": "linear"}, out=(1, 2, 8, 10), dtype=np.uint8, const_inputs=(2,)),
     "ort", "rounds differently"),
    ("upper-case einsum", _node("Einsum", [np.zeros((3, 4), np.float32), np.zeros((4, 2), np.float32)],
                                {"equation": "Ab,bc"}, out=(3, 2)), "ort", "lower-case"),
    ("ellipsis spans", _node("Einsum", [np.zeros((2, 1, 3, 4), np.float32), np.zeros((5, 4, 2), np.float32)],
                             {"equation": "...ij,...jk->...ik"}, out=(2, 5, 3, 2)), "ort", "ellipsis"),
    ("implicit trace", _node("Einsum", [np.zeros((4, 4), np.float32)], {"equation": "ii"}, out=()),
     "ov", "implicit-output"),
    ("SpaceToDepth CRD", _node("SpaceToDepth", [np.zeros((1, 2, 4, 4), np.float32)],
                               {"blocksize": 2, "mode": "CRD"}, out=(1, 8, 2, 2), opset=28), "ov", "CRD"),
    ("DepthToSpace int32", _node("DepthToSpace", [np.zeros((1, 4, 2, 2), np.int32)], {"blocksize": 2},
                                 out=(1, 1, 4, 4), dtype=np.int32), "ort", "no DepthToSpace kernel"),
]


@pytest.mark.parametrize(("what", "node", "lib", "words"), QUIRKS, ids=[q[0] for q in QUIRKS])
def test_region_backends_refuse_what_they_compute_differently(what: str, node: Any, lib: str,
                                                              words: str) -> None:
    from impls.region_quirks import onnxruntime_reason, openvino_reason

    for name, reason in (("ov", openvino_reason), ("ort", onnxruntime_reason)):
        why = reason(node)
        if lib in (name, "both"):
            assert why is not None and words in why, (name, why)
        else:
            assert why is None, (name, why)


def test_region_backends_take_the_common_exporter_resizes() -> None:
    """Nearest x2 (asymmetric floor) and bilinear half_pixel / pytorch_half_pixel of H and W,
    as PyTorch exports them, stay offered to both libraries."""
    from impls.region_quirks import onnxruntime_reason, openvino_reason

    for attrs in ({"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                  {"mode": "linear"},
                  {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
                  {"mode": "cubic"}, {"mode": "linear", "coordinate_transformation_mode": "align_corners"}):
        node = _node("Resize", [_X, None, np.array([1, 1, 2, 2], np.float32)], attrs,
                     out=(1, 2, 8, 10), const_inputs=(2,))
        assert openvino_reason(node) is None and onnxruntime_reason(node) is None, attrs
