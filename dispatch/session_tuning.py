"""Tuning from a Session: :meth:`Session.tune` and ``tune="first-run"`` (a mixin of
:class:`dispatch.session.Session`; the plan source does the tuning, see
:mod:`dispatch.plan_source`)."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.compare import check_outputs, dequantized_output_steps, model_tolerance
from dispatch.errors import ArgumentError, OpDispatchError
from dispatch.stream_pool import build_runner

if TYPE_CHECKING:
    from dispatch.plan_runner import PlanRunner

#: The logger first-run tuning announces itself on (a WARNING when it starts, since the first
#: run then takes up to the tuning budget; INFO when it ends): route or silence it with the
#: ``logging`` configuration of the service.
log = logging.getLogger("opdispatch.tuning")
#: The values ``Session(tune=...)`` accepts.
TUNE_MODES = (None, "first-run")


class TuningMixin:
    """Tuning a session's own input shapes into its plan store and switching to the plan."""

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
        shapes: ``tuner.tune.tune`` takes no feeds. A session given a shape range
        (``input_shapes={"input_ids": [1, "1..512"]}``) tunes that range instead
        (``tuner.shapes.tune_range``; ``requests=[feeds, ...]``: requests of mixed shapes whose
        shapes are sampled) and returns its ``RangeTuneResult``.
        """
        if getattr(self, "_range_asked", None) is not None:
            return self._tune_range(budget_s, options)  # type: ignore[attr-defined]
        result, runner = self._run_tuner(budget_s, options)
        self._switch_to(result, runner, self._tuned_note(result, "by Session.tune"))
        return result

    def _tuned_note(self, result: Any, how: str) -> str:
        if result.plan_id is None:
            return (f"plan {result.key.digest()[:16]} tuned {how}, running from memory: it "
                    f"could not be stored in {self.store_path} ({result.store_error})")
        return (f"plan {result.plan_id} ({result.key.digest()[:16]}) tuned {how} and stored in "
                f"{self.store_path}")

    def _run_tuner(
        self, budget_s: float | None, options: Mapping[str, Any]
    ) -> tuple[Any, PlanRunner]:
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
        return result, build_runner(self.graph, result.plan, self.registry)

    def _switch_to(self, result: Any, runner: PlanRunner, note: str) -> None:
        self._plan = result.plan
        self._runner = runner
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
        budget = self._tune_budget_s if self._tune_budget_s is not None else (
            self._tune_options.budget_s if self._tune_options is not None
            else self.config.tune_budget_s)
        name = self.graph.name if self.graph is not None else "the model"
        log.warning("opdispatch: tuning %s on its first run (budget %.0f s, objective %s, store "
                    "%s): this run returns when tuning ends; tune ahead of time with `opdispatch "
                    "tune` to avoid the wait", name, budget, self.objective, self.store_path)
        started = time.monotonic()
        try:
            result, runner = self._run_tuner(None, {})
            steps = dequantized_output_steps(self.graph) if self.graph is not None else []
            tol = model_tolerance(self.graph.nodes if self.graph is not None else [])
            wrong = check_outputs(runner.run(feeds, names), outputs, [], tol=tol,
                                  extra_atol=steps)
            if wrong:
                problem = (f"tuned plan {result.plan_id} disagrees with the untuned plan on the "
                           f"first run's inputs ({wrong})")
        except OpDispatchError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            self.plan_note = f"tuning on the first run failed, running the untuned plan: {problem}"
            warnings.warn(f"opdispatch: {self.plan_note}", RuntimeWarning, stacklevel=3)
            return
        self._switch_to(result, runner, self._tuned_note(result, "on the first run"))
        log.info("opdispatch: first-run tuning of %s done in %.1f s: %s", name,
                 time.monotonic() - started, self.plan_note)

