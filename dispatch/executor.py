"""Runs a :class:`~dispatch.plan.Plan`.

Everything is resolved when the executor is built: kernels are prepared once (weights packed,
constants converted to the layouts their consumers want), every tensor gets a slot index, and
the call list holds ``(callable, input slots, output slots)``. A run does no registry or dict
lookups: it walks the call list over a list of slots and releases each slot after its last
reader (buffer reuse by liveness: the allocator gets the memory back as soon as it is dead).
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dispatch import blas
from dispatch.errors import KernelError, PlanError
from dispatch.fusion import REGION_OP, FusedNode, step_node
from dispatch.graph import Graph, Node
from dispatch.guard import NonfiniteGuard
from dispatch.plan import Plan, PlanStep
from dispatch.plan_check import FALLBACK_WHERE, backends_of, validate_plan
from dispatch.registry import REFERENCE_BACKEND, STANDARD, Registry

#: seconds per backend, accumulated by every run in this context while it holds a dict: each
#: call's wall time is added under its backend (``"conversion"`` for layout conversions). A
#: server sets it around a request to export the time spent in each backend; unset, runs are
#: not timed.
BACKEND_SECONDS: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "opdispatch_backend_seconds", default=None)


@dataclass
class Call:
    """One entry of the call list."""

    label: str
    kind: str  # "kernel" or "convert"
    fn: Callable
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    impl: str
    backend: str
    #: expected physical (shape, dtype) per output, checked after each call (shape ``None``:
    #: a dynamic value, whose shape the data decides)
    expect: tuple[tuple[tuple[int, ...] | None, np.dtype], ...] = ()
    #: slots to release after this call (their last reader)
    free: tuple[int, ...] = ()
    #: the plan step and node a kernel call runs (``None`` for conversions)
    step: PlanStep | None = None
    node: Node | None = None


ReferenceKernel = tuple[Node, Callable, str]


def reference_kernels(registry: Registry, nodes: Sequence[Node],
                      exclude: Sequence[str] = (), fallback: bool = False) -> list[ReferenceKernel]:
    """``(node, built kernel, implementation name)`` of each node's reference implementation
    (:meth:`Registry.reference_impl`, never one named in ``exclude``), in order. A node no
    reference implementation supports raises LookupError naming it, unless ``fallback`` and
    onnxruntime runs it (its result is then the reference: :mod:`dispatch.reference_fallback`)."""
    from dispatch.reference_fallback import fallback_impl, fallback_kernel

    out = []
    for node in nodes:
        impl = registry.reference_impl(node, exclude=exclude)
        if impl is None:  # onnxruntime's result, where it runs the node (never the excluded one)
            ort = fallback_impl(registry, node) if fallback else None
            if ort is not None and ort.name not in exclude:
                out.append((node, fallback_kernel(ort, node), ort.name))
                continue
            raise LookupError(f"no reference implementation supports node {node.name!r} "
                              f"({node.key_op}; reference backend {REFERENCE_BACKEND})")
        out.append((node, impl.build(node), impl.name))
    return out


def reference_overrides(graph: Graph, registry: Registry, fallback: bool = False) -> dict[str, str]:
    """Node name -> the name of its reference implementation, for a whole-graph reference
    plan (``heuristic_plan(..., overrides=...)``) that priorities cannot change. With
    ``fallback``, a node without one that onnxruntime runs is left out: the reference plan runs
    it on onnxruntime (:func:`reference_plan`, :mod:`dispatch.reference_fallback`)."""
    from dispatch.reference_fallback import fallback_impl

    out = {}
    for node in graph.nodes:
        impl = registry.reference_impl(node)
        if impl is None and fallback and fallback_impl(registry, node) is not None:
            continue
        if impl is None:
            raise LookupError(
                f"no numpy reference implementation supports node {node.name!r} ({node.key_op})"
            )
        out[node.name] = impl.name
    return out


def reference_plan(graph: Graph, registry: Registry, fallback: bool = False) -> Plan:
    """The whole-graph reference plan: numpy's reference of every node; with ``fallback``
    (onnxruntime is allowed), onnxruntime's regions for the nodes without one."""
    from dispatch.heuristic import heuristic_plan
    from dispatch.reference_fallback import FALLBACK_BACKEND

    overrides = reference_overrides(graph, registry, fallback)
    # (every other node is forced to its numpy reference: onnxruntime first takes the rest)
    order = ([FALLBACK_BACKEND] if len(overrides) < len(graph.nodes) else []) + [REFERENCE_BACKEND]
    return heuristic_plan(graph, registry, order, overrides=overrides)


def run_reference(kernels: Sequence[ReferenceKernel], env: dict[str, np.ndarray]) -> None:
    """Run ``kernels`` in order over ``env`` (value name -> standard-layout array; values not
    in it are read as graph constants), adding every output to ``env``."""
    for node, kernel, _ in kernels:
        got = kernel(*[None if v is None else env.get(v.name, v.const) for v in node.inputs])
        got = got if isinstance(got, tuple | list) else (got,)
        for v, arr in zip(node.outputs, got):
            env[v.name] = np.asarray(arr)


@dataclass
class MemoryPlan:
    """Liveness-derived memory figures for one run (bytes)."""

    peak_bytes: int
    constant_bytes: int
    per_call_live_bytes: list[int] = field(default_factory=list)


class Executor:
    """A prepared, repeatedly runnable plan."""

    def __init__(self, graph: Graph, plan: Plan, registry: Registry) -> None:
        """Check ``plan`` against ``graph`` and ``registry`` (:func:`validate_plan`: a
        tampered or stale plan raises :class:`PlanError` and nothing is built), then build."""
        validate_plan(plan, graph, registry)
        self.graph = graph
        self.plan = plan
        self._slots: dict[tuple[str, str], int] = {}
        self._template: list[object] = []
        self._slot_bytes: list[int] = []
        self.calls: list[Call] = []
        self._input_slots: list[tuple[str, int]] = []
        self._output_slots: dict[str, int] = {}
        self._registry = registry
        self._fallbacks: dict[int, Call] = {}
        self._fallback_lock = threading.Lock()
        try:
            #: the BLAS and OpenMP thread counts in force while the plan runs (:mod:`dispatch.blas`)
            self.threads = blas.ThreadSettings.of_provenance(plan.provenance)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        self._build(registry)
        #: the non-finite guard (:mod:`dispatch.guard`) of a plan with a ``nonfinite_fallback``:
        #: requests whose float inputs hold NaN or Inf run the fallback plan, built then
        self.guard: NonfiniteGuard | None = None
        fallback = plan.nonfinite_fallback
        if fallback is not None:
            floats = [v.name for v in graph.inputs
                      if v.dtype is not None and np.dtype(v.dtype).kind in "fc"]
            self.guard = NonfiniteGuard(floats, lambda: _fallback_executor(graph, fallback, registry))
        #: whether a run holds :attr:`threads` (a step or a converter runs on the process's
        #: BLAS or OpenMP pools: :attr:`dispatch.backend.Backend.process_pools`)
        self.uses_process_pools = any(
            _uses_process_pools(registry, b) for b in backends_of(plan, registry))
        if self.uses_process_pools:
            blas.libraries(refresh=True)  # the libraries the kernels just loaded, found once here

    # -- building ----------------------------------------------------------------------
    def _slot(self, value: str, layout: str, nbytes: int = 0) -> int:
        key = (value, layout)
        if key not in self._slots:
            self._slots[key] = len(self._template)
            self._template.append(None)
            self._slot_bytes.append(nbytes)
        return self._slots[key]

    def _build(self, registry: Registry) -> None:
        graph, plan = self.graph, self.plan
        planned = [n for s in plan.steps for n in s.nodes]
        missing = [n.name for n in graph.nodes if n.name not in planned]
        extra = sorted(set(planned) - {n.name for n in graph.nodes})
        if missing or extra:
            raise PlanError(
                f"the plan does not match graph {graph.name!r}: nodes without a step: "
                f"{missing[:10]}; steps for unknown nodes: {extra[:10]}"
            )
        for v in graph.values.values():
            if v.is_const:
                self._template[self._slot(v.name, STANDARD, 0)] = v.const
        for v in graph.inputs:
            self._input_slots.append((v.name, self._slot(v.name, STANDARD, v.nbytes)))

        conv_by_target: dict[tuple[str, str], list] = {}
        for c in plan.conversions:
            conv_by_target[(c.value, c.dst)] = [registry.layouts.converter(n) for n in c.chain]

        # constants converted once, now
        for (value, dst), chain in conv_by_target.items():
            v = graph.value(value)
            if not v.is_const:
                continue
            arr = v.const
            for conv in chain:
                arr = conv(arr, v.shape)
            self._template[self._slot(value, dst, 0)] = arr

        emitted: set[tuple[str, str]] = set()
        by_name = {n.name: n for n in graph.nodes}
        for step in plan.steps:
            impl = registry.impl(step.impl)
            if impl.is_region != (step.op == REGION_OP):
                raise PlanError(
                    f"step {step.impl} over nodes {step.nodes[:5]} has op {step.op!r}, but the "
                    f"implementation is {'a region' if impl.is_region else 'not a region'} implementation"
                )
            if len(step.nodes) == 1 and not impl.is_region:
                node = by_name[step.nodes[0]]
            else:
                node = step_node(graph, step.nodes, step.op)
            if step.precision is not None:  # what a reduced-precision build needs
                if not impl.is_region:
                    raise PlanError(f"step {step.impl} over nodes {step.nodes[:5]} has a precision, "
                                    "which only region implementations take")
                node.attrs = {**node.attrs, "precision": step.precision}  # (a new region node)
            if (len(step.nodes) > 1 and not impl.is_region
                    and impl.pattern != tuple(n.key_op for n in node.nodes)):
                raise PlanError(
                    f"step {step.impl} covers nodes {step.nodes}, which are not a chain of its "
                    f"pattern {'+'.join(impl.pattern) or '(single node)'}"
                )
            ins: list[int] = []
            for v, lay in zip(node.inputs, step.layouts_in):
                if v is None:
                    ins.append(-1)
                    continue
                if lay != STANDARD or (v.name, lay) not in self._slots:
                    self._ensure_conversion(v.name, lay, conv_by_target, emitted, registry)
                ins.append(self._slots[(v.name, lay)])
            outs: list[int] = []
            expect = []
            for v, lay in zip(node.outputs, step.layouts_out):
                assert v.dtype is not None
                if v.shape is None:  # dynamic: sized when it runs, only its dtype checked
                    outs.append(self._slot(v.name, lay, 0))
                    expect.append((None, np.dtype(v.dtype)))
                    continue
                layout = registry.layouts.layout(lay)
                phys, stored = layout.stored_shape(v.shape), layout.stored_type(v.dtype)
                nbytes = int(np.prod(phys, dtype=np.int64)) * stored.itemsize
                outs.append(self._slot(v.name, lay, nbytes))
                expect.append((tuple(phys), stored))
            try:
                fn = impl.build(node)
            except Exception as exc:
                raise KernelError(
                    f"building {impl.name} (backend {impl.backend}) for node {node.name!r} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self.calls.append(
                Call(node.name, "kernel", fn, tuple(ins), tuple(outs), impl.name, impl.backend,
                     tuple(expect), step=step, node=node)
            )
        for v in graph.outputs:
            if (v.name, STANDARD) not in self._slots:
                self._ensure_conversion(v.name, STANDARD, conv_by_target, emitted, registry)
            self._output_slots[v.name] = self._slots[(v.name, STANDARD)]
        self._plan_liveness()

    def _ensure_conversion(self, value, dst, conv_by_target, emitted, registry) -> None:
        if (value, dst) in self._slots:
            return
        chain = conv_by_target.get((value, dst))
        if chain is None:
            have = [lay for (name, lay) in self._slots if name == value]
            raise PlanError(
                f"the plan has no conversion of {value!r} to layout {dst!r}; it exists in "
                f"{have or 'no layout yet'}"
            )
        conv0 = chain[0]
        src_slot = self._slots.get((value, conv0.src))
        if src_slot is None:
            raise PlanError(f"conversion of {value!r} reads layout {conv0.src!r}, which nothing produces")
        v = self.graph.value(value)
        assert v.shape is not None and v.dtype is not None
        shape = tuple(v.shape)
        fns = [c.fn for c in chain]
        if len(fns) == 1:
            f0 = fns[0]

            def fn(x, _f=f0, _s=shape):
                return _f(x, _s)
        else:

            def fn(x, _fs=tuple(fns), _s=shape):
                for f in _fs:
                    x = f(x, _s)
                return x

        layout = registry.layouts.layout(dst)
        phys, stored = layout.stored_shape(shape), layout.stored_type(v.dtype)
        nbytes = int(np.prod(phys, dtype=np.int64)) * stored.itemsize
        out = self._slot(value, dst, nbytes)
        self.calls.append(
            Call(
                f"convert {value} {conv0.src}->{dst}",
                "convert",
                fn,
                (src_slot,),
                (out,),
                " > ".join(c.name for c in chain),
                chain[0].backend,
                ((tuple(phys), stored),),
            )
        )
        emitted.add((value, dst))

    def _plan_liveness(self) -> None:
        """Find each slot's last reader and the peak of live bytes."""
        const_slots = {k for k, v in enumerate(self._template) if v is not None}
        keep = set(self._output_slots.values()) | const_slots
        last: dict[int, int] = {}
        for k, call in enumerate(self.calls):
            for s in call.ins:
                if s >= 0:
                    last[s] = k
            for s in call.outs:
                last.setdefault(s, k)  # written but never read: dead right away
        frees: dict[int, list[int]] = {}
        for s, k in last.items():
            if s not in keep:
                frees.setdefault(k, []).append(s)
        live = sum(self._slot_bytes[s] for _, s in self._input_slots)
        peak = live
        per_call = []
        for k, call in enumerate(self.calls):
            live += sum(self._slot_bytes[s] for s in call.outs)
            peak = max(peak, live)
            per_call.append(live)
            dead = tuple(frees.get(k, ()))
            live -= sum(self._slot_bytes[s] for s in dead)
            call.free = dead
        const_bytes = sum(
            int(getattr(self._template[s], "nbytes", 0)) for s in const_slots
        )
        self.memory = MemoryPlan(peak_bytes=peak, constant_bytes=const_bytes, per_call_live_bytes=per_call)

    # -- running -----------------------------------------------------------------------
    @property
    def executor(self) -> Executor:
        """This executor: a :class:`~dispatch.plan_runner.PlanRunner` of one stream."""
        return self

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str] | None = None,
        *,
        timings: list[float] | None = None,
        on_fault: Callable[[KernelError], None] | None = None,
    ) -> list[np.ndarray]:
        """Run once. ``feeds`` must already be validated (see ``Session.run``). When
        ``timings`` is a list, the wall time of each call (seconds) is appended to it.

        A call that raises stops the run with a :class:`KernelError` naming the node, the
        implementation and its backend. With ``on_fault``, a failing *kernel* call is re-run
        instead on the reference implementations of its nodes (:meth:`fallback_call`: its
        inputs converted to the standard layout, its outputs back to the layouts the rest of
        the plan reads), ``on_fault`` receives the error, and the run goes on; if the
        reference fails too, or a converter fails, the run stops with the error.

        The whole run holds the plan's thread settings (:attr:`threads`: BLAS and OpenMP
        thread counts, :func:`dispatch.blas.enter`), whatever the caller's are; the caller's
        are restored when it returns or raises. A plan whose steps all run on libraries with
        pools of their own (:attr:`uses_process_pools` false: onnxruntime, OpenVINO regions)
        sets none.

        A guarded plan (:attr:`guard`) first checks the float feeds: one holding a NaN or an
        infinity is run by the fallback plan's executor instead (built on first use; its
        ``timings`` are then those of the fallback's calls).
        """
        if timings is None:
            per_backend = BACKEND_SECONDS.get()
            if per_backend is not None:
                return self._run_by_backend(feeds, output_names, per_backend, on_fault)
        guard = self.guard
        if guard is not None and guard.needed(feeds):
            # NaN/Inf in the inputs: the plan that agrees with the reference answers
            return guard.executor().run(feeds, output_names, timings=timings, on_fault=on_fault)
        if not self.uses_process_pools:
            return self._run(feeds, output_names, timings, on_fault)
        token = blas.enter(self.threads)
        try:
            return self._run(feeds, output_names, timings, on_fault)
        finally:
            blas.leave(token)

    def _run_by_backend(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None,
                        per_backend: dict[str, float],
                        on_fault: Callable[[KernelError], None] | None) -> list[np.ndarray]:
        """:meth:`run`, each call's time added to ``per_backend`` (:data:`BACKEND_SECONDS`)."""
        guard = self.guard
        if guard is not None and guard.needed(feeds):
            return guard.executor().run(feeds, output_names, on_fault=on_fault)
        timings: list[float] = []
        try:
            return self.run(feeds, output_names, timings=timings, on_fault=on_fault)
        finally:
            for call, seconds in zip(self.calls, timings):
                backend = call.backend if call.kind == "kernel" else "conversion"
                per_backend[backend] = per_backend.get(backend, 0.0) + seconds

    def _run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str] | None,
        timings: list[float] | None,
        on_fault: Callable[[KernelError], None] | None,
    ) -> list[np.ndarray]:
        slots = list(self._template)
        for name, s in self._input_slots:
            slots[s] = feeds[name]
        calls = self.calls
        n = len(calls)
        k = 0
        while True:
            try:
                if timings is None:
                    while k < n:
                        self._invoke(calls[k], slots)
                        k += 1
                else:
                    while k < n:
                        t0 = time.perf_counter()
                        self._invoke(calls[k], slots)
                        timings.append(time.perf_counter() - t0)
                        k += 1
                break
            except Exception as exc:
                error = self._call_error(calls[k], exc)
                if on_fault is None or calls[k].kind != "kernel":
                    if error is exc:
                        raise
                    raise error from exc
                t0 = time.perf_counter()
                self._recover(k, slots, error)
                if timings is not None:
                    timings.append(time.perf_counter() - t0)
                on_fault(error)
                k += 1
        names = output_names if output_names is not None else list(self._output_slots)
        return [slots[self._output_slots[n]] for n in names]  # type: ignore[misc]

    def swap_kernel(self, step: PlanStep, fn: Callable) -> Callable:
        """Run ``fn`` in place of the kernel of ``step`` (one of this executor's plan steps)
        from now on, and return the function it replaces. ``fn`` must read and write what the
        step does (the same values, layouts, shapes and dtypes: a variant of the same region,
        e.g. in another precision); the accuracy objective's tuning tries variants this way
        without rebuilding the plan (:mod:`tuner.accuracy`)."""
        for k, call in enumerate(self.calls):
            if call.kind == "kernel" and call.step is step:
                self.calls[k] = dataclasses.replace(call, fn=fn)
                self._fallbacks.pop(k, None)
                return call.fn
        raise PlanError(f"step {step.impl} over nodes {step.nodes[:5]} is not a step of this executor's plan")

    @staticmethod
    def _call_error(call: Call, exc: Exception) -> KernelError:
        """``exc`` as a KernelError that names the call's node, implementation and backend."""
        if isinstance(exc, KernelError):
            if exc.node is None:
                exc.node, exc.impl, exc.backend = call.label, call.impl, call.backend
            return exc
        what = "converter" if call.kind == "convert" else "implementation"
        return KernelError(
            f"node {call.label!r}: {what} {call.impl} (backend {call.backend}) raised "
            f"{type(exc).__name__}: {exc}",
            node=call.label, impl=call.impl, backend=call.backend,
        )

    def _recover(self, k: int, slots: list, error: KernelError) -> None:
        """Run call ``k``'s reference fallback over ``slots``, or raise a KernelError that
        says both what failed and why the fallback could not answer."""
        try:
            self._invoke(self.fallback_call(k), slots)
        except Exception as again:
            raise KernelError(
                f"{error}; re-running it on the reference implementation failed too: "
                f"{type(again).__name__}: {again}",
                node=error.node, impl=error.impl, backend=error.backend,
            ) from again

    def fallback_call(self, k: int) -> Call:
        """The reference stand-in of kernel call ``k``, built on first use: the step's
        inputs are converted from the plan's layouts to the standard one (constants are read
        as stored in the graph), each of its nodes (one, a fused chain, or a region's
        subgraph, in order) runs on the reference backend's implementation (never the one
        that failed), and the outputs are converted to the layouts the step declared, so the
        rest of the plan reads them unchanged."""
        with self._fallback_lock:
            found = self._fallbacks.get(k)
            if found is None:
                found = self._fallbacks[k] = self._build_fallback(self.calls[k])
            return found

    def _build_fallback(self, call: Call) -> Call:
        registry, step, node = self._registry, call.step, call.node
        if call.kind != "kernel" or step is None or node is None:
            raise KernelError(f"{call.label!r} is a conversion; only kernel calls have a reference fallback")
        parts = node.nodes if isinstance(node, FusedNode) else [node]
        kernels = reference_kernels(registry, parts, exclude=[call.impl])

        def chain(src: str, dst: str, value) -> tuple:
            if src == dst:
                return ()
            return tuple(registry.layouts.path(src, dst, value.shape, value.dtype))

        ins = [
            None if v is None or v.is_const else (v, chain(lay, STANDARD, v))
            for v, lay in zip(node.inputs, step.layouts_in)
        ]
        outs = [(v, chain(STANDARD, lay, v)) for v, lay in zip(node.outputs, step.layouts_out)]

        def fallback(*args):
            env: dict[str, np.ndarray] = {}
            for spec, arr in zip(ins, args):
                if spec is None or arr is None:
                    continue
                v, convs = spec
                for conv in convs:
                    arr = conv(arr, v.shape)
                env[v.name] = arr
            run_reference(kernels, env)
            result = []
            for v, convs in outs:
                arr = env[v.name]
                for conv in convs:
                    arr = conv(arr, v.shape)
                result.append(arr)
            return tuple(result)

        return Call(call.label, "kernel", fallback, call.ins, call.outs,
                    " > ".join(name for _, _, name in kernels),
                    REFERENCE_BACKEND, call.expect, call.free, step, node)

    @staticmethod
    def _invoke(call: Call, slots: list) -> None:
        args = [slots[s] if s >= 0 else None for s in call.ins]
        out = call.fn(*args)
        if type(out) is not tuple:
            out = tuple(out) if isinstance(out, list) else (out,)
        if len(out) < len(call.outs):
            raise KernelError(
                f"node {call.label!r}: {call.impl} returned {len(out)} output(s), the node has "
                f"{len(call.outs)}"
            )
        for s, arr, (shape, dtype) in zip(call.outs, out, call.expect):
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr, dtype=dtype)
            if (shape is not None and arr.shape != shape) or arr.dtype != dtype:
                raise KernelError(
                    f"node {call.label!r}: {call.impl} (backend {call.backend}) produced an array "
                    f"of shape {arr.shape} and dtype {arr.dtype}; expected shape "
                    f"{shape if shape is not None else '(known at run time)'} and dtype {dtype}"
                )
            slots[s] = arr
        for s in call.free:
            slots[s] = None


def _uses_process_pools(registry: Registry, backend: str) -> bool:
    status = registry.backends.get(backend)
    return getattr(status.backend if status is not None else None, "process_pools", True)


def _fallback_executor(graph: Graph, fallback: Plan, registry: Registry) -> Executor:
    """A guarded plan's fallback executor, checked in full now (:func:`validate_plan`; only
    its outline was checked with the plan, :func:`dispatch.plan_check.check_outline`)."""
    try:
        return Executor(graph, fallback, registry)
    except PlanError as exc:
        raise PlanError(f"{FALLBACK_WHERE}: {exc}; the plan's NaN/Inf fallback cannot run "
                        f"(re-tune the model)") from None
