"""The user's entry point, shaped like onnxruntime's ``InferenceSession``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import helper

from dispatch.backend import load_registry
from dispatch.config import Config
from dispatch.errors import FeedError, PlanError
from dispatch.executor import Executor
from dispatch.graph import Graph
from dispatch.onnx_import import ModelLike, import_model
from dispatch.passes import simplify
from dispatch.plan import Plan, check_supported_ops, heuristic_plan
from dispatch.registry import Registry


@dataclass(frozen=True)
class IOInfo:
    """Name, static shape and ONNX type string of a model input or output (like ``NodeArg``)."""

    name: str
    shape: list[int]
    type: str
    dtype: np.dtype


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
        store: the plan store to look the model up in: a path or a ``tuner.store.PlanStore``;
            ``None`` uses the configured store when it exists; ``False`` never reads one.
        objective: the tuning objective whose stored plan to use (``latency``, ``memory``,
            ``latency@cap=BYTES``).

    Without ``plan`` or ``overrides``, a plan tuned on this machine with this software for this
    model structure, input shapes and objective is taken from the store; otherwise the untuned
    heuristic plan runs, and :attr:`plan_note` says why (no store, no plan for this model,
    or which part of the key changed, e.g. ``native: build 1a2b -> 3c4d``).
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
    ) -> None:
        t0 = time.perf_counter()
        self.config = config or Config.load()
        self.registry = registry or load_registry(self.config.plugin_path or None)
        order = list(backends) if backends is not None else list(self.config.backend_order)
        if backends is None:
            # the configured order first, then every other available backend
            order += [b for b in self.registry.available_backends() if b not in order]
        unknown = [b for b in order if b not in self.registry.backends]
        if backends is not None and unknown:
            raise PlanError(
                f"backends {unknown} are not known; known backends: {sorted(self.registry.backends)}"
            )
        self.backend_order = order
        self._configure_backends()
        self.graph: Graph = import_model(model, input_shapes)
        check_supported_ops(self.graph, self.registry, [b for b in order if b in self.registry.available_backends()])
        self.simplify_stats = simplify(self.graph, self.registry)
        self.plan_source = "given"
        self.plan_note = ""
        self._executor: Executor | None = None
        if plan is not None:
            self._plan = Plan.from_json(plan) if isinstance(plan, str) else plan
        else:
            stored = None
            if not overrides and store is not False:
                stored = self._stored_plan(store, order, objective)
            if stored is None:
                self._plan = heuristic_plan(self.graph, self.registry, order, overrides=overrides)
                self.plan_source = "heuristic"
        if self._executor is None:
            self._executor = Executor(self.graph, self._plan, self.registry)
        self.load_seconds = time.perf_counter() - t0

    def _stored_plan(self, store: Any, order: Sequence[str], objective: str) -> Plan | None:
        """The stored plan for this model, built into an executor, or None (with the reason
        in :attr:`plan_note`)."""
        from tuner.store import PlanStore
        from tuner.tune import plan_key

        if store is None:
            path = self.config.store_path
            if not path or not os.path.exists(path):
                self.plan_note = f"no plan store at {path}: running the untuned plan"
                return None
            store = path
        try:
            plans = store if isinstance(store, PlanStore) else PlanStore(store, readonly=True)
            allowed = [b for b in order if b in self.registry.available_backends()]
            key = plan_key(self.graph, self.registry, allowed, objective)
            found = plans.get_plan(key)
            if found is None:
                reasons = plans.why_not(key)
                self.plan_note = "no stored plan for this key: " + ("; ".join(reasons) if reasons else
                                                                   "this model was never tuned here")
                return None
            plan = found.plan()
            self._executor = Executor(self.graph, plan, self.registry)
        except Exception as exc:  # a broken store or plan must never stop the model from running
            self.plan_note = f"stored plan not used: {type(exc).__name__}: {exc}"
            self._executor = None
            return None
        self._plan = plan
        self.plan_source = "store"
        self.plan_note = f"plan {key.digest()[:16]} from the store (tuned {found.created_at})"
        return plan

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
        """Run the model; returns one array per name in ``output_names`` (all when None)."""
        arrays = self._check_feeds(feeds)
        names = self._check_outputs(output_names)
        return self.executor.run(arrays, names)

    def _check_outputs(self, output_names: Sequence[str] | None) -> list[str] | None:
        if output_names is None:
            return None
        if isinstance(output_names, str):
            raise FeedError(f"output_names must be a list of names, received the string {output_names!r}")
        known = [v.name for v in self.graph.outputs]
        bad = [n for n in output_names if n not in known]
        if bad:
            raise FeedError(f"unknown output name(s) {bad}; the model's outputs are {known}")
        return list(output_names)

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise FeedError(f"feeds must be a dict of input name -> array, received {type(feeds).__name__}")
        expected = {v.name: v for v in self.graph.inputs}
        unknown = [k for k in feeds if k not in expected]
        missing = [k for k in expected if k not in feeds]
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown input name(s) {unknown}")
            if missing:
                parts.append(f"missing input(s) {missing}")
            want = ", ".join(f"{v.name}: {v.dtype} {list(v.shape or ())}" for v in self.graph.inputs)
            raise FeedError(f"{'; '.join(parts)}; the model expects {want or 'no inputs'}")
        out: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            v = expected[name]
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            if arr.dtype != v.dtype:
                raise FeedError(
                    f"input {name!r}: received dtype {arr.dtype}, expected {v.dtype} "
                    f"(shape {list(v.shape or ())})"
                )
            if tuple(arr.shape) != tuple(v.shape or ()):
                raise FeedError(
                    f"input {name!r}: received shape {list(arr.shape)}, expected {list(v.shape or ())}"
                    f"; a session is planned for static shapes, create it with input_shapes= for others"
                )
            out[name] = arr
        return out

    def describe(self) -> str:
        """What runs where: the plan as a text table with a one-line summary."""
        used = ", ".join(f"{b}: {n} node(s)" for b, n in self._plan.backends_used().items())
        runtime_convs = sum(1 for c in self._plan.conversions if not c.at_build)
        note = f"plan: {self.plan_source}" + (f" ({self.plan_note})" if self.plan_note else "")
        return (
            f"{self.graph.summary()}\n{note}\nbackends: {used}; {runtime_convs} run-time conversion(s)\n"
            + self._plan.describe()
        )
