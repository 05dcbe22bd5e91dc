"""The range plans a Session runs (issue 51): every shape inside a stored range, no plan per shape.

When a Session of a model with symbolic inputs loads its graph, it asks its plan source for the
range plans stored for the model's structure on this machine (:mod:`dispatch.range_plan`),
and builds their ways once. A request whose shapes lie inside one of those ranges runs on the
range plan's bucket for its size: found by a bisection, no import, no planning, nothing kept per
shape. The session's own shape runs on it too when no concrete plan is stored for exactly that
shape. Shapes outside every range take the per-shape path (:mod:`dispatch.shape_sessions`):
their stored plan, else the untuned one; ``require_plan`` raises naming the stored ranges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import ArgumentError, PlanError
from dispatch.feeds import check_declared_feeds, check_output_names
from dispatch.input_shapes import ShapeSet, format_shapes
from dispatch.model_ways import model_file
from dispatch.range_plan import RangeRunner
from dispatch.shape_range import ShapeRange, has_range, parse_dim

if TYPE_CHECKING:
    from dispatch.executor import Executor
    from dispatch.graph import Graph
    from dispatch.plan import Plan


#: feed signatures of other shapes a session remembers as checked (a stream of ever new
#: shapes clears them and starts over)
MAX_CHECKED_SIGNATURES = 1024


class RangeAdapter:
    """A range plan's runner seen as a :class:`~dispatch.plan_runner.PlanRunner` (what a
    Session's own shape runs on when a range plan covers it)."""

    def __init__(self, runner: RangeRunner, order: Sequence[str]) -> None:
        self.range_runner = runner
        self._order = list(order)

    @property
    def executor(self) -> Executor:
        raise PlanError("this session's shapes run on a range plan (whole-model library "
                        "sessions, see Session.describe()): it has no executor of its own")

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None,
            *, timings: list[float] | None = None, on_fault: Callable | None = None,
            ) -> list[np.ndarray]:
        shapes = tuple((n, tuple(np.shape(feeds[n]))) for n in self._order)
        return self.range_runner.run(shapes, feeds, output_names)


def low_end(spec: Mapping[str, Sequence[Any]]) -> dict[str, list[int]]:
    """The smallest concrete shapes of a range spec (each ``LO..HI`` at ``LO``)."""
    return {n: [parse_dim(d, f"shape range of input {n!r}")[0] for d in dims]
            for n, dims in spec.items()}


class RangeMixin:
    """The range plans of a :class:`~dispatch.session.Session` (see the module docstring).

    ``Session(model, input_shapes={"input_ids": [1, "1..512"]})`` runs the range plan stored
    for exactly that range (``require_plan`` raises naming the ranges stored when there is
    none); without a range, any stored range plan of the model's structure serves the shapes
    inside it. :attr:`stored_ranges` lists the ranges the session runs."""

    _ranges: list[tuple[int, RangeRunner]]
    _range_asked: ShapeRange | None
    _range_elsewhere: list[str]

    def _split_range(self, input_shapes: Mapping[str, Sequence[Any]] | None
                     ) -> Mapping[str, Sequence[Any]] | None:
        """``input_shapes`` with a range (``"1..512"``) kept aside in :attr:`_range_spec`
        and replaced by the range's smallest shapes, which the session loads its graph at."""
        self._ranges = []
        #: feed signatures (dispatch.feeds.feed_signature) of other shapes than the session's
        #: own, checked once, with their shapes: their next feeds skip the checks
        self._checked_shapes: dict[tuple, ShapeSet] = {}
        self._own_shapes: tuple = ()
        self._range_asked = None
        self._range_elsewhere = []
        self._range_spec = dict(input_shapes) if has_range(input_shapes) else None
        if self._range_spec is None:
            return input_shapes
        return low_end(self._range_spec)

    def _find_ranges(self, graph: Graph) -> None:
        """Find the range plans stored for ``graph``'s model structure."""
        self._ranges = []
        self._own_shapes = tuple((v.name, tuple(int(d) for d in (v.shape or ())))
                                 for v in graph.inputs)
        if self._range_spec is not None and self._range_asked is None:
            self._range_asked = ShapeRange.bind(graph.declared, self._range_spec)
        lookup = getattr(self.source, "lookup_ranges", None)
        if (lookup is None or self._store is False or self._given_plan is not None
                or self._overrides or self.store_path is None):
            return
        found = lookup(self._store, self.store_path, graph, self.registry,
                       self._allowed_backends(), self.objective)
        # (a store that cannot be read is reported by the session's own lookup)
        self._range_elsewhere = list(found.elsewhere)
        path = None
        for plan_id, plan in found.plans:
            ranged = plan.range_plan()
            if self._range_asked is not None and ranged.range.text() != self._range_asked.text():
                self._range_elsewhere.insert(0, ranged.range.text())
                continue
            path = path or model_file(self._model)
            runner = RangeRunner(ranged, path, self.registry, self._allowed_backends(),
                                 [v.name for v in graph.outputs],
                                 {d.name: d.dtype for d in graph.declared})
            self._ranges.append((plan_id, runner))

    def _run_in_range(self, feeds: Any, output_names: Sequence[str] | None,
                      sig: tuple | None = None) -> list[np.ndarray] | None:
        """Run ``feeds`` on the range plan covering their shapes, else ``None`` (the session's
        own shapes, or none covers them: the per-shape path runs them). The feeds are checked
        once, here; ``sig``, their signature, is remembered with their shapes."""
        if not isinstance(feeds, Mapping):
            return None
        arrays = check_declared_feeds(self.declared, feeds)
        shapes = tuple((d.name, tuple(arrays[d.name].shape)) for d in self.declared)
        if shapes == self._own_shapes:
            return None
        ranged = self._range_runner(shapes)
        if ranged is None:
            return None
        self._remember_shapes(sig, shapes)
        return ranged.run(shapes, arrays, check_output_names(self._planned_graph(), output_names))

    def _remember_shapes(self, sig: tuple | None, shapes: ShapeSet) -> None:
        """Remember that feeds of signature ``sig`` passed the checks and have ``shapes`` (not
        the session's own: those take :attr:`_checked_feeds`), at most
        :data:`MAX_CHECKED_SIGNATURES` of them."""
        if sig is None:
            return
        if len(self._checked_shapes) >= MAX_CHECKED_SIGNATURES:
            self._checked_shapes.clear()
        self._checked_shapes[sig] = shapes

    def _run_known_shapes(self, shapes: ShapeSet, feeds: Mapping[str, np.ndarray],
                          output_names: Sequence[str] | None, run_options: Any) -> list[np.ndarray]:
        """Run feeds whose signature passed the checks before with ``shapes``: on the range
        plan covering them, else on their per-shape session."""
        ranged = self._range_runner(shapes) if self._ranges else None
        if ranged is not None:
            return ranged.run(shapes, feeds, check_output_names(self._planned_graph(), output_names))
        return self._shape_sessions.get(shapes).run(output_names, feeds, run_options)

    def _range_runner(self, shapes: ShapeSet) -> RangeRunner | None:
        for _, runner in self._ranges:
            if runner.covers(shapes):
                return runner
        return None

    def _own_range(self, graph: Graph) -> tuple[Plan, RangeAdapter, str] | None:
        """The range plan that runs the session's own shapes, as (plan, runner, note); the
        ways of every range plan found are built then (a session outside every range, as
        the per-shape sessions of shapes no range covers, builds none)."""
        from dispatch.plan import Plan

        for plan_id, runner in self._ranges:
            if runner.covers(self._own_shapes):
                for _, each in self._ranges:
                    each.build()
                ranged = runner.plan
                plan = Plan(graph.name, [], [], {"label": "range plan"}, shapes=ranged.to_dict())
                note = (f"range plan {plan_id} for {ranged.range.text()} from the store "
                        f"{self.store_path}: {len(ranged.buckets)} bucket(s) on "
                        f"{', '.join(ranged.ways_used())}; every shape in the range runs on it"
                        + (f"; {runner.warmed} shape(s) warmed when loaded in "
                           f"{runner.warm_s:.2f} s" if runner.warmed else ""))
                return plan, RangeAdapter(runner, [v.name for v in graph.inputs]), note
        return None

    def _note_range_miss(self) -> None:
        """Say in the plan note (and the reasons ``require_plan`` raises with) why no range
        plan runs the session's shapes, when one was asked for or some is stored."""
        if self._range_spec is not None:
            self._miss_reasons = [self._range_miss()]
            self.plan_note = f"{self._miss_reasons[0]}: running the untuned plan"
        elif self._range_elsewhere:
            self.plan_note += ("; range plans of this model stored but not usable here: "
                               + " | ".join(self._range_elsewhere))

    def _range_miss(self) -> str:
        """Why no range plan serves the asked range (for require_plan's error)."""
        asked = self._range_asked.text() if self._range_asked is not None else "?"
        stored = [r.plan.range.text() for _, r in self._ranges]
        parts = [f"no range plan is stored for {asked} on this machine with this software"]
        if stored or self._range_elsewhere:
            parts.append("ranges stored: " + " | ".join(stored + self._range_elsewhere))
        return "; ".join(parts)

    def _tune_range(self, budget_s: float | None, options: Mapping[str, Any]) -> Any:
        """Tune the session's range into its store and switch to the range plan."""
        tune = getattr(self.source, "tune_range", None)
        if self._store is False or self.store_path is None or tune is None:
            raise ArgumentError(
                "Session.tune: a shape range is tuned into a plan store by the tuner's plan "
                "source; this session has none (store=False, or the tuner is not installed)")
        if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(
                budget_s, int | float) or budget_s <= 0):
            raise ArgumentError(f"Session.tune: budget_s must be a positive number of seconds, "
                                f"received {budget_s!r}")
        unknown = sorted(set(options) - {"requests"})
        if unknown:
            raise ArgumentError(f"Session.tune of a shape range takes budget_s and requests, "
                                f"received {unknown}")
        graph = self._planned_graph()
        result = tune(self._model, store=self._store, store_path=self.store_path,
                      shapes=self._range_spec, registry=self.registry, config=self.config,
                      objective=self.objective, backends=self._allowed_backends(),
                      budget_s=budget_s if budget_s is not None else self._tune_budget_s,
                      requests=list(options.get("requests", ())))
        self._find_ranges(graph)
        own = self._own_range(graph)
        if own is None:  # the store could not be written: run the tuned plan from memory
            from dispatch.model_ways import model_file

            runner = RangeRunner(result.range_plan, model_file(self._model), self.registry,
                                 self._allowed_backends(), [v.name for v in graph.outputs],
                                 {d.name: d.dtype for d in graph.declared})
            runner.build()
            self._ranges = [(-1, runner)]
            own = self._own_range(graph)
            assert own is not None
        self._plan, self._runner, note = own
        self.plan_source = "tuned"
        self.plan_note = f"tuned by Session.tune: {note}"
        self.tune_result = result
        return result

    @property
    def stored_ranges(self) -> list[str]:
        """The ranges of the range plans this session runs (``input_ids=1x1..512 ...``)."""
        return [r.plan.range.text() for _, r in self._ranges]

    def _check_range_arguments(self, input_shapes: Mapping[str, Sequence[Any]] | None,
                               plan: Any, tune: str | None) -> None:
        if has_range(input_shapes) and plan is not None:
            raise ArgumentError("plan= runs one concrete plan; a shape range in input_shapes "
                                "runs the range plan stored for it: give one or the other")
        if has_range(input_shapes) and tune is not None:
            raise ArgumentError(
                f"tune={tune!r} tunes concrete shapes; a shape range is tuned once, ahead of "
                f"time (opdispatch tune MODEL --shape input_ids=1x1..512, or "
                f"tuner.shapes.tune_range.tune_range)")

    def describe_shapes(self, shapes: ShapeSet) -> str:
        """Which way runs concrete ``shapes`` (for reports)."""
        runner = self._range_runner(shapes)
        if runner is None:
            return f"{format_shapes(shapes)}: outside every range plan"
        bucket = runner.plan.bucket_for(shapes)
        assert bucket is not None
        return f"{format_shapes(shapes)}: bucket {bucket.lo}..{bucket.hi} on {bucket.way}"
