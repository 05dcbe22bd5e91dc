"""The inputs a tuning run checks and times plans on (issue 31): the user's representative
inputs (:attr:`tuner.tune_types.TuneOptions.inputs`) or seeded random ones, the values they
compute for candidates over dynamic values, and the reference's outputs every plan must match.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dispatch.errors import OpDispatchError
from dispatch.executor import Executor
from dispatch.feeds import check_feeds
from dispatch.graph import Graph
from dispatch.plan import Plan
from dispatch.registry import Registry
from dispatch.subgraph import data_decides
from tuner.measure import capture_values
from tuner.tune_types import TuneOptions, TuningError
from tuner.validate import _random_feeds

#: further random inputs every validated plan of a model with dynamic values or control flow
#: must match the reference on, when the user gives none (an If's branch, a NonZero's output
#: length follow the data)
EXTRA_CHECK_INPUTS = 3

Feeds = dict[str, np.ndarray]
HINT = "give representative inputs (opdispatch tune --inputs FILE.npz, Session.tune(inputs=[...]))"


def checked_inputs(graph: Graph, opts: TuneOptions) -> list[Feeds]:
    """``opts.inputs`` checked against ``graph``'s inputs (names, dtypes and the shapes being
    tuned), else one set of seeded random inputs."""
    if not opts.inputs:
        return [_random_feeds(graph, opts.seed)]
    out = []
    for k, given in enumerate(opts.inputs):
        try:
            out.append(check_feeds(graph, given))
        except OpDispatchError as exc:
            raise TuningError(f"tuning input {k + 1} of {len(opts.inputs)}: {exc}") from None
    return out


def captured_values(graph: Graph, registry: Registry, feeds: Feeds, opts: TuneOptions,
                    say: Callable[[str], None]) -> dict[str, np.ndarray] | None:
    """Every value the reference computes from ``feeds``, for a model whose paths or sizes
    follow the data (:func:`dispatch.subgraph.data_decides`); ``None`` for any other, or when
    the reference cannot run ``feeds`` (random data the model cannot take: their candidates
    then go unmeasured, and ``say`` hears why)."""
    if not data_decides(graph):
        return None
    try:
        return capture_values(graph, registry, feeds)
    except Exception as exc:  # random data the model cannot run on (an If on a rate)
        say(f"the dynamic values could not be computed from the "
            f"{'given' if opts.inputs else 'random'} tuning inputs ({type(exc).__name__}: "
            f"{str(exc)[:200]}); their candidates are not measured"
            + ("" if opts.inputs else f"; {HINT}"))
        return None


def reference_outputs(graph: Graph, registry: Registry, reference_plan: Plan,
                      inputs: Sequence[Feeds], opts: TuneOptions
                      ) -> tuple[Feeds, list[np.ndarray], list[tuple[Feeds, list[np.ndarray]]]]:
    """The inputs plans are timed on, the reference's outputs for them, and the further
    (inputs, reference outputs) every plan must match too: the user's other inputs, else,
    for a model whose paths or sizes follow the data, :data:`EXTRA_CHECK_INPUTS` random ones
    (those the reference cannot run are left out). Raises :class:`TuningError` when the
    reference cannot run the user's inputs or the first random one."""
    ex = Executor(graph, reference_plan, registry)
    feeds = inputs[0]
    try:
        reference = ex.run(feeds)
    except Exception as exc:
        raise TuningError(
            f"the reference plan cannot run the {'first given' if opts.inputs else 'random'} "
            f"tuning input ({type(exc).__name__}: {exc})"
            + ("" if opts.inputs else f"; the model needs meaningful inputs: {HINT}")) from exc
    extras = list(inputs[1:])
    if data_decides(graph) and not opts.inputs:
        extras = [_random_feeds(graph, opts.seed + k) for k in range(1, EXTRA_CHECK_INPUTS + 1)]
    more = []
    for extra in extras:
        try:
            more.append((extra, ex.run(extra)))
        except Exception as exc:
            if opts.inputs:
                raise TuningError(f"the reference plan cannot run tuning input "
                                  f"{len(more) + 2} ({type(exc).__name__}: {exc})") from exc
    return feeds, reference, more
