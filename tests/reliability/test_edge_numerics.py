"""Numerics on edge shapes and values (issue 7): every implementation against the reference,
every layout converter round trip bit for bit.

Implementations: every registered implementation of every available backend, taken from the
registry (single-node, fused patterns, and the library region implementations over every op's
cases: a fused pattern's case as the region of the whole pattern; a library's settings variant,
onnxruntime's session_extended, over the ops its setting changes), on the edge kinds of
:mod:`tests.reliability.numerics_cases` — 1x1 spatial, channel counts not divisible by the
block, batch 3, tiny (~1e-30 and denormal), huge (~1e30), overflowing (~3e38), zero, and
non-finite (NaN, +-inf) inputs. Each (implementation, edge kind) is one test that runs the
implementation on every case of its op where the tuner would offer it (its ``supports()`` and
layouts accept the node) and compares with the reference (see numerics_harness). Where it is
not offered, its refusal must carry a reason; an implementation that runs no case of an edge
kind at all must be listed in :data:`REFUSALS` with the reason it gives.

Layouts: every registered layout's from_standard / to_standard round trip and every direct
converter (against its two-step chain through the standard layout) on edge shapes filled with
edge values (denormals, +-0, +-inf, NaN, float32 max), compared bit for bit, padding zero.

``test_summary`` prints the figures (implementations, layouts, converters, cases, runs);
:data:`DIFFERENCES` and :data:`REFUSALS` document, with reasons, every relaxation; the controls
at the end show that the comparison fails deliberately wrong implementations.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np
import pytest

from dispatch.registry import STANDARD, Implementation
from impls import region_quirks
from tests.reliability.cases_contrib import DIFFERENCES as CONTRIB_DIFFERENCES
from tests.reliability.cases_index import DIFFERENCES as INDEX_DIFFERENCES
from tests.reliability.cases_quant import DIFFERENCES as QUANT_DIFFERENCES
from tests.reliability.numerics_cases import BUILDERS, EDGES, VALUE_EDGES
from tests.reliability.numerics_harness import (
    Tolerance,
    candidates_of,
    check_candidate,
    impls_under_test,
    op_keys,
    prepared,
    registry,
    rejections_of,
)

#: Legitimate numerical differences from the reference: (implementation glob, op glob, edge
#: glob) -> (the tolerance of those cases only, why).
DIFFERENCES: dict[tuple[str, str, str], tuple[Tolerance, str]] = {
    ("Conv.numpy.winograd", "Conv", "overflow"): (
        Tolerance(1e-3, 1e-4, nan_where_inf=True),
        "Winograd F(2,3) transforms add and subtract inputs and products before the sum: "
        "with inputs ~3e38 a transformed tile overflows to +-inf and inf - inf gives NaN "
        "where the direct sum (the reference) overflows to +inf",
    ),
    ("*.onednn.*", "Elu", "tiny"): (
        Tolerance(1e-5, 1.0),
        "exp(x) - 1 cancels for |x| < 6e-8 in float32: negative inputs ~1e-30 give 0 where "
        "the reference's expm1 gives x (an absolute error of at most |alpha * x|)",
    ),
    ("Region.onnxruntime.session*", "Elu|Celu|Selu", "tiny"): (
        Tolerance(1e-5, 1.0),
        "onnxruntime's Elu, Celu and Selu compute exp(x) - 1 too (see oneDNN's Elu)",
    ),
    ("Region.onnxruntime.session*", "LRN", "huge|overflow"): (
        Tolerance(1e-4, 1.0, nan_anywhere=True),
        "onnxruntime sums the squares in float32: x**2 of |x| > 1.8e19 overflows, so it gives "
        "x / inf**beta = 0 (or NaN where the sum is inf - inf) where the result is ~1e-12 to "
        "1e-16; the reference sums in float64. Accepted: NaN, or an error up to the output's "
        "magnitude",
    ),
    ("Region.onnxruntime.session*", "LayerNormalization", "overflow"): (
        Tolerance(1e-3, 1e-4, any_where_nan=True),
        "the mean of inputs ~3e38 overflows the float32 stash type (stash_type=1): the "
        "reference gives NaN, onnxruntime finite values; the result is undefined in float32",
    ),
    ("*.onednn.*", "Gelu", "overflow|huge|nonfinite"): (
        Tolerance(1e-3, 1e-4, inf_where_huge=True, nan_where_inf=True),
        "oneDNN 3.x's gelu_erf kernels for AVX-512 evaluate a polynomial in x that overflows: "
        "inputs ~2e38 give +inf where Gelu(x) = x, and +inf gives NaN where the reference "
        "gives inf (measured with oneDNN 3.2 on Sapphire Rapids; its AVX2 kernels match)",
    ),
    # -- non-finite inputs: NaN semantics of max-like operations ---------------------------
    ("*.onednn.*", "Relu|Clip|Exp|Max|Min|MaxPool|GlobalMaxPool|*+Relu|*+Clip", "nonfinite"): (
        Tolerance(1e-3, 1e-4, any_where_nan=True),
        "oneDNN's eltwise, binary max/min, max pooling and post-op kernels return the non-NaN "
        "operand of a max/min (relu(NaN) = 0, max(NaN, x) = x) and its exp gives exp(NaN) = "
        "inf: where the reference propagates NaN, oneDNN may give a number (oneDNN's "
        "documented behaviour; the library is not ours to change)",
    ),
    ("Region.onnxruntime.session*", "MaxPool|GlobalMaxPool|ReduceMax|ReduceMin", "nonfinite"): (
        Tolerance(1e-5, 1e-6, any_where_nan=True),
        "onnxruntime's max/min pooling and reductions skip NaN (the reference, like np.max, "
        "propagates it)",
    ),
    ("Region.onnxruntime.session*", "Clip", "nonfinite"): (
        Tolerance(1e-5, 1e-6, any_where_nonfinite=True),
        "onnxruntime's Clip without a bound clamps to its default bounds +-FLT_MAX, so +-inf "
        "become +-3.4e38",
    ),
    ("Region.onnxruntime.session*", "LRN", "nonfinite"): (
        Tolerance(1e-4, 1e-5, nan_anywhere=True),
        "onnxruntime's LRN turns an inf in a channel window into NaN for its neighbours "
        "(inf / inf); the reference gives x / inf**beta = 0",
    ),
    # -- OpenVINO (CPU plugin): denormals flushed, float32 sums, NaN semantics ---------------
    ("Region.openvino.compiled", "Elu|Celu|Selu|Erf|ConstantOfShape", "tiny"): (
        Tolerance(1e-5, 1.0),
        "OpenVINO's CPU plugin flushes denormals to zero (inputs and constants), and its Elu, "
        "Celu and Selu compute exp(x) - 1, which cancels for tiny x: errors up to the "
        "denormals' magnitude",
    ),
    ("Region.openvino.compiled", "Div|Greater|GreaterOrEqual|Less|LessOrEqual", "tiny"): (
        Tolerance(0.0, 0.0, not_compared=True),
        "OpenVINO flushes denormal operands to zero and divides as x * (1 / y): a quotient by a "
        "denormal is inf and a comparison of denormals is one of zeros, so the results differ "
        "wholesale from the reference's on this edge kind (checked: it runs, shape and dtype)",
    ),
    ("Region.openvino.compiled", "LRN", "huge|overflow"): (
        Tolerance(1e-4, 1.0, nan_anywhere=True),
        "OpenVINO sums the squares in float32, as onnxruntime does (see onnxruntime's LRN)",
    ),
    ("Region.openvino.compiled", "Div", "overflow"): (
        Tolerance(1e-5, 1.0),
        "OpenVINO divides as x * (1 / c): 1 / c of a huge c is a denormal, flushed to zero",
    ),
    ("Region.openvino.compiled", "Clip", "nonfinite"): (
        Tolerance(1e-5, 1e-6, any_where_nonfinite=True),
        "OpenVINO's Clip without a bound clamps to +-FLT_MAX, as onnxruntime's does",
    ),
    ("Region.openvino.compiled",
     "Relu|Clip|Exp|Max|Min|MaxPool|GlobalMaxPool|ReduceMax|ReduceMin|ReduceLogSumExp|Softmax|"
     "LogSoftmax|*+Relu|*+Clip", "nonfinite"): (
        Tolerance(1e-3, 1e-4, any_where_nan=True),
        "OpenVINO's max-like kernels return the non-NaN operand (relu(NaN) = 0, max(NaN, x) = "
        "x), as oneDNN's do (OpenVINO's CPU plugin is built on oneDNN)",
    ),
    ("Region.openvino.compiled", "HardSigmoid|Celu", "nonfinite"): (
        Tolerance(1e-5, 1e-6, any_where_nan=True),
        "OpenVINO's HardSigmoid and Celu clamp with max / min that return the non-NaN operand "
        "(HardSigmoid(NaN) = 1, Celu(NaN) = 0), as its other max-like kernels",
    ),
    ("Region.openvino.compiled", "Shrink|ThresholdedRelu", "nonfinite"): (
        Tolerance(1e-5, 1e-6, nan_anywhere=True),
        "OpenVINO's Shrink and ThresholdedRelu pass NaN through; ONNX's formulas select 0 when "
        "no comparison holds, which the reference (as onnx's) gives for NaN",
    ),
    ("Region.onnxruntime.session*", "ArgMax|ArgMin|Hardmax", "nonfinite"): (
        Tolerance(0.0, 0.0, not_compared=True),
        "ONNX does not order NaN: the reference (as onnx's, np.argmax / np.argmin) ranks NaN "
        "above every number, onnxruntime's ArgMax / ArgMin / Hardmax compare with < / > and "
        "skip NaN or stop at it depending on its position (measured: [1, NaN, 3, 2] gives "
        "ArgMax 2 and ArgMin 0 where the reference gives 1 and 1); indices and 0/1 outputs "
        "cannot be relaxed per element, so they are checked for shape and dtype only "
        "(onnxruntime's TopK ranks NaN as the reference does)",
    ),
    ("Region.openvino.compiled", "ArgMax|ArgMin|Hardmax|TopK", "nonfinite"): (
        Tolerance(0.0, 0.0, not_compared=True),
        "ONNX does not order NaN (see onnxruntime's ArgMax): OpenVINO's ArgMax / ArgMin / "
        "Hardmax skip NaN or stop at it (measured: [1, NaN, 3, 2] gives ArgMax 2 and ArgMin 3 "
        "where the reference gives 1 and 1) and its TopK places NaN anywhere in the order; "
        "checked for shape and dtype only",
    ),
    ("MaxPool.numpy.offsets|AveragePool.numpy.offsets", "*", "nonfinite"): (
        Tolerance(1e-4, 1e-5, nan_anywhere=True),
        "the reference pooling is checked against onnx's ReferenceEvaluator, whose MaxPool "
        "skips NaN and whose AveragePool does not give inf + -inf = NaN; the reference "
        "propagates NaN (np.max, sums), as onnxruntime's AveragePool and the native kernels do",
    ),
    ("Conv.numpy.winograd", "Conv", "nonfinite"): (
        Tolerance(1e-3, 1e-4, nan_anywhere=True),
        "Winograd transforms mix the pixels of a tile: an inf anywhere in a tile becomes "
        "inf - inf = NaN in its neighbours' outputs",
    ),
    ("Conv*.native.nchw*c_grouped", "Conv*", "nonfinite"): (
        Tolerance(1e-3, 1e-4, nan_anywhere=True),
        "KNOWN LIMITATION (reported, not fixed): the grouped kernel multiplies whole 8/16-"
        "channel input blocks by zero-padded weights, so an inf or NaN in one group's channel "
        "reaches the other groups of its block as inf * 0 = NaN (finite inputs are exact; the "
        "depthwise kernel, preferred for group == C, does not have this)",
    ),
}

# the documented differences of the issue-14 index operators live with their cases
DIFFERENCES.update({key: (Tolerance(**kw), why) for key, (kw, why) in INDEX_DIFFERENCES.items()})
DIFFERENCES.update({key: (Tolerance(**kw), why) for key, (kw, why) in QUANT_DIFFERENCES.items()})
DIFFERENCES.update({key: (Tolerance(**kw), why) for key, (kw, why) in CONTRIB_DIFFERENCES.items()})

#: Implementations that cannot run any case of an edge kind: (implementation glob, edge glob)
#: -> a pattern the refusal reason of the cases it was meant for must match (other cases may be
#: refused for other reasons: a rank-2 tensor in a rank-4 layout, a broadcast).
REFUSALS: dict[tuple[str, str], str] = {
    # oneDNN has only its (slow) reference kernel for blocked layouts with a padded channel
    # block when f(0) != 0 (the padding must stay zero), so these refuse C % block != 0; every
    # odd_channels case has such a C
    ("*.onednn.nchw8c*", "odd_channels"): r"f\(0\) != 0 in nchw8c needs whole channel blocks",
    ("*.onednn.nchw16c*", "odd_channels"): r"f\(0\) != 0 in nchw16c needs whole channel blocks",
    # ops OpenVINO computes differently on every input (impls.openvino.region.UNSUPPORTED_OPS),
    # and ops whose outputs' shapes the data decides (NonZero, Unique, Compress,
    # NonMaxSuppression): OpenVINO's compiled models need static shapes
    ("Region.openvino.compiled", "*"): r"never offered to OpenVINO|has a shape known only at "
                                       r"run time, and Region\.openvino\.compiled needs static shapes",
    # and onnxruntime (impls.region_quirks: MeanVarianceNormalization without ONNX's epsilon)
    ("Region.onnxruntime.session*", "*"): r"never offered to onnxruntime",
}


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return True  # unknown: keep the strict rule


if not _has_avx512():
    # nchw16c is an AVX-512 format: without AVX-512 (AMD Zen 3: AVX2) oneDNN has only its
    # reference kernels for it, and the oneDNN nchw16c implementations refuse every case
    _NO_AVX512 = r"oneDNN has only its reference implementation"
    REFUSALS[("*.onednn.nchw16c*", "odd_channels")] += "|" + _NO_AVX512
    REFUSALS[("*.onednn.nchw16c*", "*")] = _NO_AVX512

if not region_quirks.has_vnni():
    # onnxruntime's uint8 x int8 kernels without VNNI saturate pairs of products in 16 bits
    # (impls.region_quirks._onnxruntime_u8s8): its regions widen constant int8 weights to uint8
    # and refuse MatMulInteger's int8 weights computed at run time
    REFUSALS[("Region.onnxruntime.session*", "*")] += r"|saturates on this CPU"

if _has_avx512():
    DIFFERENCES[("Region.openvino.compiled", "Gelu|com.microsoft::Gelu|com.microsoft::BiasGelu",
                 "overflow|nonfinite")] = (
        Tolerance(1e-3, 1e-4, inf_where_huge=True, nan_where_inf=True),
        "OpenVINO 2026.4's CPU Gelu on AVX-512 (its oneDNN eltwise kernel, as oneDNN 3.2's own: "
        "tests/onednn; also what it converts com.microsoft's Gelu and BiasGelu to) overflows to "
        "+inf for inputs ~2e38 where the reference gives x, and gives NaN for +inf; a plan's "
        "NaN/Inf inputs run the guard's fallback (dispatch/guard.py)",
    )

#: (implementation, edge kind) -> candidate runs checked in this process (for test_summary)
RUNS: Counter[tuple[str, str]] = Counter()


#: the operators whose one-node onnxruntime graph the NCHWc transformer rewrites by itself (the
#: layout optimisations: all that level "all" adds to "extended"), and the fused patterns that
#: start with one of them (their next nodes follow it into the blocked layout)
NCHWC_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})
#: ops whose onnxruntime kernels split their work over the intra-op pool (sums of products,
#: reductions, softmax, recurrences, the quantizers' dynamic ranges)
THREADED_OPS = frozenset({"Conv", "MatMul", "Gemm", "Softmax", "ReduceSum", "ReduceMean", "LSTM",
                          "com.microsoft::Attention", "com.microsoft::MatMulNBits",
                          "com.microsoft::DynamicQuantizeMatMul", "com.microsoft::DynamicQuantizeLSTM"})
#: region implementations that are a library's settings variant of another one: they run the
#: ops their setting changes (elsewhere the library runs the same kernels, which its default
#: region implementation's cases check)
SETTINGS_VARIANT_OPS: dict[str, Callable[[str], bool]] = {
    "Region.onnxruntime.session_extended": lambda op: op.split("+")[0] in NCHWC_OPS,
    # one intra-op thread: the ops whose kernels split their work over the pool
    "Region.onnxruntime.session_1thread": lambda op: op.split("+")[0] in THREADED_OPS,
}


def _params() -> list[tuple[str, str, str]]:
    reg = registry()
    keys = op_keys(reg)
    out = []
    for impl in impls_under_test(reg):
        ops = keys if impl.is_region else [impl.op]
        runs = SETTINGS_VARIANT_OPS.get(impl.name)
        for op in ops if runs is None else [k for k in ops if runs(k)]:
            out.extend((impl.name, op, edge) for edge in EDGES)
    return out


PARAMS = _params()


def _id(p: tuple[str, str, str]) -> str:
    impl, op, edge = p
    return f"{impl}-{edge}" if impl.split(".")[0] == op else f"{impl}-{op}-{edge}"


def _match(name: str, globs: str) -> bool:
    """Whether ``name`` matches one of the ``|``-separated globs."""
    return any(fnmatch.fnmatchcase(name, g) for g in globs.split("|"))


def _difference(impl: Implementation, op: str, edge: str) -> Tolerance | None:
    for (ig, og, eg), (tol, _why) in DIFFERENCES.items():
        if _match(impl.name, ig) and _match(op, og) and _match(edge, eg):
            return tol
    return None


def _refusal(impl: Implementation, edge: str) -> str | None:
    for (ig, eg), pattern in REFUSALS.items():
        if _match(impl.name, ig) and _match(edge, eg):
            return pattern
    return None


#: compiled OpenVINO models kept for reuse by later cases of the module, by region digest (see
#: _compile_once), the most recent COMPILED_KEPT
COMPILED: OrderedDict[str, object] = OrderedDict()
COMPILED_KEPT = 64


@pytest.fixture(autouse=True)
def _compile_once(monkeypatch):
    """OpenVINO compiles each region once per module: a case whose region has the digest of
    one compiled before (same nodes, names, attributes, shapes, constants' bytes, settings and
    OpenVINO version: the key of the product's own compiled cache,
    impls.openvino.compiled_cache.region_digest) reuses that compiled model. Measured: 5862
    compiles over OpenVINO's cases, 3682 distinct, ~39 ms each (AMD EPYC, Zen 3 class). The
    most recent :data:`COMPILED_KEPT` are kept (adjacent tests are one op's edge kinds).
    Function-scoped, with the models kept at module level: a module-scoped fixture would put
    the whole module on one pytest-xdist worker (tests/conftest.py groups by such fixtures)."""
    try:
        import openvino as ov

        from impls.openvino import compiled_cache
    except ImportError:
        return
    original = compiled_cache.compile_region

    def compile_region(core, region, config, setting, edges=None):
        key = compiled_cache.region_digest(region, dict(config, edges=edges) if edges else config,
                                           ov.__version__)
        if key in COMPILED:
            COMPILED.move_to_end(key)
            return COMPILED[key]
        compiled = original(core, region, config, setting, edges)
        COMPILED[key] = compiled
        if len(COMPILED) > COMPILED_KEPT:
            COMPILED.popitem(last=False)
        return compiled

    monkeypatch.setattr(compiled_cache, "compile_region", compile_region)


def test_every_op_of_the_registry_has_edge_cases():
    """A new operator or fused pattern cannot escape the edge cases."""
    missing = sorted(set(op_keys(registry())) - set(BUILDERS))
    assert not missing, f"no edge cases for {missing}: add a builder in numerics_cases.py"


@pytest.mark.parametrize(("impl_name", "op", "edge"), PARAMS, ids=[_id(p) for p in PARAMS])
def test_implementation_matches_reference_on_edge_cases(impl_name: str, op: str, edge: str) -> None:
    reg = registry()
    impl = reg.impl(impl_name)
    tol = _difference(impl, op, edge)
    ran, failures, refused = 0, [], []
    for p in prepared(op, edge):
        cands = candidates_of(p, impl)
        if impl.is_region and "+" in op and cands:
            # a fused pattern's case in a library region: the region of the whole pattern (what
            # the library may fuse); its nodes alone are the single operators' cases
            widest = max(len(c.nodes) for c in cands)
            cands = [c for c in cands if len(c.nodes) == widest]
        if not cands:
            reasons = rejections_of(p, impl)
            assert reasons and all(isinstance(r, str) and r.strip() for r in reasons), (
                f"{impl_name} neither ran nor was refused with a reason on {p.case.id}")
            refused.extend(reasons)
            continue
        for cand in cands:
            ran += 1
            wrong = check_candidate(reg, p, cand, tol)
            if wrong:
                failures.append(f"{p.case.id} {cand.id} {list(cand.layouts_in)}->{list(cand.layouts_out)}: "
                                f"{wrong}")
    RUNS[(impl_name, edge)] += ran
    assert not failures, f"{len(failures)} case(s) differ:\n" + "\n".join(failures)
    if ran == 0:
        pattern = _refusal(impl, edge)
        assert pattern is not None, (
            f"{impl_name} ran no {op} case of edge kind {edge!r}; refusals: {sorted(set(refused))}")
        assert any(re.search(pattern, r) for r in refused), (
            f"{impl_name} refused every {op} case of {edge!r} but not with the documented "
            f"reason {pattern!r}: {sorted(set(refused))}")


# -- layouts --------------------------------------------------------------------------------------

LAYOUT_SHAPES: dict[int, list[tuple[int, ...]]] = {
    4: [(1, 1, 1, 1), (1, 16, 1, 1), (2, 17, 1, 1), (1, 3, 5, 5), (3, 7, 3, 3), (1, 33, 2, 3),
        (3, 16, 4, 4), (8, 1, 3, 3), (17, 1, 1, 1)],
    2: [(1, 1), (1, 33), (17, 1), (3, 17), (33, 70)],
}
#: edge values every round-trip tensor starts with (then N(0, 1))
SPECIALS = np.array([0.0, -0.0, 1e-40, -1e-40, 1.4e-45, 1e-30, -1e-30, 1e30, 3.4028235e38,
                     -3.4028235e38, np.inf, -np.inf, np.nan, 1.0, -1.0], np.float32)


def edge_tensor(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A float32 tensor of ``shape``: the edge values in turn, each fourth element random."""
    n = int(np.prod(shape))
    x = np.resize(SPECIALS, n)
    x[3::4] = np.random.default_rng(seed).standard_normal(len(x[3::4])).astype(np.float32)
    return x.reshape(shape)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _layout_params() -> list[tuple[str, tuple[int, ...]]]:
    reg = registry()
    out = []
    for name, lay in reg.layouts.layouts.items():
        if name == STANDARD or lay.precision is not None:  # (lossy by design: below)
            continue
        ranks = [lay.rank] if lay.rank is not None else sorted(LAYOUT_SHAPES)
        out.extend((name, s) for r in ranks for s in LAYOUT_SHAPES[r])
    return out


LAYOUT_PARAMS = _layout_params()


def _shape_id(s: tuple[int, ...]) -> str:
    return "x".join(map(str, s))


def _precision_params() -> list[tuple[str, tuple[int, ...]]]:
    reg = registry()
    return [(n, s) for n, lay in reg.layouts.layouts.items() if lay.precision is not None
            for s in LAYOUT_SHAPES[4][:4] + LAYOUT_SHAPES[2][-2:]]


PRECISION_PARAMS = _precision_params()


@pytest.mark.parametrize(("layout", "shape"), PRECISION_PARAMS,
                         ids=[f"{n}-{_shape_id(s)}" for n, s in PRECISION_PARAMS])
def test_precision_layout_round_trip_rounds_once(layout: str, shape: tuple[int, ...]) -> None:
    """A reduced-precision layout's round trip is lossy by design: it rounds once (a second
    round trip changes nothing, bit for bit, in bf16 and fp16; in u8 it moves by less than a
    step), keeps NaN, the infinities and zeros' signs (bf16,
    fp16), and stays within the precision's step. The u8 layout (ONNX DynamicQuantizeLinear)
    is defined for finite tensors whose range fits float32: the edge tensor's finite part
    below 1e30."""
    reg = registry()
    lay = reg.layouts.layout(layout)
    x = edge_tensor(shape)
    if lay.precision == "int8":
        x = np.where(np.isfinite(x) & (np.abs(x) < 1e30), x, np.float32(0.5)).astype(np.float32)
    (to,) = reg.layouts.converters[(STANDARD, layout)]
    (back,) = reg.layouts.converters[(layout, STANDARD)]
    phys = to(x.copy(), shape)
    assert phys.dtype == lay.stored_type(np.dtype(np.float32)) and phys.shape == shape
    once = back(phys, shape)
    assert once.dtype == np.float32 and once.shape == shape
    twice = back(to(once.copy(), shape), shape)
    if lay.precision in ("bf16", "fp16"):
        np.testing.assert_array_equal(bits(twice), bits(once))
        special = ~np.isfinite(x) | (x == 0)
        np.testing.assert_array_equal(bits(once[special & ~np.isnan(x)]), bits(x[special & ~np.isnan(x)]))
        assert np.isnan(once[np.isnan(x)]).all()
        normal = np.isfinite(x) & (np.abs(x) > 1e-4) & (np.abs(x) < 6e4)  # normal in both
        step = 2.0 ** -8 if lay.precision == "bf16" else 2.0 ** -11
        assert (np.abs(once[normal] - x[normal]) <= step * np.abs(x[normal])).all()
    else:
        scale = (max(0.0, float(x.max())) - min(0.0, float(x.min()))) / 255
        assert np.abs(once - x).max() <= scale / 2 * (1 + 1e-5) + 1e-12
        # not idempotent: the scale is computed anew from the dequantized range, whose ends
        # moved to the grid, so the grid may shift; by less than a step
        assert np.abs(twice - once).max() <= scale * (1 + 1e-5) + 1e-12


#: Layouts that hold only some shapes of their rank: layout -> (predicate on the logical shape,
#: the error its converter raises otherwise). A depthwise weight (M, 1, KH, KW) has no input
#: channel axis to pack.
PARTIAL_LAYOUTS = {
    "Goihw8g": (lambda s: s[1] == 1, "second dimension must be 1"),
    "Goihw16g": (lambda s: s[1] == 1, "second dimension must be 1"),
}


@pytest.mark.parametrize(("layout", "shape"), LAYOUT_PARAMS,
                         ids=[f"{n}-{_shape_id(s)}" for n, s in LAYOUT_PARAMS])
def test_layout_round_trip_is_bit_exact(layout: str, shape: tuple[int, ...]) -> None:
    reg = registry()
    lay = reg.layouts.layout(layout)
    x = edge_tensor(shape)
    to = reg.layouts.converters[(STANDARD, layout)]
    back = reg.layouts.converters[(layout, STANDARD)]
    partial = PARTIAL_LAYOUTS.get(layout)
    if partial is not None and not partial[0](shape):
        for conv in to:
            with pytest.raises(ValueError, match=partial[1]):
                conv(x, shape)
        return
    for f in to:
        phys = f(x.copy(), shape)
        assert phys.dtype == np.float32 and phys.shape == lay.stored_shape(shape), (
            f"{f.name}: {phys.dtype}{phys.shape}, expected float32{lay.stored_shape(shape)}")
        # padding holds zeros only: as many non-zero (NaN included) elements as the tensor
        assert np.count_nonzero(phys) == np.count_nonzero(x), f"{f.name}: non-zero padding"
        for b in back:
            y = b(phys.copy(), shape)
            assert y.shape == shape, f"{b.name}: shape {y.shape}, expected {shape}"
            np.testing.assert_array_equal(bits(y), bits(x), err_msg=f"{f.name} then {b.name}")


def _direct_params() -> list[tuple[str, tuple[int, ...]]]:
    reg = registry()
    return [(c.name, s) for cs in reg.layouts.converters.values() for c in cs if c.direct
            for s in LAYOUT_SHAPES[reg.layouts.layout(c.src).rank or 4]]


DIRECT_PARAMS = _direct_params()


@pytest.mark.parametrize(("converter", "shape"), DIRECT_PARAMS,
                         ids=[f"{n}-{_shape_id(s)}" for n, s in DIRECT_PARAMS])
def test_direct_converter_equals_the_two_step_chain(converter: str, shape: tuple[int, ...]) -> None:
    reg = registry()
    conv = reg.layouts.converter(converter)
    x = edge_tensor(shape, seed=1)
    for to_src in reg.layouts.converters[(STANDARD, conv.src)]:
        src = to_src(x, shape)
        got = conv(src.copy(), shape)
        assert got.shape == reg.layouts.layout(conv.dst).stored_shape(shape)
        for a in reg.layouts.converters[(conv.src, STANDARD)]:
            for b in reg.layouts.converters[(STANDARD, conv.dst)]:
                want = b(a(src.copy(), shape), shape)
                np.testing.assert_array_equal(bits(got), bits(want),
                                              err_msg=f"{conv.name} vs {a.name}, {b.name}")


# -- figures --------------------------------------------------------------------------------------


def test_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Count what this module checks (printed; the figures of docs/RELIABILITY.md). Cases and
    candidate runs are counted from the case builders and the tuner's candidate enumeration,
    so the figures are the same whether or not the other tests ran first."""
    reg = registry()
    impls = impls_under_test(reg)
    cases = runs = 0
    covered: set[tuple[str, str]] = set()
    for op in op_keys(reg):
        for edge in EDGES:
            for p in prepared(op, edge):
                cases += 1
                for impl in impls:
                    if impl.is_region or impl.op == op:
                        n = len(candidates_of(p, impl))
                        runs += n
                        if n:
                            covered.add((impl.name, edge))
    layouts = [n for n in reg.layouts.layouts if n != STANDARD]
    converters = [c for cs in reg.layouts.converters.values() for c in cs]
    by_backend = Counter(i.backend for i in impls)
    lines = [
        f"implementations: {len(impls)} ({', '.join(f'{b} {n}' for b, n in sorted(by_backend.items()))})",
        f"op keys (ops and fused patterns): {len(op_keys(reg))}",
        f"edge kinds: {len(EDGES)} ({', '.join(EDGES)}; value kinds {', '.join(VALUE_EDGES)})",
        f"cases (models): {cases}",
        f"implementation runs checked against the reference: {runs}",
        f"(implementation, edge kind) pairs run: {len(covered)} of {len(impls) * len(EDGES)}",
        f"layouts: {len(layouts)}; converters: {len(converters)} "
        f"({sum(c.direct for c in converters)} direct)",
        f"layout round-trip tests: {len(LAYOUT_PARAMS)}; direct-converter tests: {len(DIRECT_PARAMS)}",
    ]
    with capsys.disabled():
        print("\nedge numerics summary:\n  " + "\n  ".join(lines))
    refused = {(i.name, e) for i in impls for e in EDGES} - covered
    undocumented = sorted(f"{n}/{e}" for n, e in refused if _refusal(reg.impl(n), e) is None)
    assert not undocumented, f"implementations that ran no case of an edge kind: {undocumented}"


# -- regressions ----------------------------------------------------------------------------------


def test_every_operator_has_a_reference_implementation():
    """Regression: LeakyRelu, Elu and HardSwish had oneDNN implementations but no numpy
    reference, so the tuner's check of their candidates failed with LookupError (they could never
    win a tuned plan) and no whole-model reference plan could be built for a model using them."""
    reg = registry()
    ops = {i.op for i in impls_under_test(reg) if not i.pattern and not i.is_region}
    missing = sorted(op for op in ops if not any(i.backend == "numpy" for i in reg.impls_for(op)))
    assert not missing, f"operators without a numpy reference implementation: {missing}"


@pytest.mark.parametrize(("op", "attrs", "x", "want"), [
    ("LeakyRelu", {"alpha": 0.1}, [-2.0, -0.0, 0.0, 3.0, -np.inf], [-0.2, 0.0, 0.0, 3.0, -np.inf]),
    ("Elu", {"alpha": 0.5}, [-1e-30, -np.inf, 0.0, 2.0], [-5e-31, -0.5, 0.0, 2.0]),
    ("HardSwish", {}, [-3.0, -1.5, 0.0, 1.5, 3.0, 1e30], [0.0, -0.375, 0.0, 1.125, 3.0, 1e30]),
])
def test_new_reference_activations(op: str, attrs: dict, x: list[float], want: list[float]) -> None:
    """The reference LeakyRelu, Elu (expm1: exact for tiny inputs) and HardSwish by value."""
    from tests.native.support import case

    arr = np.array(x, np.float32)
    node, _ = case(op, [arr], attrs)
    (impl,) = [i for i in registry().impls_for(op) if i.backend == "numpy"]
    np.testing.assert_allclose(impl.build(node)(arr), np.array(want, np.float32), rtol=1e-6)


def test_reference_kernels_raise_no_floating_point_warnings():
    """Regression: the reference Conv (np.matmul), Gemm, BatchNormalization, LRN, pooling and
    reductions let numpy's RuntimeWarning escape on overflowing inputs (an exception where
    warnings are errors); IEEE overflow to inf is ONNX semantics, not an error."""
    import warnings

    from tests.native.support import case

    x = np.full((1, 2, 3, 3), 3e38, np.float32)
    w = np.full((2, 2, 3, 3), 2.0, np.float32)
    with np.errstate(all="ignore"):  # onnx's evaluator, which builds the node's output shape
        node, _ = case("Conv", [x, w], {"pads": [1, 1, 1, 1]}, const_inputs=[1])
    impl = registry().impl("Conv.numpy.im2col")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = impl.build(node)(x, w)
    assert np.isposinf(y).all()


def test_reference_lrn_of_huge_values_is_not_zero():
    """Regression: the reference LRN squared float32 inputs: x**2 of x ~1e30 overflowed to inf
    and the result, x / (1 + alpha/size * sum x**2)**beta ~1e-12, came out 0."""
    from tests.native.support import case

    x = np.full((1, 3, 1, 1), 1e30, np.float32)
    with np.errstate(all="ignore"):  # onnx's evaluator, which builds the node's output shape
        node, _ = case("LRN", [x], {"size": 3})
    y = registry().impl("LRN.numpy.window").build(node)(x)
    center = 1e30 / (1 + 1e-4 / 3 * 3 * 1e60) ** 0.75
    np.testing.assert_allclose(y[0, 1, 0, 0], center, rtol=1e-5)
    assert (y > 0).all()


NAN_CASES = [
    # (implementation, op, inputs, attrs): a NaN in an operand of max, min, Relu or max pooling
    ("Relu.native.std", "Relu", [np.array([[np.nan, -1.0, 2.0, -np.inf]], np.float32)], {}),
    ("Max.native.std_same", "Max", [np.array([np.nan, 1.0, 2.0], np.float32),
                                    np.array([0.0, np.nan, 1.0], np.float32)], {}),
    ("Min.native.std_same", "Min", [np.array([np.nan, 1.0, 2.0], np.float32),
                                    np.array([0.0, np.nan, 1.0], np.float32)], {}),
    ("MaxPool.native.std", "MaxPool",
     [np.array([[[[1.0, np.nan, 3.0, 0.0], [0.0, 1.0, 2.0, 5.0]]]], np.float32)],
     {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("MaxPool.native.nchw16c", "MaxPool",
     [np.where(np.arange(64).reshape(1, 16, 2, 2) == 5, np.nan, 1.0).astype(np.float32)],
     {"kernel_shape": [2, 2]}),
]


@pytest.mark.parametrize(("impl_name", "op", "inputs", "attrs"), NAN_CASES,
                         ids=[c[0] for c in NAN_CASES])
def test_native_max_like_kernels_propagate_nan(impl_name: str, op: str, inputs: list, attrs: dict) -> None:
    """Regression: native max / min / Relu / max pooling and the Relu / Clip epilogues of the
    fused conv and GEMM kernels used a bare select (a > b ? a : b), which drops a NaN in its
    first operand: Relu(NaN) was 0, max(NaN, 1) was 1, a NaN in a pooling window vanished
    unless it came last, and a fused conv's interior pixels lost NaN that its border pixels
    (scalar std::max) kept. NaN now propagates as in numpy and the reference."""
    from tests.native.support import case, run_in_layouts

    with np.errstate(all="ignore"):
        node, _ = case(op, inputs, attrs)
        want = reference_env_for(node, inputs)
    got = run_in_layouts(registry().impl(impl_name), node, inputs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def reference_env_for(node, inputs: list) -> np.ndarray:
    """The numpy reference's output for ``node`` on ``inputs``."""
    from tuner.measure import reference_impl

    return np.asarray(reference_impl(registry(), node).build(node)(*inputs))


def test_onednn_clip_without_a_bound_keeps_infinities():
    """Regression: the oneDNN Clip wrapper replaced an omitted bound with +-FLT_MAX, so a Clip
    with no max turned +inf inputs into 3.4e38; oneDNN's clip takes infinite bounds."""
    from tests.native.support import case, run_in_layouts

    status = registry().backends.get("onednn")
    if status is None or not status.available:
        pytest.skip(f"onednn is not available here: {status.reason if status else 'not registered'}")
    x = np.array([-np.inf, -1.0, 0.5, np.inf, 3e38], np.float32)
    lo = np.array(-0.5, np.float32)
    node, _ = case("Clip", [x, lo], const_inputs=[1])
    got = run_in_layouts(registry().impl("Clip.onednn.std"), node, [x, lo])[0]
    np.testing.assert_array_equal(got, np.array([-0.5, -0.5, 0.5, np.inf, 3e38], np.float32))


# -- controls: the comparison catches what it is meant to catch -----------------------------------


def _wrong_relu(perturb):
    """A copy of the reference Relu whose kernel applies ``perturb`` to its result."""
    import dataclasses

    ref = registry().impl("Relu.numpy.maximum")

    def build(node):
        kernel = ref.build(node)
        return lambda x: perturb(np.asarray(kernel(x)))

    return dataclasses.replace(ref, name="Relu.control.wrong", backend="control", build=build)


CONTROLS = {
    "relative error 1e-3": ("batch3", lambda y: (y * np.float32(1.001)).astype(np.float32)),
    "tiny values off by 1e-3 of themselves": ("tiny", lambda y: (y * np.float32(1.001)).astype(np.float32)),
    "inf clamped to FLT_MAX": ("nonfinite", lambda y: np.clip(y, np.float32(-3.4028235e38),
                                                              np.float32(3.4028235e38))),
    "NaN turned into 0": ("nonfinite", lambda y: np.nan_to_num(y, nan=0.0, posinf=np.inf, neginf=-np.inf)),
    "one element wrong": ("odd_channels", lambda y: np.where(np.arange(y.size).reshape(y.shape) == 3, y + 1,
                                                             y).astype(np.float32)),
}


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_comparison_catches_a_wrong_implementation(control: str) -> None:
    """Each deliberately wrong Relu fails the comparison on at least one case of its edge kind
    (so a passing implementation test means something). Not a control: flushing denormal
    results to zero (FTZ) passes wherever the output also holds normal values, because the
    tolerance follows the output's magnitude (1e-40 is within 1e-6 of 1e-30)."""
    import dataclasses

    edge, perturb = CONTROLS[control]
    fake = _wrong_relu(perturb)
    reg = registry()
    wrong = []
    for p in prepared("Relu", edge):
        for cand in candidates_of(p, reg.impl("Relu.numpy.maximum")):
            wrong.append(check_candidate(reg, p, dataclasses.replace(cand, impl=fake)))
    assert wrong and any(wrong), f"the control {control!r} passed every {edge} case"
