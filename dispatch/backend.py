"""Backends: providers of implementations and layouts, found at run time.

A backend is a subclass of :class:`Backend`. Built-in backends and plugins are found the same
way: through the ``opdispatch.backends`` entry-point group (each entry point names a Backend
subclass, or a list of them), and from Python modules or packages in the folders listed in
``OPDISPATCH_PLUGIN_PATH`` (each module exposes ``OPDISPATCH_BACKENDS``, a list of Backend
subclasses; a package is imported under a private name, so it imports its own modules
relatively). Every backend found is recorded in ``registry.backends`` with a
:class:`BackendStatus`: available, or the reason it is not. A plugin that fails to import, an
entry point that names nothing, a backend whose constructor, ``availability()``,
``version()`` or ``register()`` raises: each is reported with its error and never stops the
others; a failing ``register()`` leaves nothing behind in the registry.

Conflicts. A backend lists in :attr:`Backend.conflicts` the backends it must never be active
with; the relation is symmetric (either side may declare it). Discovery settles conflicts
deterministically, after every backend has been found and its availability checked:

1. the backends are ranked by the configured backend order (``OPDISPATCH_BACKENDS``, the
   config file's ``backend_order``, default ``onnxruntime, native, numpy``; the ``order`` argument of
   :func:`load_registry`), those not in it after those in it, ties in discovery order
   (entry points, then the plugin folders in path order, files sorted by name);
2. in rank order, an available backend that conflicts with one already accepted loses: it is
   not registered, and its status says which backend won, who declared the conflict and why
   the winner ranked first (:attr:`BackendStatus.lost_to` names the winner);
3. the winners are registered in discovery order; when a winner's ``register()`` fails it is
   not active, and a backend that lost only to it is accepted after all (a backend already
   registered is never displaced).

``Session(backends=[...])`` orders and restricts the active backends of a registry, but does
not reopen a settled conflict: to use the loser, put it first in the configured order.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the base class plugins subclass and the discovery record, re-exported from their leaf module
from dispatch.backend_base import Backend as Backend
from dispatch.backend_base import BackendStatus
from dispatch.entry_points import distribution_label, entry_points
from dispatch.errors import OpDispatchError, RegistryError

if TYPE_CHECKING:
    from dispatch.backend_manifest import Manifest
    from dispatch.registry import Registry

ENTRY_POINT_GROUP = "opdispatch.backends"

#: Built-in backends, used only when the distribution's entry points are not installed
#: (e.g. running from a bare source tree); an installed package registers these same names
#: through its entry points.
BUILTIN_BACKENDS: dict[str, str] = {
    "numpy": "impls.numpy.backend:NumpyBackend",
    "native": "impls.native.backend:NativeBackend",
}


Loader = Callable[[], Any]


def _load_target(target: str) -> object:
    module, _, attr = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def _entry_point_sources() -> list[tuple[str, str, Loader]]:
    """``(name, origin, loader)`` for each entry point, built-ins first when not installed."""
    found: list[tuple[str, str, Loader]] = []
    seen: set[str] = set()
    for ep in entry_points(ENTRY_POINT_GROUP):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        label = distribution_label(ep)
        by = f" of {label}" if label else ""
        found.append((ep.name, f"entry point {ep.value}{by}", ep.load))
    for name, target in BUILTIN_BACKENDS.items():
        if name not in seen:
            seen.add(name)
            found.append((name, f"built-in {target}", lambda t=target: _load_target(t)))
    return found


def _plugin_modules(plugin_path: str | None) -> list[tuple[str, Path]]:
    """``(name, path)`` of each plugin module in the folders of ``plugin_path``; a folder
    that is missing, is a file or cannot be listed, and a ``.py`` entry that is no readable
    file (a dangling link), are listed too, so that importing them reports why."""
    out: list[tuple[str, Path]] = []
    for folder in (plugin_path or "").split(os.pathsep):
        if not folder:
            continue
        base = Path(folder)
        try:
            is_dir = base.is_dir()
            exists = is_dir or base.exists()
        except OSError:
            is_dir = exists = False
        if not is_dir:
            label = "missing folder" if not exists else "not a folder"
            out.append((f"<{label} {folder}>", base))
            continue
        try:
            entries = sorted(base.iterdir())
        except OSError:
            out.append((f"<unreadable folder {folder}>", base))
            continue
        for entry in entries:
            if entry.name.startswith(("_", ".")):
                continue
            try:
                if entry.suffix == ".py" and not entry.is_dir():
                    out.append((entry.stem, entry))  # a dangling link fails on import, with why
                elif entry.is_dir() and (entry / "__init__.py").exists():
                    out.append((entry.name, entry / "__init__.py"))
            except OSError:
                out.append((entry.stem, entry))
    return out


def _import_plugin(name: str, path: Path) -> list[object]:
    if name.startswith("<unreadable folder "):
        try:
            list(path.iterdir())
        except OSError as exc:
            raise RegistryError(
                f"plugin folder {path} cannot be listed ({type(exc).__name__}: {exc})") from None
    if name.startswith("<not a folder "):
        raise RegistryError(
            f"plugin path entry {path} is a file, not a folder: OPDISPATCH_PLUGIN_PATH lists "
            f"folders (separated by {os.pathsep!r}) holding plugin modules and packages; put the "
            f"module in a folder and list the folder"
        )
    if name.startswith("<missing folder "):
        raise RegistryError(f"plugin folder {path} does not exist")
    if not path.is_file():
        raise RegistryError(
            f"plugin module {path} is not a readable file"
            + (" (a symbolic link to a missing file)" if path.is_symlink() else "")
        )
    mod_name = f"opdispatch_plugin_{name}"
    spec = importlib.util.spec_from_file_location(
        mod_name, path, submodule_search_locations=[str(path.parent)] if path.name == "__init__.py" else None
    )
    if spec is None or spec.loader is None:
        raise RegistryError(f"cannot import plugin module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    classes = getattr(module, "OPDISPATCH_BACKENDS", None)
    if isinstance(classes, type):
        classes = [classes]
    if not classes:
        raise RegistryError(
            f"plugin module {path} defines no OPDISPATCH_BACKENDS list of Backend subclasses"
        )
    if not isinstance(classes, list | tuple):
        raise RegistryError(
            f"plugin module {path}: OPDISPATCH_BACKENDS must be a list of Backend subclasses, "
            f"received {type(classes).__name__}"
        )
    return list(classes)


#: opdispatch's own folders: an error's location is the deepest frame outside them (the
#: plugin's line), or none when the error was raised by opdispatch's checks alone
_OWN_DIRS = tuple(str(Path(__file__).resolve().parent.parent / d) + os.sep
                  for d in ("dispatch", "layouts"))


def _short_error(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and not f.filename.startswith(_OWN_DIRS)]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def configured_order() -> tuple[tuple[str, ...], str]:
    """The configured backend order and where it came from (see :mod:`dispatch.config`)."""
    from dispatch.config import DEFAULT_BACKEND_ORDER, Config

    try:
        cfg = Config.load()
    except OpDispatchError as exc:  # a broken config is reported where it is used
        return tuple(DEFAULT_BACKEND_ORDER), f"default (the configuration failed to load: {exc})"
    return tuple(cfg.backend_order), cfg.origin.get("backend_order", "default")


def discover(
    registry: Registry, plugin_path: str | None = None, order: Sequence[str] | None = None
) -> None:
    """Find every backend, register the available ones into ``registry`` and record the
    status of all of them in ``registry.backends``. ``order`` ranks conflicting backends
    (default: the configured backend order; see the module docstring)."""
    if order is None:
        ranked_by, source = configured_order()
    else:
        ranked_by, source = tuple(order), "argument"
    _discover(registry, plugin_path, ranked_by, source)


def _discover(
    registry: Registry, plugin_path: str | None, order: tuple[str, ...], source: str,
    manifest: Manifest | None = None,
) -> None:
    candidates: list[tuple[str, str, Loader]] = list(_entry_point_sources())
    for name, path in _plugin_modules(plugin_path):
        candidates.append((name, f"plugin {path}", lambda n=name, p=path: _import_plugin(n, p)))

    found: list[BackendStatus] = []
    for label, origin, loader in candidates:
        try:
            loaded = loader()
            classes = list(loaded) if isinstance(loaded, list | tuple) else [loaded]
        except BaseException as exc:  # a broken backend is reported, never fatal
            if isinstance(exc, KeyboardInterrupt):
                raise
            _record(registry, BackendStatus(label, origin, reason=f"failed to import: {_short_error(exc)}"))
            continue
        for cls in classes:
            status = _instantiate(registry, cls, origin, label)
            if status is not None:
                found.append(status)
    _settle(registry, found, order, source, manifest)


def _record(registry: Registry, status: BackendStatus) -> BackendStatus:
    """Add ``status`` under its name, or under ``name (origin)`` when the name is taken."""
    label = status.name
    if label in registry.backends:
        label = f"{status.name} ({status.origin})"
        k = 2
        while label in registry.backends:
            label, k = f"{status.name} ({status.origin}) #{k}", k + 1
    registry.backends[label] = status
    return status


def _describe(obj: object) -> str:
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}, which is not one"
    if isinstance(obj, type(os)):
        return f"module {obj.__name__!r}"
    text = repr(obj)
    return f"{type(obj).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _instantiate(
    registry: Registry, cls: object, origin: str, source: str | None = None
) -> BackendStatus | None:
    """Create the backend of ``cls`` and check its name, version, availability and declared
    conflicts. Returns its status (recorded in ``registry.backends``), or ``None`` when it
    cannot take part (the failure is recorded, under the backend's name when it has one, else
    under ``source``: the entry point's or plugin module's name)."""
    label = source or type(cls).__name__
    try:
        if isinstance(cls, Backend) or (isinstance(cls, type) and issubclass(cls, Backend)):
            name = getattr(cls, "name", "")
            label = name if isinstance(name, str) and name else getattr(cls, "__name__", label)
    except Exception:  # a hostile object: keep the source's name
        pass
    try:
        if isinstance(cls, type) and issubclass(cls, Backend):
            backend = cls()
        elif isinstance(cls, Backend):
            backend = cls
        else:
            raise RegistryError(
                f"expected a dispatch.backend.Backend subclass, received {_describe(cls)}"
            )
        name = backend.name or type(backend).__name__
        if not isinstance(name, str):
            raise RegistryError(f"Backend.name must be a string, received {name!r}")
        conflicts = backend.conflicts
        if isinstance(conflicts, str):
            conflicts = (conflicts,)
        if not isinstance(conflicts, list | tuple | set | frozenset) or not all(
            isinstance(c, str) for c in conflicts
        ):
            raise RegistryError(
                f"backend {name!r}: conflicts must be a tuple of backend names, received "
                f"{backend.conflicts!r}"
            )
        backend.conflicts = tuple(conflicts)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        _record(registry, BackendStatus(label, origin, reason=_short_error(exc)))
        return None
    existing = registry.backends.get(name)
    if existing is not None and existing.backend is not None:
        _record(registry, BackendStatus(
            name, origin, reason=f"a backend named {name!r} is already registered from "
            f"{existing.origin}"))
        return None
    if existing is not None:  # a failure recorded under this name: keep it under its origin
        del registry.backends[name]
        _record(registry, existing)
    status = BackendStatus(name, origin, backend=backend)
    registry.backends[name] = status
    try:
        status.version = str(backend.version())
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        status.version = f"unknown ({type(exc).__name__})"
        status.reason = f"version() failed: {_short_error(exc)}"
        return status
    try:
        reason = backend.availability()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        reason = f"availability check failed: {_short_error(exc)}"
    if reason is not None:
        status.reason = str(reason)
    return status


def _conflict(a: BackendStatus, b: BackendStatus) -> str | None:
    """Who declares a conflict between ``a`` and ``b`` (``None``: they do not conflict)."""
    assert a.backend is not None and b.backend is not None
    a_says, b_says = b.name in a.backend.conflicts, a.name in b.backend.conflicts
    if a_says and b_says:
        return f"{a.name!r} and {b.name!r} each declare a conflict with the other"
    if a_says:
        return f"{a.name!r} declares a conflict with {b.name!r}"
    if b_says:
        return f"{b.name!r} declares a conflict with {a.name!r}"
    return None


def _settle(
    registry: Registry, found: Sequence[BackendStatus], order: Sequence[str], source: str,
    manifest: Manifest | None = None,
) -> None:
    """Settle conflicts among ``found`` (and the backends already active in ``registry``)
    and register the winners; see the module docstring. With a ``manifest`` whose backends
    are the winners, the winners' registrations are deferred instead."""
    order = tuple(order)
    rank = {st.name: (order.index(st.name) if st.name in order else len(order), k)
            for k, st in enumerate(found)}
    fixed = [s for s in registry.backends.values()
             if s.available and not any(s is f for f in found)]
    active: list[BackendStatus] = []
    failed: set[str] = set()
    eligible = sorted((st for st in found if st.reason is None), key=lambda s: rank[s.name])
    while True:
        accepted = fixed + active
        done = {st.name for st in active} | failed
        for st in eligible:
            if st.name in done:
                continue
            rival = next((a for a in accepted if _conflict(st, a)), None)
            if rival is None:
                st.reason, st.lost_to = None, None
                accepted.append(st)
                continue
            short, full = _why(rival, st, rank, order, source, fixed)
            st.lost_to = rival.name
            st.reason = (
                f"conflicts with active backend {rival.name!r} ({short}): "
                f"{_conflict(st, rival)}; {rival.name!r} wins because {full}; "
                f"{st.name!r} was disabled"
            )
        chosen = {st.name for st in accepted}
        todo = [st for st in found if st.name in chosen and st.name not in done]
        if not todo:
            return
        before = len(failed)
        if manifest is not None and not active and not failed and manifest.matches(todo):
            _defer_all(registry, manifest, todo)
            return
        for st in todo:  # in discovery order
            if _register(registry, st):
                active.append(st)
            else:
                failed.add(st.name)
        if len(failed) == before:
            return


def _why(
    winner: BackendStatus, loser: BackendStatus, rank: dict[str, tuple[int, int]],
    order: tuple[str, ...], source: str, fixed: Sequence[BackendStatus],
) -> tuple[str, str]:
    """Why ``winner`` beat ``loser``: a few words (the CLI's table shows the start of a
    reason) and the full explanation."""
    shown = f"[{', '.join(order)}] ({source})"
    w, lo = rank.get(winner.name), rank[loser.name]
    if w is None or any(winner is f for f in fixed):
        return "active first", f"it was active before {loser.name!r} was added"
    if w[0] < lo[0] and loser.name in order:
        return "first in backend order", (
            f"it comes first in the configured backend order {shown}; put {loser.name!r} "
            f"before {winner.name!r} there to use {loser.name!r} instead")
    if w[0] < lo[0]:
        return "in backend order", (
            f"it is in the configured backend order {shown} and {loser.name!r} is not; put "
            f"{loser.name!r} before {winner.name!r} there to use it instead")
    if w < lo:
        return "found first", (
            f"neither is in the configured backend order {shown} and it was found first "
            f"({winner.origin}, before {loser.origin})")
    return "active first", (
        f"it was already active when {loser.name!r} was reconsidered (after the backend that "
        f"first beat {loser.name!r} failed to register)")


def _activate(registry: Registry, cls: object, origin: str) -> None:
    """Add one backend to an already discovered ``registry`` (tests, embedding programs): it
    loses a conflict with any backend that is already active."""
    status = _instantiate(registry, cls, origin)
    if status is not None:
        _settle(registry, [status], (), "none: the backend was added after discovery")


def _defer_all(registry: Registry, manifest: Manifest, winners: Sequence[BackendStatus]) -> None:
    """Defer the registration of each winner (see :mod:`dispatch.backend_manifest`); one
    that brings custom operators registers now, after the backends it needs."""
    for st in winners:
        entry = manifest.entry(st.name)
        assert entry is not None and st.backend is not None
        if entry.get("custom_ops"):
            needs = st.backend.registration_needs
            registry.complete(tuple(needs) if needs is not None else None)
            _register(registry, st)
            continue
        st.available, st.reason = True, None
        st.implementations = len(entry["impls"])
        st.layouts = sorted(entry.get("layouts") or ())
        st.custom_ops = []
        registry.defer(manifest.deferred(st), complete_registration)


def complete_registration(registry: Registry, status: BackendStatus) -> bool:
    """Run the deferred ``register()`` of ``status``'s backend (see
    :meth:`dispatch.registry.Registry.complete`)."""
    status.available = False
    return _register(registry, status)


def _register(registry: Registry, status: BackendStatus) -> bool:
    """Run the backend's ``register()``; on failure undo what it added and record why."""
    backend = status.backend
    assert backend is not None
    before = registry.snapshot()
    try:
        backend.register(registry)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        registry.restore(before)
        status.reason = f"register() failed: {_short_error(exc)}"
        return False
    status.available = True
    status.reason = None
    status.implementations, status.layouts, status.custom_ops = registry.note_registration(
        status.name, before)
    return True


_REGISTRIES: dict[tuple[str | None, tuple[str, ...]], Registry] = {}


def load_registry(
    plugin_path: str | None = None, *, fresh: bool = False, order: Sequence[str] | None = None,
    manifest_dir: Path | None = None,
) -> Registry:
    """The registry of every discovered backend (cached per plugin path and backend order
    unless ``fresh``). ``order`` ranks conflicting backends (default: the configured backend
    order). With ``manifest_dir`` (the graph cache folder), a registry made here reads the
    manifest of the last full registration and defers every backend's registration until
    it is needed, or writes that manifest (:mod:`dispatch.backend_manifest`)."""
    from dispatch import backend_manifest
    from dispatch.registry import Registry
    from layouts.precision import register_precision_layouts
    from layouts.registry import LayoutRegistry
    from layouts.standard import standard_layout

    ranked_by, source = (tuple(order), "argument") if order is not None else configured_order()
    key = (plugin_path, ranked_by)
    if not fresh and key in _REGISTRIES:
        return _REGISTRIES[key]
    registry = Registry(layouts=LayoutRegistry())
    registry.layouts.add_layout(standard_layout())
    register_precision_layouts(registry.layouts)
    ctx = backend_manifest.context(plugin_path, ranked_by) if manifest_dir is not None else ""
    manifest = backend_manifest.read(manifest_dir, ctx) if manifest_dir is not None else None
    before = set(sys.modules)
    _discover(registry, plugin_path, ranked_by, source, manifest)
    if manifest_dir is not None and not registry.deferred:
        backend_manifest.write(manifest_dir, ctx, registry, set(sys.modules) - before)
    if not fresh:
        _REGISTRIES[key] = registry
    return registry
