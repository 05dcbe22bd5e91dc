"""Backends: providers of implementations and layouts, found at run time.

A backend is a subclass of :class:`Backend`. Built-in backends and plugins are found the same
way: through the ``opdispatch.backends`` entry-point group (each entry point names a Backend
subclass), and from Python modules or packages in the folders listed in
``OPDISPATCH_PLUGIN_PATH`` (each module exposes ``OPDISPATCH_BACKENDS``, a list of Backend
subclasses). A backend that fails to import, is unavailable, or conflicts with an active one
is recorded with its reason; it never stops the others.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dispatch.errors import RegistryError

if TYPE_CHECKING:
    from dispatch.registry import Registry

ENTRY_POINT_GROUP = "opdispatch.backends"

#: Built-in backends, used only when the distribution's entry points are not installed
#: (e.g. running from a bare source tree); an installed package registers these same names
#: through its entry points.
BUILTIN_BACKENDS: dict[str, str] = {
    "numpy": "impls.numpy.backend:NumpyBackend",
    "native": "impls.native.backend:NativeBackend",
}


class Backend:
    """Base class of every backend.

    Subclasses set :attr:`name` (and :attr:`device`, :attr:`conflicts`) and override
    :meth:`availability`, :meth:`version` and :meth:`register`.
    """

    name: str = ""
    device: str = "cpu"
    #: names of backends that must never be active together with this one
    conflicts: tuple[str, ...] = ()

    def availability(self) -> str | None:
        """``None`` when the backend can run here, else why it cannot."""
        return None

    def version(self) -> str:
        """Version of the library or build behind this backend (part of plan keys)."""
        return "unknown"

    def register(self, registry: Registry) -> None:
        """Add this backend's layouts, converters and implementations to ``registry``."""
        raise NotImplementedError


@dataclass
class BackendStatus:
    """What became of one backend during discovery."""

    name: str
    origin: str
    backend: Backend | None = None
    available: bool = False
    reason: str | None = None
    version: str = ""
    layouts: list[str] = field(default_factory=list)
    implementations: int = 0


def _load_target(target: str) -> object:
    module, _, attr = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def _entry_point_sources() -> list[tuple[str, str, object]]:
    """``(name, origin, loader)`` for each entry point, built-ins first when not installed."""
    found: list[tuple[str, str, object]] = []
    seen: set[str] = set()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        found.append((ep.name, f"entry point {ep.value}", ep.load))
    for name, target in BUILTIN_BACKENDS.items():
        if name not in seen:
            seen.add(name)
            found.append((name, f"built-in {target}", lambda t=target: _load_target(t)))
    return found


def _plugin_modules(plugin_path: str | None) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    for folder in (plugin_path or "").split(os.pathsep):
        if not folder:
            continue
        base = Path(folder)
        if not base.is_dir():
            out.append((f"<missing folder {folder}>", base))
            continue
        for entry in sorted(base.iterdir()):
            if entry.suffix == ".py" and not entry.name.startswith("_"):
                out.append((entry.stem, entry))
            elif entry.is_dir() and (entry / "__init__.py").exists():
                out.append((entry.name, entry / "__init__.py"))
    return out


def _import_plugin(name: str, path: Path) -> list[type[Backend]]:
    if not path.exists():
        raise RegistryError(f"plugin folder {path} does not exist")
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
    if not classes:
        raise RegistryError(
            f"plugin module {path} defines no OPDISPATCH_BACKENDS list of Backend subclasses"
        )
    return list(classes)


def _short_error(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def discover(registry: Registry, plugin_path: str | None = None) -> None:
    """Find every backend, register the available ones into ``registry`` and record the
    status of all of them in ``registry.backends``."""
    candidates: list[tuple[str, str, object]] = list(_entry_point_sources())
    for name, path in _plugin_modules(plugin_path):
        candidates.append((name, f"plugin {path}", lambda n=name, p=path: _import_plugin(n, p)))

    for label, origin, loader in candidates:
        try:
            loaded = loader()  # type: ignore[operator]
            classes = loaded if isinstance(loaded, list) else [loaded]
        except BaseException as exc:  # a broken backend is reported, never fatal
            if isinstance(exc, KeyboardInterrupt):
                raise
            registry.backends.setdefault(
                label, BackendStatus(label, origin, reason=f"failed to import: {_short_error(exc)}")
            )
            continue
        for cls in classes:
            _activate(registry, cls, origin)


def _activate(registry: Registry, cls: object, origin: str) -> None:
    try:
        backend = cls() if isinstance(cls, type) else cls  # type: ignore[operator]
        if not isinstance(backend, Backend):
            raise RegistryError(f"{cls!r} is not a dispatch.backend.Backend subclass")
        name = backend.name or type(backend).__name__
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        label = getattr(cls, "__name__", repr(cls))
        registry.backends[label] = BackendStatus(label, origin, reason=_short_error(exc))
        return
    if name in registry.backends and registry.backends[name].backend is not None:
        registry.backends.setdefault(
            f"{name} ({origin})",
            BackendStatus(name, origin, reason=f"a backend named {name!r} is already registered "
                          f"from {registry.backends[name].origin}"),
        )
        return
    status = BackendStatus(name, origin, backend=backend)
    registry.backends[name] = status
    try:
        status.version = str(backend.version())
        reason = backend.availability()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        reason = f"availability check failed: {_short_error(exc)}"
    if reason is None:
        active_conflicts = [
            c for c in backend.conflicts if c in registry.backends and registry.backends[c].available
        ]
        active_conflicts += [
            n for n, s in registry.backends.items()
            if s.available and s.backend is not None and name in s.backend.conflicts
        ]
        if active_conflicts:
            reason = (
                f"conflicts with active backend {active_conflicts[0]!r} (registered first); "
                f"{name!r} was disabled"
            )
    if reason is not None:
        status.reason = reason
        return
    before_impls = len(registry.implementations)
    before_layouts = set(registry.layouts.layouts)
    snapshot = _snapshot(registry)
    try:
        backend.register(registry)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        _restore(registry, snapshot)
        status.reason = f"register() failed: {_short_error(exc)}"
        return
    status.available = True
    status.implementations = len(registry.implementations) - before_impls
    status.layouts = sorted(set(registry.layouts.layouts) - before_layouts)


def _snapshot(registry: Registry) -> tuple:
    return (
        dict(registry._by_name),
        {k: list(v) for k, v in registry._by_op.items()},
        dict(registry.layouts.layouts),
        {k: list(v) for k, v in registry.layouts.converters.items()},
    )


def _restore(registry: Registry, snap: tuple) -> None:
    """Undo a backend's partial registration so a failing ``register()`` leaves no trace."""
    registry._by_name, registry._by_op, registry.layouts.layouts, registry.layouts.converters = snap
    registry.layouts._paths.clear()


_REGISTRIES: dict[str | None, Registry] = {}


def load_registry(plugin_path: str | None = None, *, fresh: bool = False) -> Registry:
    """The registry of every discovered backend (cached per plugin path unless ``fresh``)."""
    from dispatch.registry import Registry
    from layouts.registry import LayoutRegistry
    from layouts.standard import standard_layout

    if not fresh and plugin_path in _REGISTRIES:
        return _REGISTRIES[plugin_path]
    registry = Registry(layouts=LayoutRegistry())
    registry.layouts.add_layout(standard_layout())
    discover(registry, plugin_path)
    if not fresh:
        _REGISTRIES[plugin_path] = registry
    return registry
