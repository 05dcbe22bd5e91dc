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
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import helper

from dispatch import graph_cache
from dispatch.backend import load_registry
from dispatch.compare import MODEL_TOLERANCE, check_outputs
from dispatch.config import Config
from dispatch.errors import (
    ArgumentError,
    KernelError,
    OpDispatchError,
    PlanError,
    PlanNotFoundError,
)
from dispatch.executor import Executor, reference_overrides
from dispatch.feeds import check_feeds, check_output_names
from dispatch.graph import Graph
from dispatch.heuristic import heuristic_plan
from dispatch.onnx_import import ModelLike
from dispatch.plan import Plan
from dispatch.plan_policy import parse_objective, plan_backends
from dispatch.plan_source import PlanSource, default_plan_source
from dispatch.registry import REFERENCE_BACKEND, Registry

#: The values ``Session(tune=...)`` accepts.
TUNE_MODES = (None, "first-run")
#: The values ``Session(on_error=...)`` accepts.
ON_ERROR_MODES = ("raise", "fallback")
#: How many :class:`Fault` records a session keeps (the most recent).
MAX_FAULTS = 1000


@dataclass(frozen=True)
class IOInfo:
    """Name, static shape and ONNX type string of a model input or output (like ``NodeArg``)."""

    name: str
    shape: list[int]
    type: str
    dtype: np.dtype


@dataclass(frozen=True)
class Fault:
    """One run-time failure of an implementation that ``on_error="fallback"`` recovered from.

    Attributes:
        node: the failing call's label (node name, fused ``a+b``, or ``convert ...``).
        implementation: the implementation (or converter chain) that raised.
        backend: its backend.
        error: ``"ExceptionType: message"`` of the failure.
        time: when it happened (``time.time()``, seconds since the epoch).
        recovery: how the run was answered: ``"reference implementation"`` (the failing
            step re-run on the reference implementations of its nodes, the rest of the plan
            as planned) or ``"reference plan"`` (the whole run on the numpy reference plan,
            when the step could not be re-run).
    """

    node: str
    implementation: str
    backend: str
    error: str
    time: float
    recovery: str = "reference implementation"


def _type_string(dtype: np.dtype) -> str:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return f"tensor({helper.tensor_dtype_to_string(elem).split('.')[-1].lower()})"


class Session:
    """Load an ONNX model, plan it over the available backends, and run it.

    Args:
        model: a path, serialized bytes, or an ``onnx.ModelProto``.
        backends: the allowed backends in priority order (default: the configured order,
            every available backend).
        input_shapes: static shapes for inputs whose declared shapes are symbolic.
        plan: a :class:`Plan` (or its JSON) to run instead of a stored or heuristic plan.
        overrides: node name -> implementation name, forced in the heuristic plan.
        config: a :class:`Config`; default ``Config.load()``.
        registry: the registry to use; default every discovered backend.
        store: the plan store to look the model up in (and to tune into): a path or a
            ``tuner.store.PlanStore``; ``None`` uses the configured store (``store_path``),
            reading it only when it exists; ``False`` never reads nor writes one.
        objective: the tuning objective whose stored plan to use (``latency``, ``memory``,
            ``latency@cap=BYTES``).
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
        startup: where that time went, in seconds per stage: ``backends`` (configuration
            and backend discovery), ``import`` (reading, checking, shape inference),
            ``simplify`` (constant folding and the other graph passes), ``plan`` (the store
            lookup, or the untuned plan) and ``build`` (the executor: every step's kernel,
            compiled library regions and build-time conversions).
    """

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
        objective: str = "latency",
        tune: str | None = None,
        require_plan: bool = False,
        tune_budget_s: float | None = None,
        tune_options: Any = None,
        on_error: str = "raise",
        source: PlanSource | None = None,
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
        self.source, why_no_source = self._find_source(source, store)
        self._no_source = why_no_source
        if why_no_source and (tune is not None or require_plan):
            raise ArgumentError(
                f"{'tune=' + repr(tune) if tune is not None else 'require_plan=True'} needs a "
                f"plan store, and {why_no_source}"
            )
        if tune_options is not None and self.source is not None:
            self.source.check_tune_options(tune_options)
        parse_objective(objective)  # an unknown objective is an error now, not a silent miss
        self.startup: dict[str, float] = {}
        self._lookup_s = 0.0
        t_stage = time.perf_counter()
        self.config = config or Config.load()
        self.registry = registry or load_registry(self.config.plugin_path or None, order=self.config.backend_order)
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
        loaded = graph_cache.load_graph(model, input_shapes, self.registry, self._allowed_backends(),
                                        self.config.graph_cache)
        self.graph: Graph = loaded.graph
        self.simplify_stats = loaded.simplify_stats
        #: whether the graph came from the graph cache (:mod:`dispatch.graph_cache`)
        self.graph_cached = loaded.cached
        self.startup["import"], self.startup["simplify"] = loaded.import_s, loaded.simplify_s
        t_stage = time.perf_counter()
        # kept to tune later: the model as given (a path is re-read by the tuner)
        self._model = model
        self._input_shapes = {k: list(v) for k, v in input_shapes.items()} if input_shapes else None
        self._store = store
        self._tune_budget_s = tune_budget_s
        self._tune_options = tune_options
        self._tune_lock = threading.Lock()
        self._tune_on_first_run = False
        self.objective = objective
        self.require_plan = bool(require_plan)
        self.tune_mode = tune
        self.store_path: str | None = (
            None if store is False or self.source is None
            else self.source.store_path(store, self.config))
        self.plan_key: Any = None
        self.tune_result: Any = None
        self.plan_source = "given"
        self.plan_note = ""
        self._miss_reasons: list[str] = []
        self._executor: Executor | None = None
        if plan is not None:
            self._plan = Plan.from_json(plan) if isinstance(plan, str) else plan
        else:
            stored = None
            if why_no_source and store is not False:
                self.plan_note = f"{why_no_source}: running the untuned plan"
                self._miss_reasons = [why_no_source]
            elif not overrides and store is not False:
                stored = self._stored_plan(store, objective)
            if stored is None:
                if self.require_plan:
                    raise self._plan_not_found()
                self._plan = heuristic_plan(self.graph, self.registry, order, overrides=overrides)
                self.plan_source = "heuristic"
                if tune == "first-run":
                    self._tune_on_first_run = True
                    self.plan_note += "; the first run tunes it"
        t_stage = self._stage("plan", t_stage)
        if self._executor is None:
            self._executor = Executor(self.graph, self._plan, self.registry)
        self._stage("build", t_stage)
        if self.plan_source == "store":  # the stored plan's executor was built by the lookup
            build = self.startup["plan"] + self.startup["build"] - self._lookup_s
            self.startup.update(plan=self._lookup_s, build=build)
        self.load_seconds = time.perf_counter() - t0

    def _stage(self, name: str, since: float) -> float:
        """Record the seconds since ``since`` as start-up stage ``name`` (see :attr:`startup`)."""
        now = time.perf_counter()
        self.startup[name] = now - since
        return now

    @staticmethod
    def _check_tuning_arguments(
        plan: Any, overrides: Any, store: Any, tune: Any, require_plan: Any, tune_budget_s: Any,
    ) -> None:
        if tune not in TUNE_MODES:
            raise ArgumentError(
                f"tune must be one of {', '.join(map(repr, TUNE_MODES))}, received {tune!r}"
            )
        if tune is not None and require_plan:
            raise ArgumentError(
                f"tune={tune!r} and require_plan=True exclude each other: require_plan raises "
                f"on a store miss, tune={tune!r} tunes on one"
            )
        wants = [w for w, on in (("tune='first-run'", tune is not None),
                                 ("require_plan=True", bool(require_plan))) if on]
        if wants and (plan is not None or overrides):
            given = "plan=" if plan is not None else "overrides="
            raise ArgumentError(
                f"{' and '.join(wants)} cannot be combined with {given}: they concern stored "
                f"plans, and {given} replaces the stored plan"
            )
        if wants and store is False:
            raise ArgumentError(
                f"{' and '.join(wants)} needs a plan store, received store=False; pass "
                f"store=PATH (or None for the configured store)"
            )
        if tune_budget_s is not None and (
            isinstance(tune_budget_s, bool) or not isinstance(tune_budget_s, int | float)
            or tune_budget_s <= 0
        ):
            raise ArgumentError(
                f"tune_budget_s must be a positive number of seconds, received {tune_budget_s!r}"
            )

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

    def _stored_plan(self, store: Any, objective: str) -> Plan | None:
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
        if found.plan is None:
            self._miss_reasons = list(found.reasons)
            return None
        try:
            self._executor = Executor(self.graph, found.plan, self.registry)
        except Exception as exc:  # a broken plan must never stop the model from running
            reason = f"{type(exc).__name__}: {exc}"
            self.plan_note = f"stored plan not used: {reason}"
            self._miss_reasons = [reason]
            self._executor = None
            return None
        self._plan = found.plan
        self.plan_source = "store"
        return found.plan

    def _plan_not_found(self) -> PlanNotFoundError:
        reasons = [" ".join(r.split()) for r in self._miss_reasons] or ["no plan matched"]
        return PlanNotFoundError(
            f"no usable tuned plan for model {self.graph.name!r} (objective {self.objective}) "
            f"in the plan store {self.store_path}: {'; '.join(reasons)}; tune it on this "
            f"machine first (opdispatch tune MODEL --store PATH, or Session(..., "
            f"tune='first-run'))",
            store_path=self.store_path, reasons=reasons,
        )

    # -- tuning --------------------------------------------------------------------------
    def tune(self, budget_s: float | None = None, **options: Any) -> Any:
        """Tune this session's model on this machine, store the plan in the session's store
        and switch the session to it; returns the ``tuner.tune.TuneResult``.

        Args:
            budget_s: bound on the whole tuning run in seconds (default: the session's
                ``tune_budget_s``, else ``tune_options.budget_s`` when given, else
                ``config.tune_budget_s``).
            **options: other ``tuner.tune.TuneOptions`` fields (``top_k``, ``validate_runs``,
                ``per_candidate_cap_s``, ``seed``, ``progress``, ...). The objective and the
                backends are the session's.

        The tuner measures and validates on random inputs of the session's (static) input
        shapes: ``tuner.tune.tune`` takes no feeds.
        """
        result, executor = self._run_tuner(budget_s, options)
        self._switch_to(result, executor, self._tuned_note(result, "by Session.tune"))
        return result

    def _tuned_note(self, result: Any, how: str) -> str:
        if result.plan_id is None:
            return (f"plan {result.key.digest()[:16]} tuned {how}, running from memory: it "
                    f"could not be stored in {self.store_path} ({result.store_error})")
        return (f"plan {result.plan_id} ({result.key.digest()[:16]}) tuned {how} and stored in "
                f"{self.store_path}")

    def _run_tuner(self, budget_s: float | None, options: Mapping[str, Any]) -> tuple[Any, Executor]:
        if budget_s is not None and (isinstance(budget_s, bool)
                                     or not isinstance(budget_s, int | float) or budget_s <= 0):
            raise ArgumentError(
                f"Session.tune: budget_s must be a positive number of seconds, received {budget_s!r}"
            )
        if self._store is False or self.store_path is None:
            raise ArgumentError(
                "Session.tune: this session was created with store=False, so there is no plan "
                "store to tune into; create it with store=PATH (or None for the configured store)"
            )
        if self.source is None:
            raise ArgumentError(f"Session.tune: {self._no_source}, so nothing can tune here")
        result = self.source.tune(
            self._model, store=self._store, store_path=self.store_path, graph=self.graph,
            registry=self.registry, config=self.config, input_shapes=self._input_shapes,
            objective=self.objective, backends=self._allowed_backends(),
            budget_s=budget_s if budget_s is not None else self._tune_budget_s,
            base_options=self._tune_options, options=options)
        return result, Executor(self.graph, result.plan, self.registry)

    def _switch_to(self, result: Any, executor: Executor, note: str) -> None:
        self._plan = result.plan
        self._executor = executor
        self.plan_source = "tuned"
        self.plan_note = note
        self.plan_key = result.key
        self.tune_result = result
        self._tune_on_first_run = False

    def _tune_after_first_run(
        self, feeds: Mapping[str, np.ndarray], names: list[str] | None,
        outputs: Sequence[np.ndarray],
    ) -> None:
        """Tune, then switch to the tuned plan if it reproduces ``outputs`` (the untuned plan's)
        on the first run's real inputs; on failure keep the untuned plan and warn."""
        problem = ""
        try:
            result, executor = self._run_tuner(None, {})
            wrong = check_outputs(executor.run(feeds, names), outputs, [], tol=MODEL_TOLERANCE)
            if wrong:
                problem = (f"tuned plan {result.plan_id} disagrees with the untuned plan on the "
                           f"first run's inputs ({wrong})")
        except OpDispatchError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            self.plan_note = f"tuning on the first run failed, running the untuned plan: {problem}"
            warnings.warn(f"opdispatch: {self.plan_note}", RuntimeWarning, stacklevel=3)
            return
        self._switch_to(result, executor, self._tuned_note(result, "on the first run"))

    def _configure_backends(self) -> None:
        for status in self.registry.backends.values():
            configure = getattr(status.backend, "configure", None)
            if status.available and configure is not None:
                configure(self.config)

    # -- introspection -------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def executor(self) -> Executor:
        assert self._executor is not None
        return self._executor

    def get_inputs(self) -> list[IOInfo]:
        return [IOInfo(v.name, list(v.shape or ()), _type_string(v.dtype), v.dtype) for v in self.graph.inputs]  # type: ignore[arg-type]

    def get_outputs(self) -> list[IOInfo]:
        return [IOInfo(v.name, list(v.shape or ()), _type_string(v.dtype), v.dtype) for v in self.graph.outputs]  # type: ignore[arg-type]

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
        arrays = check_feeds(self.graph, feeds)
        names = check_output_names(self.graph, output_names)
        if self._tune_on_first_run:
            with self._tune_lock:
                if self._tune_on_first_run:
                    self._tune_on_first_run = False  # tune once, even if it fails
                    outputs = self._execute(arrays, names)
                    self._tune_after_first_run(arrays, names, outputs)
                    return outputs
        return self._execute(arrays, names)

    def _execute(self, feeds: Mapping[str, np.ndarray], names: list[str] | None) -> list[np.ndarray]:
        """Run the session's executor. With ``on_error="fallback"``, a step whose
        implementation raises is re-run on the reference implementations of its nodes (its
        inputs converted to the standard layout and its outputs back, see
        :meth:`Executor.fallback_call`) and the run goes on; the fault is recorded in
        :attr:`faults` and warned about once per implementation. Only when that cannot answer
        (no reference implementation for the node, a converter failing, the reference raising
        too) is the whole run answered by the numpy reference plan, the last resort."""
        if self.on_error != "fallback":
            return self.executor.run(feeds, names)
        try:
            return self.executor.run(feeds, names, on_fault=self._record_fault)
        except KernelError as exc:
            self._record_fault(exc, recovery="reference plan")
            try:
                reference = self._reference()
            except KernelError as none:
                raise KernelError(f"{exc}; {none}", node=exc.node, impl=exc.impl,
                                  backend=exc.backend) from exc
            try:
                return reference.run(feeds, names)
            except KernelError as again:
                raise KernelError(
                    f"{exc}; the numpy reference plan run as a fallback failed too: {again}",
                    node=exc.node, impl=exc.impl, backend=exc.backend,
                ) from again

    def _record_fault(self, exc: KernelError, recovery: str = "reference implementation") -> None:
        """Record one recovered run-time failure and warn once per implementation."""
        fault = Fault(node=exc.node or "?", implementation=exc.impl or "?",
                      backend=exc.backend or "?", error=str(exc), time=time.time(),
                      recovery=recovery)
        with self._fallback_lock:
            self.faults.append(fault)
            del self.faults[:-MAX_FAULTS]
            first = fault.implementation not in self._warned_impls
            self._warned_impls.add(fault.implementation)
        if first:
            instead = ("its nodes on the reference implementation" if recovery == "reference implementation"
                       else "the whole model on the numpy reference plan")
            warnings.warn(
                f"opdispatch: {fault.implementation} (backend {fault.backend}) failed on node "
                f"{fault.node!r}, running {instead} instead: {exc}",
                RuntimeWarning, stacklevel=4,
            )

    def _reference(self) -> Executor:
        """The executor of the numpy reference plan, built on first use."""
        with self._fallback_lock:
            if self._reference_executor is None:
                try:
                    overrides = reference_overrides(self.graph, self.registry)
                    plan = heuristic_plan(self.graph, self.registry, [REFERENCE_BACKEND],
                                          overrides=overrides)
                    self._reference_executor = Executor(self.graph, plan, self.registry)
                except (LookupError, OpDispatchError) as exc:
                    raise KernelError(
                        f"on_error='fallback' needs the numpy reference plan of model "
                        f"{self.graph.name!r}, which cannot be built: {type(exc).__name__}: {exc}"
                    ) from exc
            return self._reference_executor

    def describe(self) -> str:
        """What runs where: the plan as a text table with a one-line summary."""
        used = ", ".join(f"{b}: {n} node(s)" for b, n in self._plan.backends_used().items())
        runtime_convs = sum(1 for c in self._plan.conversions if not c.at_build)
        note = f"plan: {self.plan_source}" + (f" ({self.plan_note})" if self.plan_note else "")
        return (
            f"{self.graph.summary()}\n{note}\nbackends: {used}; {runtime_convs} run-time conversion(s)\n"
            + self._plan.describe()
        )
