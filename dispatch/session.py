"""The user's entry point, shaped like onnxruntime's ``InferenceSession``.

A Session takes its plan, in this order, from ``plan=`` (given), the plan store (a plan tuned
on this machine with this software for this model, input shapes and objective: no measurement
at all), or the untuned heuristic plan. Production processes can insist on a stored plan
(``require_plan=True``: a miss raises :class:`~dispatch.errors.PlanNotFoundError` naming the
store and the reason), or tune once when there is none (``tune="first-run"``); a warm-up script
can tune explicitly with :meth:`Session.tune`.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch import graph_cache
from dispatch.backend import load_registry
from dispatch.config import Config
from dispatch.errors import (
    ArgumentError,
    PlanError,
    PlanNotFoundError,
    SymbolicShapeError,
)
from dispatch.executor import Executor
from dispatch.feeds import check_feeds, check_output_names, feed_signature
from dispatch.gcpause import gc_paused
from dispatch.graph import Graph
from dispatch.heuristic import heuristic_plan
from dispatch.input_shapes import DeclaredInput, ShapeSet, format_shapes
from dispatch.io_info import IOInfo, type_string
from dispatch.objective import Objective
from dispatch.plan import Plan
from dispatch.plan_policy import plan_backends
from dispatch.plan_source import PlanSource, default_plan_source
from dispatch.registry import Registry
from dispatch.session_batch import BatchMixin
from dispatch.session_fallback import MAX_FAULTS as MAX_FAULTS  # re-exported
from dispatch.session_fallback import FallbackMixin
from dispatch.session_fallback import Fault as Fault  # re-exported
from dispatch.session_generate import GenerateMixin
from dispatch.session_ranges import RangeMixin
from dispatch.session_tuning import TUNE_MODES as TUNE_MODES  # re-exported
from dispatch.session_tuning import TuningMixin
from dispatch.shape_sessions import (
    MAX_SHAPES,
    ShapeSessions,
    feed_shapes_of,
    given_shapes,
    graph_shapes,
)
from dispatch.stream_pool import build_runner

if TYPE_CHECKING:
    from dispatch.onnx_import import ModelLike
    from dispatch.plan_runner import PlanRunner


#: The values ``Session(on_error=...)`` accepts.
ON_ERROR_MODES = ("raise", "fallback")


class Session(TuningMixin, FallbackMixin, BatchMixin, RangeMixin, GenerateMixin):
    """Load an ONNX model, plan it over the available backends, and run it.

    Args:
        model: a path, serialized bytes, or an ``onnx.ModelProto``.
        backends: the allowed backends in priority order (default: the configured order,
            every available backend).
        input_shapes: static shapes for inputs whose declared shapes are symbolic; a
            dimension may be a range ``"LO..HI"`` (``{"input_ids": [1, "1..512"]}``): the
            session runs the range plan stored for that range (see below).
        plan: a :class:`Plan` (or its JSON) to run instead of a stored or heuristic plan.
        overrides: node name -> implementation name, forced in the heuristic plan.
        config: a :class:`Config`; default ``Config.load()``.
        registry: the registry to use; default every discovered backend.
        store: the plan store to look the model up in (and to tune into): a path or a
            ``tuner.store.PlanStore``; ``None`` uses the configured store (``store_path``),
            reading it only when it exists; ``False`` never reads nor writes one.
        objective: the tuning objective whose stored plan to use: a
            :class:`~dispatch.objective.Objective` or its spelling (``latency``, ``memory``,
            ``latency@cap=BYTES``, ``throughput@n=4,p99=50``, ``...+nonstrict-nan``; parts in any
            order); :attr:`objective` holds it resolved (a throughput objective names its
            concurrency, as its plans' keys do).
        tune: ``None`` (default) never tunes; ``"first-run"``: when the store has no plan, the
            first :meth:`run` tunes the model within ``tune_budget_s``, stores the plan and
            switches the session to it (see :meth:`run`).
        require_plan: raise :class:`~dispatch.errors.PlanNotFoundError` when the store has no
            usable plan, instead of running the untuned one; the message names the store and
            why no plan matched (e.g. ``native: build 1a2b -> 3c4d``, or "never tuned here").
        tune_budget_s: the tuning budget in seconds (default ``config.tune_budget_s``).
        tune_options: a ``tuner.tune.TuneOptions`` whose settings (``top_k``,
            ``validate_runs``, ``per_candidate_cap_s``, ...) tuning from this session uses;
            the objective and backends always come from the session.
        on_error: what :meth:`run` does when an implementation raises at run time.
            ``"raise"`` (default): raise :class:`~dispatch.errors.KernelError` naming the
            node, implementation and backend. ``"fallback"``: re-run the failing step on the
            reference implementations of its nodes and go on with the plan (the whole run on
            the numpy reference plan only when the step cannot be re-run), record the fault
            in :attr:`faults` and warn (``RuntimeWarning``, once per implementation).
        source: where stored and tuned plans come from (a
            :class:`~dispatch.plan_source.PlanSource`); default the one installed under the
            ``opdispatch.plan_sources`` entry point (the tuner's plan store). Without one, the
            session runs given and untuned plans and :attr:`plan_note` says why.
        max_shapes: how many input shapes besides the session's own keep their planned
            executors (the least recently run dropped first; see below).

    Models with symbolic input dimensions (``input_ids: [batch, sequence]``): a session
    accepts any feed that fits the declaration. Each concrete input shape has its own plan,
    taken like the session's own (the stored plan of that shape, else the untuned one;
    ``require_plan`` raises :class:`~dispatch.errors.PlanNotFoundError` naming the shape and
    the shapes stored; ``tune="first-run"`` tunes each shape on its first run), and its own
    executor, built on the first run of that shape and kept in a cache of ``max_shapes``.
    Without ``input_shapes``, nothing is planned before the first run (:attr:`plan_source`
    is ``"deferred"``); with them, the session is planned for them, and other shapes are
    planned when they are first run. The attributes below describe the session's own shape
    (the one given, or that of the first run); :meth:`for_shapes` returns the session that
    runs another shape.

    Shapes inside a range plan's range run on it, with no plan per shape
    (:mod:`dispatch.session_ranges`).

    Every plan (given, stored or tuned) is checked against the graph and the registry before
    it is built (:func:`dispatch.plan_check.validate_plan`): a given plan that fails raises
    :class:`~dispatch.errors.PlanError`; a stored one that fails is not used, the session runs
    the untuned plan and :attr:`plan_note` says why (``require_plan=True`` raises instead).

    Without ``plan`` or ``overrides``, a plan tuned on this machine with this software for this
    model structure, input shapes and objective is taken from the store, and nothing is
    measured; otherwise the untuned heuristic plan runs, and :attr:`plan_note` says why (no
    store, no plan for this model, or which part of the key changed).

    Attributes:
        plan_source: ``"store"``, ``"heuristic"``, ``"given"``, or ``"tuned"`` (by this
            session: :meth:`tune` or ``tune="first-run"``).
        plan_note: where the plan came from, or why no stored plan was used.
        store_path: the plan store looked up and tuned into (``None`` with ``store=False``).
        plan_key: the key the session's plan is looked up and stored under (``None`` when no
            store was consulted).
        tune_result: the ``TuneResult`` of the last tuning by this session, else ``None``.
        on_error: ``"raise"`` or ``"fallback"`` (see above).
        faults: the :class:`Fault` records of the run-time failures recovered from with
            ``on_error="fallback"``, oldest first.
        load_seconds: the whole creation of the session, in seconds.
        startup: where that time went, in seconds per stage: ``backends`` (configuration,
            the plan source's set-up and backend discovery), ``import`` (reading, checking, shape inference),
            ``simplify`` (constant folding and the other graph passes), ``plan`` (the store
            lookup, or the untuned plan) and ``build`` (the executor: every step's kernel,
            compiled library regions and build-time conversions).
    """

    @gc_paused
    def __init__(
        self,
        model: ModelLike,
        *,
        backends: Sequence[str] | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        plan: Plan | str | None = None,
        overrides: Mapping[str, str] | None = None,
        config: Config | None = None,
        registry: Registry | None = None,
        store: Any = None,
        objective: str | Objective = "latency",
        tune: str | None = None,
        require_plan: bool = False,
        tune_budget_s: float | None = None,
        tune_options: Any = None,
        on_error: str = "raise",
        source: PlanSource | None = None,
        max_shapes: int = MAX_SHAPES,
    ) -> None:
        t0 = time.perf_counter()
        if on_error not in ON_ERROR_MODES:
            raise ArgumentError(
                f"on_error must be one of {', '.join(map(repr, ON_ERROR_MODES))}, received {on_error!r}"
            )
        self.on_error = on_error
        self.faults: list[Fault] = []
        self._warned_impls: set[str] = set()
        self._reference_executor: Executor | None = None
        self._fallback_lock = threading.Lock()
        self._check_tuning_arguments(plan, overrides, store, tune, require_plan, tune_budget_s)
        self._check_range_arguments(input_shapes, plan, tune)
        input_shapes = self._split_range(input_shapes)
        self.source, why_no_source = self._find_source(source, store)
        self._no_source = why_no_source
        if why_no_source and (tune is not None or require_plan):
            raise ArgumentError(
                f"{'tune=' + repr(tune) if tune is not None else 'require_plan=True'} needs a "
                f"plan store, and {why_no_source}"
            )
        if tune_options is not None and self.source is not None:
            self.source.check_tune_options(tune_options)
        # an unknown objective is an error now, not a silent miss; "throughput" names its
        # concurrency, as its plans' keys do
        objective = Objective.parse(objective).resolved()
        self.startup: dict[str, float] = {}
        self._lookup_s = 0.0
        t_stage = t0  # the plan source's set-up counts with the configuration
        self.config = config or Config.load()
        # with the graph cache on, only the backends the plan runs register (the manifest of
        # the last full registration keys the plan: dispatch.backend_manifest)
        self.registry = registry or load_registry(
            self.config.plugin_path or None, order=self.config.backend_order,
            manifest_dir=graph_cache.cache_dir(self.config.graph_cache))
        order = list(backends) if backends is not None else list(self.config.backend_order)
        if backends is None:
            # the configured order first, then every other available backend
            order += [b for b in self.registry.available_backends() if b not in order]
        unknown = [b for b in order if b not in self.registry.backends]
        if backends is not None and unknown:
            raise PlanError(
                f"backends {unknown} are not known; known backends: {sorted(self.registry.backends)}"
            )
        if unknown:  # configured (OPDISPATCH_BACKENDS / config file): maybe a plugin not here
            warnings.warn(
                f"opdispatch: the configured backend order names {unknown}, which no installed "
                f"backend or plugin provides (a typo, or a plugin not installed here); known "
                f"backends: {sorted(self.registry.backends)}",
                RuntimeWarning, stacklevel=2,
            )
        elif backends is not None:
            down = {b: self.registry.backends[b].reason or "unavailable" for b in order
                    if not self.registry.backends[b].available}
            if down:
                warnings.warn(
                    "opdispatch: " + "; ".join(f"backend {b!r} is unavailable ({why})"
                                               for b, why in down.items())
                    + "; the plan uses the other requested backends",
                    RuntimeWarning, stacklevel=2,
                )
        self.backend_order = order
        self._configure_backends()
        t_stage = self._stage("backends", t_stage)
        # kept to tune later and to plan other shapes: the model as given (a path is re-read)
        self._model = model
        self._backends_arg = list(backends) if backends is not None else None
        self._given_plan = plan
        self._overrides = dict(overrides) if overrides else None
        self._why_no_source = why_no_source
        self._store = store
        self._tune_budget_s = tune_budget_s
        self._tune_options = tune_options
        self._tune_lock = threading.Lock()
        self._tune_on_first_run = False
        #: the signature (dispatch.feeds.feed_signature) of the last feeds the session's own
        #: plan ran after the full check: the same again skips the checks
        self._checked_feeds: tuple | None = None
        self.objective = objective
        self.require_plan = bool(require_plan)
        self.tune_mode = tune
        self.store_path: str | None = (
            None if store is False or self.source is None
            else self.source.store_path(store, self.config))
        self._shape_sessions = ShapeSessions(self._for_shapes, self._runs_shapes, max_shapes)
        self._input_shapes: dict[str, list[int]] | None = None
        self._stored_shapes: list[str] = []
        self._unplanned()
        try:
            loaded = graph_cache.load_graph(model, input_shapes, self.registry,
                                            self._allowed_backends(), self.config.graph_cache)
        except SymbolicShapeError as exc:
            if not exc.inputs or plan is not None:
                raise
            # each shape is planned when it is first fed (see ShapeSessions)
            self.declared: list[DeclaredInput] = exc.inputs
            self.plan_source = "deferred"
            self.plan_note = (
                "the model's inputs have symbolic dimensions ("
                + "; ".join(d.describe() for d in self.declared if d.symbolic)
                + "): each input shape is planned when it is first run")
            self.load_seconds = time.perf_counter() - t0
            return
        self._specialize(loaded, input_shapes)
        self.load_seconds = time.perf_counter() - t0

    def _unplanned(self) -> None:
        """The state of a session with no graph yet (and after a failed :meth:`_specialize`)."""
        self.graph: Graph | None = None
        self.simplify_stats: dict[str, Any] = {}
        #: whether the graph came from the graph cache (:mod:`dispatch.graph_cache`)
        self.graph_cached = False
        self.plan_key: Any = None
        self.tune_result: Any = None
        self.plan_source = ""
        self.plan_note = ""
        self._miss_reasons: list[str] = []
        #: runs the plan's requests (its executor, or a pool of its streams' executors)
        self._runner: PlanRunner | None = None
        self._plan: Plan | None = None

    def _specialize(self, loaded: graph_cache.LoadedGraph,
                    input_shapes: Mapping[str, Sequence[int]] | None) -> None:
        """Take ``loaded`` (the model at concrete input shapes) and plan it: the given plan,
        the stored one, or the untuned one; then build its executor."""
        try:
            self._plan_graph(loaded, input_shapes)
        except BaseException:
            self._unplanned()
            raise

    def _plan_graph(self, loaded: graph_cache.LoadedGraph,
                    input_shapes: Mapping[str, Sequence[int]] | None) -> None:
        self.graph = loaded.graph
        self.declared = loaded.graph.declared
        self.plan_note = ""
        self.simplify_stats = loaded.simplify_stats
        self.graph_cached = loaded.cached
        self.startup["import"], self.startup["simplify"] = loaded.import_s, loaded.simplify_s
        t_stage = time.perf_counter()
        self._input_shapes = {k: list(v) for k, v in input_shapes.items()} if input_shapes else None
        plan, overrides, store = self._given_plan, self._overrides, self._store
        self.plan_source = "given"
        if plan is not None:
            self._plan = Plan.from_json(plan) if isinstance(plan, str) else plan
        else:
            stored = None
            if self._why_no_source and store is not False:
                self.plan_note = f"{self._why_no_source}: running the untuned plan"
                self._miss_reasons = [self._why_no_source]
            elif not overrides and store is not False:
                self._find_ranges(self.graph)
                if self._range_spec is None:
                    stored = self._stored_plan(store, self.objective)
            ranged = self._own_range(self.graph) if stored is None else None
            if ranged is not None:
                self._plan, self._runner, self.plan_note = ranged
                self.plan_source = "store"
            elif stored is None:
                self._note_range_miss()
                if self.require_plan:
                    raise self._plan_not_found()
                self._plan = heuristic_plan(self.graph, self.registry, self.backend_order,
                                            overrides=overrides)
                self.plan_source = "heuristic"
                if self.tune_mode == "first-run":
                    self._tune_on_first_run = True
                    self.plan_note += "; the first run tunes it"
        t_stage = self._stage("plan", t_stage)
        if self._runner is None:
            self._runner = build_runner(self.graph, self._plan, self.registry)
        self._stage("build", t_stage)
        if self.plan_source == "store":  # the stored plan's executor was built by the lookup
            build = self.startup["plan"] + self.startup["build"] - self._lookup_s
            self.startup.update(plan=self._lookup_s, build=build)

    def _plan_shapes(self, shapes: ShapeSet) -> None:
        """Plan this (deferred) session for the concrete input ``shapes`` of its first run."""
        t0 = time.perf_counter()
        given = dict(shapes)
        loaded = graph_cache.load_graph(self._model, given, self.registry,
                                        self._allowed_backends(), self.config.graph_cache)
        self._specialize(loaded, given)
        self.load_seconds += time.perf_counter() - t0

    def _runs_shapes(self, shapes: ShapeSet) -> Session | None:
        """This session when it runs ``shapes`` (planned for them now when it waits for its
        first run's shapes), else ``None`` (see :class:`ShapeSessions`)."""
        if self.graph is None:
            self._plan_shapes(shapes)
            return self
        return self if shapes == graph_shapes(self.graph) else None

    def _for_shapes(self, shapes: ShapeSet) -> Session:
        """A new session like this one (same model, backends, store, policies), planned for
        the concrete input ``shapes``."""
        return Session(
            self._model, backends=self._backends_arg, input_shapes=dict(shapes),
            plan=self._given_plan, overrides=self._overrides, config=self.config,
            registry=self.registry, store=self._store, objective=self.objective,
            tune=self.tune_mode, require_plan=self.require_plan,
            tune_budget_s=self._tune_budget_s, tune_options=self._tune_options,
            on_error=self.on_error, source=self.source, max_shapes=1,
        )

    def _stage(self, name: str, since: float) -> float:
        """Record the seconds since ``since`` as start-up stage ``name`` (see :attr:`startup`)."""
        now = time.perf_counter()
        self.startup[name] = now - since
        return now

    @staticmethod
    def _find_source(source: PlanSource | None, store: Any) -> tuple[PlanSource | None, str]:
        """The plan source to use and, when there is none, why (empty with ``store=False``,
        which asks for none)."""
        if source is not None:
            if not isinstance(source, PlanSource):
                raise ArgumentError(
                    f"source must be a dispatch.plan_source.PlanSource (store_path, "
                    f"check_tune_options, lookup, tune), received {type(source).__name__}"
                )
            return source, ""
        if store is False:
            return None, ""
        found = default_plan_source()
        return found.source, found.reason

    def _allowed_backends(self) -> list[str]:
        return plan_backends(self.registry, self.backend_order, self.backend_order)

    def _stored_plan(self, store: Any, objective: Objective) -> Plan | None:
        """The stored plan for this model, built into an executor, or None (with the reason
        in :attr:`plan_note` and :attr:`_miss_reasons`). The source's lookup never raises;
        a stored plan whose executor cannot be built is not used either."""
        assert self.source is not None and self.store_path is not None
        t_lookup = time.perf_counter()
        found = self.source.lookup(store, self.store_path, self.graph, self.registry,
                                   self._allowed_backends(), objective)
        self._lookup_s = time.perf_counter() - t_lookup
        self.plan_key = found.key
        self.plan_note = found.note
        self._stored_shapes = list(getattr(found, "stored_shapes", ()))
        if found.plan is None:
            self._miss_reasons = list(found.reasons)
            return None
        try:
            self._runner = build_runner(self.graph, found.plan, self.registry)
        except Exception as exc:  # a broken plan must never stop the model from running
            reason = f"{type(exc).__name__}: {exc}"
            self.plan_note = f"stored plan not used: {reason}"
            self._miss_reasons = [reason]
            self._runner = None
            return None
        self._plan = found.plan
        self.plan_source = "store"
        return found.plan

    def _plan_not_found(self) -> PlanNotFoundError:
        assert self.graph is not None
        reasons = [" ".join(r.split()) for r in self._miss_reasons] or ["no plan matched"]
        shapes = here = ""
        if self._range_asked is not None:
            shapes = f" over the shape range {self._range_asked.axes_text()}"
            here = " --shape " + " --shape ".join(self._range_asked.text().split())
        elif any(d.symbolic for d in self.declared):
            mine = tuple((v.name, tuple(v.shape or ())) for v in self.graph.inputs)
            shapes = f" at input shapes {format_shapes(mine)}"
            here = (" --shape " + " --shape ".join(
                f"{n}={'x'.join(map(str, s))}" for n, s in mine))
            stored = list(dict.fromkeys(self._stored_shapes))
            reasons.append("plans of this model are stored for the input shapes "
                           + " | ".join(stored) if stored else
                           "no plan of this model is stored for any input shape")
        return PlanNotFoundError(
            f"no usable tuned plan for model {self.graph.name!r}{shapes} (objective "
            f"{self.objective}) in the plan store {self.store_path}: {'; '.join(reasons)}; "
            f"tune it on this machine first (opdispatch tune MODEL{here}"
            f"{self.objective.tune_flags()} --store PATH, or "
            f"Session(..., tune='first-run'))",
            store_path=self.store_path, reasons=reasons,
        )

    def _configure_backends(self) -> None:
        for status in self.registry.backends.values():
            configure = getattr(status.backend, "configure", None)
            if status.available and configure is not None:
                configure(self.config)

    # -- introspection -------------------------------------------------------------------
    def _planned_graph(self) -> Graph:
        """The session's graph; raises when the session waits for its first run's shapes."""
        if self.graph is None:
            raise ArgumentError(
                "this session has no plan yet: the model's inputs have symbolic dimensions ("
                + "; ".join(d.describe() for d in self.declared if d.symbolic)
                + ") and no input_shapes were given, so each shape is planned at its first "
                "run; run it, or create the Session with input_shapes={...}")
        return self.graph

    @property
    def plan(self) -> Plan:
        """The plan of the session's own input shapes."""
        self._planned_graph()
        assert self._plan is not None
        return self._plan

    @property
    def executor(self) -> Executor:
        """The executor of the session's own input shapes (of the first stream when the plan
        serves concurrent requests on several: :attr:`runner`)."""
        return self.runner.executor

    @property
    def runner(self) -> PlanRunner:
        """What runs the session's own input shapes: its executor, or the pool of its
        streams' executors (:mod:`dispatch.stream_pool`)."""
        self._planned_graph()
        assert self._runner is not None
        return self._runner

    def for_shapes(self, input_shapes: Mapping[str, Sequence[int]]) -> Session:
        """The session that runs feeds of ``input_shapes`` (every input's shape, or enough
        of them to size the others through their shared symbolic dimensions): this one for
        its own shapes, else the one planned for them (planned now if need be). Its
        :attr:`plan_source`, :attr:`plan_note` and :attr:`plan` say what runs those shapes."""
        return self._shape_sessions.get(given_shapes(self.declared, input_shapes))

    def planned_shapes(self) -> list[ShapeSet]:
        """The input shapes this session has planned: its own first (when planned), then the
        other shapes' sessions kept, least recently run first."""
        own = graph_shapes(self.graph)
        return ([own] if own is not None else []) + list(self._shape_sessions.planned())

    def get_inputs(self) -> list[IOInfo]:
        """The inputs: name, shape (a symbol for each open dimension while nothing is
        planned, else the session's own shapes), ONNX type and dtype."""
        if self.graph is None:
            return [IOInfo(d.name, list(d.dims or ()),
                           type_string(d.dtype), d.dtype)  # type: ignore[arg-type]
                    for d in self.declared]
        return [IOInfo(v.name, list(v.shape or ()),
                       type_string(v.dtype), v.dtype)  # type: ignore[arg-type]
                for v in self.graph.inputs]

    def get_outputs(self) -> list[IOInfo]:
        """The outputs of the session's own input shapes (name, shape, type, dtype)."""
        graph = self._planned_graph()
        return [IOInfo(v.name, list(v.shape or ()),
                       type_string(v.dtype), v.dtype)  # type: ignore[arg-type]
                for v in graph.outputs]

    # -- running -------------------------------------------------------------------------
    def run(
        self,
        output_names: Sequence[str] | None,
        feeds: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """Run the model; returns one array per name in ``output_names`` (all when None).

        With ``tune="first-run"`` and no stored plan, the first call runs the untuned plan
        (its outputs are returned), then tunes within the budget, stores the plan and
        switches the session to it, once the tuned plan has reproduced those outputs on these
        inputs; later calls run the tuned plan. The tuner itself measures on random inputs of
        the real shapes (``tuner.tune.tune`` takes no feeds). If tuning fails, the session
        keeps the untuned plan, says why in :attr:`plan_note` and warns (RuntimeWarning).
        """
        sig = feed_signature(feeds)
        if sig is not None:
            # the names, dtypes and shapes of feeds checked before (the steady state of a
            # served model: ~40 us of checks per request on a 3-input BERT, 35 us on MiniLM's
            # range plan): the own plan's, or another shape's (dispatch.session_ranges)
            if sig == self._checked_feeds:
                return self._execute(feeds, check_output_names(self.graph, output_names))
            known = self._checked_shapes.get(sig)
            if known is not None:
                return self._run_known_shapes(known, feeds, output_names, run_options)
        if self._ranges:
            ranged = self._run_in_range(feeds, output_names, sig)
            if ranged is not None:
                return ranged
        shapes = feed_shapes_of(self.declared, feeds)
        target = self if shapes is None else self._shape_sessions.get(shapes)
        if target is not self:
            self._remember_shapes(sig, shapes)
            return target.run(output_names, feeds, run_options)
        graph = self._planned_graph()
        arrays = check_feeds(graph, feeds)
        names = check_output_names(graph, output_names)
        if self._tune_on_first_run:
            with self._tune_lock:
                if self._tune_on_first_run:
                    self._tune_on_first_run = False  # tune once, even if it fails
                    outputs = self._execute(arrays, names)
                    self._tune_after_first_run(arrays, names, outputs)
                    return outputs
        self._checked_feeds = sig
        return self._execute(arrays, names)

    def describe(self) -> str:
        """What runs where: the plan as a text table with a one-line summary."""
        used = ", ".join(f"{b}: {n} node(s)" for b, n in self._plan.backends_used().items())
        runtime_convs = sum(1 for c in self._plan.conversions if not c.at_build)
        note = f"plan: {self.plan_source}" + (f" ({self.plan_note})" if self.plan_note else "")
        return (
            f"{self.graph.summary()}\n{note}\nbackends: {used}; {runtime_convs} run-time conversion(s)\n"
            + self._plan.describe()
        )
