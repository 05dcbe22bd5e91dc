"""Runs registered implementations on the edge cases of :mod:`numerics_cases` the way the
tuner's measurement does (tuner.measure: candidates from ``enumerate_candidates``, standard
inputs converted to the candidate's layouts along the registry's cheapest converter chain,
outputs converted back) and compares them with the numpy reference.

The reference values of every tensor of a case come from the reference implementations
(``tuner.measure.reference_impl``: the first numpy implementation that supports the node). A
candidate whose implementation *is* the node's reference is compared with onnx's own
``ReferenceEvaluator`` instead, so that the reference is checked too and no comparison is of an
implementation with itself.

Comparison (:func:`compare`): same shape and dtype; non-float outputs equal; NaN exactly where
the reference has NaN, +-inf exactly where it has +-inf, finite where it is finite, and there
``|out - ref| <= atol * scale + rtol * |ref|`` with ``scale`` the largest finite ``|ref|``
(so the tolerance follows the output's magnitude, 1e-30 or 1e30 alike) and (rtol, atol) the
tuner's per-op tolerance unless a documented difference widens it. A kernel that flushes
denormal results to zero passes where the output also holds normal values (a 1e-40 error is
within 1e-6 of an output scale of 1e-30); where every output is denormal it does not.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx.reference import ReferenceEvaluator

from dispatch.executor import reference_kernels, run_reference
from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node
from dispatch.onnx_import import import_model
from dispatch.registry import STANDARD, Implementation, Registry
from tests.native.support import registry
from tests.reliability.cases_contrib import ORACLES as CONTRIB_ORACLES
from tests.reliability.numerics_cases import Case, cases, with_all_outputs
from tuner.candidates import Candidate, CandidateSet, enumerate_candidates
from tuner.measure import _convert, reference_impl, tolerance


@dataclass
class Prepared:
    """A case imported, with its candidates and the reference value of every tensor."""

    case: Case
    graph: Graph
    candidates: CandidateSet
    #: tensor name -> value from the numpy reference implementations
    env: dict[str, np.ndarray]
    #: tensor name -> value from onnx's ReferenceEvaluator (filled on first use)
    onnx_env: dict[str, np.ndarray] = field(default_factory=dict)

    def onnx_values(self) -> dict[str, np.ndarray]:
        if not self.onnx_env:
            model = with_all_outputs(self.case.model)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sess = ReferenceEvaluator(model)
                outs = sess.run(None, self.case.feeds)
            self.onnx_env = {o.name: np.asarray(v) for o, v in zip(model.graph.output, outs)}
        return self.onnx_env


def _lrn64(node: Node, x: np.ndarray) -> np.ndarray:
    """LRN by the ONNX formula in float64."""
    size, alpha = int(node.attr("size")), float(node.attr("alpha", 1e-4))
    beta, bias = float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    x64, c = x.astype(np.float64), x.shape[1]
    sq = np.zeros_like(x64)
    for k in range(c):
        lo, hi = max(0, k - (size - 1) // 2), min(c - 1, k + -(-(size - 1) // 2))
        sq[:, k] = np.square(x64[:, lo:hi + 1]).sum(axis=1)
    return (x64 / (bias + alpha / size * sq) ** beta).astype(x.dtype)


def _log_softmax64(node: Node, x: np.ndarray) -> np.ndarray:
    """LogSoftmax as x - max - log(sum(exp(x - max))) in float64."""
    axis = int(node.attr("axis", -1))
    x64 = x.astype(np.float64)
    d = x64 - x64.max(axis=axis, keepdims=True)
    return (d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(x.dtype)


def _onehot(node: Node, indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> np.ndarray:
    """OneHot by selection: on_value at (indices mod depth) along axis, off_value elsewhere."""
    d, axis = int(np.asarray(depth).reshape(-1)[0]), int(node.attr("axis", -1))
    moved = np.moveaxis(np.zeros((*indices.shape, d), bool), -1, axis % (indices.ndim + 1))
    out = np.full(moved.shape, values[0], values.dtype)
    for pos in np.ndindex(indices.shape):
        k = int(indices[pos])
        if -d <= k < d:
            full = list(pos)
            full.insert(axis % (indices.ndim + 1), k % d)
            out[tuple(full)] = values[1]
    return out


def _quantize64(node, x, scale, zero_point=None):
    """QuantizeLinear in float64, saturating (onnx's ReferenceEvaluator casts rint(x / scale)
    to int32 first, so values past 2**31 wrap: 1e30 / 0.05 quantizes to 0, not 255); NaN gives
    the type's minimum (undefined in ONNX; onnxruntime's choice)."""
    zp = np.zeros((), np.uint8) if zero_point is None else np.asarray(zero_point)
    lo, hi = np.iinfo(zp.dtype).min, np.iinfo(zp.dtype).max
    axis = int(node.attrs.get("axis", 1)) % max(np.ndim(x), 1)
    view = [1] * np.ndim(x)
    if np.size(scale) > 1:
        view[axis] = -1
    s = np.asarray(scale, np.float64).reshape(view if np.size(scale) > 1 else ())
    z = zp.astype(np.float64).reshape(view if zp.size > 1 else ())
    y = np.rint(np.asarray(x, np.float64) / s) + z
    return np.clip(np.where(np.isnan(y), lo, y), lo, hi).astype(zp.dtype)


#: float64 formulas that check the reference implementation of an op where onnx's
#: ReferenceEvaluator is not an oracle: its LRN loops over the batch axis where it means the
#: channels (onnx/reference/ops/op_lrn.py: ``for c in range(x.shape[0])``), so the square sums
#: of channels >= N stay zero (errors ~3e-4 on N(0, 1) inputs); its LogSoftmax is
#: log(softmax(x)): -inf where the softmax underflows (inputs ~1e30) and log-softmax is finite.
#: Its OneHot computes hit * (on - off) + off: NaN everywhere once on or off is NaN or both are
#: infinite, where ONNX selects on_value or off_value. An oracle takes all of the node's inputs.
ORACLES = {"LRN": _lrn64, "LogSoftmax": _log_softmax64, "OneHot": _onehot, "QuantizeLinear": _quantize64,
           **CONTRIB_ORACLES}  # by registry op key: onnxruntime's contrib operators, which it lacks


def reference_env(reg: Registry, graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of ``graph`` from the reference implementations."""
    env = dict(feeds)
    run_reference(reference_kernels(reg, graph.nodes), env)
    return env


@functools.cache
def prepared(op: str, edge: str) -> tuple[Prepared, ...]:
    """The cases of ``op`` for ``edge``, imported, enumerated and evaluated (once per process)."""
    reg = registry()
    out = []
    for case in cases(op, edge):
        graph = import_model(case.model)
        env = reference_env(reg, graph, case.feeds)
        out.append(Prepared(case, graph, enumerate_candidates(graph, reg), env))
    return tuple(out)


def candidates_of(p: Prepared, impl: Implementation) -> list[Candidate]:
    """``impl``'s candidates in case ``p`` (each node set once)."""
    seen: set[tuple[str, ...]] = set()
    found = []
    for c in p.candidates.candidates:
        if c.impl is impl and c.nodes not in seen:
            seen.add(c.nodes)
            found.append(c)
    return found


def rejections_of(p: Prepared, impl: Implementation) -> list[str]:
    """The reasons ``impl`` was rejected for the nodes of case ``p``."""
    return [r.reason for rs in p.candidates.rejected.values() for r in rs if r.impl == impl.name]


def covered_nodes(cand: Candidate) -> list[Node]:
    return list(cand.node.nodes) if isinstance(cand.node, FusedNode) else [cand.node]


def run_candidate(reg: Registry, cand: Candidate, env: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``cand`` on the reference values of its inputs (converted to its layouts, copies
    so that a kernel cannot change the reference) and return its outputs in the standard
    layout, checking each output's physical shape against its layout's."""
    ins = []
    for v, lay in zip(cand.node.inputs, cand.layouts_in):
        if v is None:
            ins.append(None)
            continue
        arr = np.array(env.get(v.name, v.const), copy=True)
        ins.append(_convert(reg, arr, v, STANDARD, lay))
    out = cand.impl.build(cand.node)(*ins)
    outs = list(out) if isinstance(out, tuple | list) else [out]
    result = []
    for v, arr, lay in zip(cand.node.outputs, outs, cand.layouts_out):
        arr = np.asarray(arr)
        if v.shape is not None:  # a dynamic value (shape=None) is sized by the data
            want = reg.layouts.layout(lay).stored_shape(v.shape)
            if tuple(arr.shape) != tuple(want):
                raise AssertionError(f"{cand.impl.name} returned physical shape {arr.shape} in "
                                     f"{lay}, expected {want}")
        result.append(_convert(reg, arr, v, lay, STANDARD))
    return result


@dataclass(frozen=True)
class Tolerance:
    """How closely an output must match (see the module docstring); the flags relax the
    non-finite rules for documented differences only."""

    rtol: float
    atol: float
    #: NaN is accepted where the reference is +-inf (inf - inf inside a transform or sum)
    nan_where_inf: bool = False
    #: NaN is accepted anywhere (an intermediate overflows where the reference's does not)
    nan_anywhere: bool = False
    #: any value is accepted where the reference is NaN (the result is undefined)
    any_where_nan: bool = False
    #: any value is accepted where the reference is +-inf or NaN
    any_where_nonfinite: bool = False
    #: +-inf is accepted where the reference is finite but of magnitude >= HUGE (a kernel whose
    #: intermediate, x * x or x**3, overflows where the reference's formula does not)
    inf_where_huge: bool = False
    #: the output is not compared at all (a library that flushes denormal operands to zero:
    #: booleans of comparisons and quotients by denormals differ wholesale); only that it runs
    #: and gives the reference's shape and dtype is checked
    not_compared: bool = False
    #: an integer (quantized) output may differ by this many steps (dispatch.compare.QUANTIZED_STEPS)
    steps: int = 0


#: the magnitude from which :attr:`Tolerance.inf_where_huge` accepts an infinite output
HUGE = 1e37


def compare(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> str | None:
    """``None`` when ``out`` matches ``ref`` (see the module docstring), else what differs."""
    out, ref = np.asarray(out), np.asarray(ref)
    rtol, atol = tol.rtol, tol.atol
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"{out.dtype}{list(out.shape)} where the reference gives {ref.dtype}{list(ref.shape)}"
    if tol.not_compared:
        return None
    if ref.dtype.kind not in "fc":
        if tol.steps and ref.dtype.kind in "iu" and (
                not ref.size or int(np.abs(out.astype(np.int64) - ref.astype(np.int64)).max()) <= tol.steps):
            return None
        if not np.array_equal(out, ref):
            return f"differs at {int(np.count_nonzero(out != ref))} of {ref.size} elements"
        return None
    o, r = out.astype(np.float64), ref.astype(np.float64)
    keep = np.ones(r.shape, bool)
    if tol.any_where_nan:
        keep &= ~np.isnan(r)
    if tol.any_where_nonfinite:
        keep &= np.isfinite(r)
    if tol.nan_where_inf:
        keep &= ~(np.isinf(r) & np.isnan(o))
    if tol.nan_anywhere:
        keep &= ~np.isnan(o)
    if tol.inf_where_huge:
        keep &= ~(np.isinf(o) & np.isfinite(r) & (np.abs(r) >= HUGE) & (np.sign(o) == np.sign(r)))
    o, r = o[keep], r[keep]
    for what, mask_r, mask_o in (
        ("NaN", np.isnan(r), np.isnan(o)),
        ("+inf", np.isposinf(r), np.isposinf(o)),
        ("-inf", np.isneginf(r), np.isneginf(o)),
    ):
        if not np.array_equal(mask_r, mask_o):
            k = int(np.argmax(mask_r != mask_o))
            return (f"{what} at {int(np.count_nonzero(mask_r))} elements in the reference, "
                    f"{int(np.count_nonzero(mask_o))} in the output (first difference at flat "
                    f"index {k}: output {o.ravel()[k]:.6g}, reference {r.ravel()[k]:.6g})")
    finite = np.isfinite(r)
    if not finite.any():
        return None
    rf, of = r[finite], o[finite]
    scale = float(np.abs(rf).max())
    err = np.abs(of - rf)
    bound = atol * scale + rtol * np.abs(rf)
    if (err > bound).any():
        k = int(np.argmax(err - bound))
        return (f"max abs error {float(err.max()):.3g} (at {of[k]:.6g} vs reference {rf[k]:.6g}) "
                f"exceeds rtol {rtol:g} / atol {atol:g} x output scale {scale:.3g}")
    return None


def check_candidate(reg: Registry, p: Prepared, cand: Candidate,
                    tol: Tolerance | None = None) -> str | None:
    """``None`` when ``cand`` matches the reference on case ``p``, else why not. The
    reference implementation of a node is checked against onnx's ReferenceEvaluator."""
    nodes = covered_nodes(cand)
    is_reference = (not cand.fused and cand.node.op_type != "Region"
                    and reference_impl(reg, cand.node) is cand.impl)
    if is_reference and cand.node.key_op in ORACLES:
        with np.errstate(all="ignore"):
            args = [p.env.get(i.name, i.const) for i in cand.node.inputs if i is not None]
            got = ORACLES[cand.node.key_op](cand.node, *args)
        # (an oracle of several outputs returns a tuple of them)
        expected = dict(zip((v.name for v in cand.node.outputs), got if isinstance(got, tuple) else (got,)))
    else:
        expected = p.onnx_values() if is_reference else p.env
    try:
        outs = run_candidate(reg, cand, p.env)
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"
    tol = tol or Tolerance(*tolerance(nodes))
    for k, (o, v) in enumerate(zip(outs, cand.node.outputs)):
        if v.name not in expected:
            return f"no reference value for output {v.name}"
        wrong = compare(o, expected[v.name], tol)
        if wrong:
            against = "onnx's ReferenceEvaluator" if is_reference else "the numpy reference"
            return f"output {k} ({v.name}) against {against}: {wrong}"
    return None


def impls_under_test(reg: Registry) -> list[Implementation]:
    """Every registered float32 implementation of every available backend (the reduced-precision
    region variants differ from the reference by design: tests/accuracy checks them against it
    within their own tolerances, and the accuracy objective measures what they cost)."""
    avail = set(reg.available_backends())
    return [i for i in reg.implementations if i.backend in avail and i.precision == "float32"]


def op_keys(reg: Registry) -> list[str]:
    """Every op key of the registry with an implementation of an available backend (the
    region op excluded: regions run over every other op's cases)."""
    return sorted({i.op for i in impls_under_test(reg) if not i.is_region})


__all__: Sequence[str] = [
    "Prepared", "Tolerance", "candidates_of", "check_candidate", "compare", "impls_under_test", "op_keys",
    "prepared", "registry", "rejections_of", "run_candidate",
]
