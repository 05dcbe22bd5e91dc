"""numpy reference kernel for Einsum: ``np.einsum(equation, *inputs, optimize=True)``.

Any equation numpy takes is accepted: explicit (``->``) and implicit output (the labels that
occur once, sorted by ASCII code, so upper case first, as ONNX defines), repeated labels
(diagonals and traces), ellipses and spaces (dropped before numpy sees them). float16 computes
in float32 and is rounded back once; float32, float64 and the integer types compute in their own
type (integers wrap on overflow, as in numpy).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import NUMERIC_TYPES, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: a term: letters, at most one ellipsis
_TERM = re.compile(r"^[A-Za-z]*(\.\.\.)?[A-Za-z]*$")


def equation_reason(equation: Any, n_inputs: int) -> str | None:
    """Why ``equation`` is not an einsum equation over ``n_inputs`` operands, or ``None``."""
    if not isinstance(equation, str) or not equation.replace(" ", ""):
        return f"Einsum needs a non-empty equation string; received {equation!r}"
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        return f"Einsum equation {equation!r} has {len(terms)} input terms for {n_inputs} inputs"
    bad = [t for t in [*terms, *([rhs] if arrow else [])] if not _TERM.match(t)]
    if bad or "->" in rhs:
        return (
            f"Einsum equation {equation!r}: term {bad[0] if bad else rhs!r} is not letters "
            f"with at most one ellipsis"
        )
    if arrow:
        missing = sorted(set(rhs.replace("...", "")) - set(lhs))
        if missing:
            return f"Einsum equation {equation!r}: output labels {missing} occur in no input"
        if len(set(rhs.replace("...", ""))) != len(rhs.replace("...", "")):
            return f"Einsum equation {equation!r} repeats an output label"
    return None


def _supports_einsum(node: Node) -> str | None:
    if not node.inputs or any(v is None for v in node.inputs):
        return "Einsum needs one or more (non-omitted) inputs"
    reason = first_reason(
        check_dtypes(node, NUMERIC_TYPES, range(len(node.inputs)), same=True),
        equation_reason(node.attr("equation"), len(node.inputs)),
    )
    if reason:
        return reason
    eq = str(node.attr("equation")).replace(" ", "")
    terms = eq.partition("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, v in zip(terms, node.inputs):
        if v.shape is None:
            continue
        labels = term.replace("...", "")
        if (("..." in term and len(v.shape) < len(labels))
                or ("..." not in term and len(v.shape) != len(labels))):
            return f"Einsum term {term!r} does not fit input {v.name!r} of shape {list(v.shape)}"
        head = term.partition("...")[0]
        dims = list(v.shape[: len(head)]) + list(v.shape[len(v.shape) - len(labels) + len(head) :])
        for label, d in zip(labels, dims):
            if d != 1 and sizes.setdefault(label, d) != d:
                return f"Einsum label {label!r} has sizes {sizes[label]} and {d} in {equation_text(node)}"
    return None


def equation_text(node: Node) -> str:
    """The node's equation quoted, for messages."""
    return repr(str(node.attr("equation")))


@impls.register("Einsum", "numpy", priority=Priority.DEFAULT, supports=_supports_einsum)
def einsum_numpy(node: Node) -> Kernel:
    """Einsum: np.einsum with an optimised contraction order (float16 computed in float32)."""
    equation = str(node.attr("equation")).replace(" ", "")

    def run(*xs: np.ndarray) -> np.ndarray:
        dtype = xs[0].dtype
        with np.errstate(all="ignore"):  # IEEE: overflow to inf, inf * 0 = NaN
            if dtype == np.float16:
                y = np.einsum(equation, *(x.astype(np.float32) for x in xs), optimize=True)
            else:
                y = np.einsum(equation, *xs, optimize=True)
        return np.asarray(y, dtype=dtype, order="C")

    return run
