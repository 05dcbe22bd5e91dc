"""What the last full registration of the backends recorded, so that a process registers
only the backends it uses (issue 13: start-up).

Registering every backend imports every kernel module (the numpy reference's 20 modules,
oneDNN's, the native backend's: ~25 ms on a 2-core machine), while a Session that starts
from a stored plan runs one or two backends. What a plan key needs of the others (their
implementation and layout names, :func:`tuner.fingerprint.implementation_digests`) and what a
graph needs (which operators they implement) is the same at every start as long as the code
is: a full registration writes it to a manifest in the graph cache folder, and a later
:func:`dispatch.backend.load_registry` given that folder defers each backend's
``register()`` (:meth:`dispatch.registry.Registry.defer`) until something asks for it.

A manifest is used only when everything a registration depends on is as it was:

- the context: Python's version, opdispatch's version, ``sys.path``, the plugin path, the
  backend order and every ``OPDISPATCH_*`` environment variable (its file name is their
  digest);
- every module file of opdispatch's packages loaded at the time, and every module file
  first loaded by the discovery that wrote it (plugins, libraries a backend imported), by
  size and modification time;
- the backends: discovery still finds, creates and checks every backend (its version and
  availability are live), and the winners must be the recorded ones, with the same origins
  and versions, in the same order.

Anything else (a missing, unreadable, foreign or stale manifest) registers every backend
as before and writes a new manifest. A backend that brings custom operators registers at
once (importing a model needs their schemas).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.deferred_backends import DeferredBackend

if TYPE_CHECKING:
    from dispatch.backend_base import BackendStatus
    from dispatch.registry import Registry

#: bumped when the manifest's content changes meaning
MANIFEST_FORMAT = 1
#: the folder inside the graph cache folder
FOLDER = "backends"
#: opdispatch's packages, whose loaded module files every manifest stamps
_PACKAGES = ("dispatch", "layouts", "impls", "tuner")
_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Manifest:
    """A usable manifest: per backend, in registration order, what its registration added."""

    backends: tuple[dict[str, Any], ...]

    def entry(self, name: str) -> dict[str, Any] | None:
        return next((b for b in self.backends if b["name"] == name), None)

    def matches(self, winners: Sequence[BackendStatus]) -> bool:
        """Whether it recorded exactly these discovery winners, in this order."""
        return [(b["name"], b.get("origin"), b.get("version")) for b in self.backends] == [
            (st.name, st.origin, st.version) for st in winners]

    def deferred(self, status: BackendStatus) -> DeferredBackend:
        """What it recorded of ``status``'s backend, for :meth:`Registry.defer`."""
        entry = self.entry(status.name)
        assert entry is not None and status.backend is not None
        needs = status.backend.registration_needs
        return DeferredBackend(
            status, dict(entry["impls"]), tuple(entry.get("layouts") or ()),
            tuple(entry.get("converters") or ()), tuple(entry.get("names") or ()),
            None if needs is None else tuple(needs))


def context(plugin_path: str | None, order: tuple[str, ...]) -> str:
    """The digest of what a registration depends on besides files (see the module docstring)."""
    import dispatch

    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("OPDISPATCH_"))
    text = json.dumps({
        "format": MANIFEST_FORMAT, "python": sys.version, "executable": sys.executable,
        "opdispatch": getattr(dispatch, "__version__", ""), "path": sys.path,
        "plugin_path": plugin_path, "order": list(order), "env": env,
    })
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _module_files(new: set[str]) -> list[str]:
    """The files of opdispatch's loaded modules and of the modules named in ``new``."""
    own = tuple(str(_ROOT / p) + os.sep for p in _PACKAGES)
    files = set()
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if isinstance(path, str) and (name in new or path.startswith(own)):
            files.add(path)
    return sorted(files)


def read(folder: Path, ctx: str) -> Manifest | None:
    """The manifest of context ``ctx`` in ``folder`` when it is usable, else ``None``."""
    try:
        data = json.loads((folder / FOLDER / f"{ctx}.json").read_text())
        if data.get("format") != MANIFEST_FORMAT or data.get("context") != ctx:
            return None
        for path, stamp in data["stamps"].items():
            if _stamp(path) != stamp:
                return None
        backends = tuple(data["backends"])
        for b in backends:
            if not (isinstance(b.get("name"), str) and isinstance(b.get("impls"), dict)
                    and isinstance(b.get("names"), list)):
                return None
        return Manifest(backends)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write(folder: Path, ctx: str, registry: Registry, new_modules: set[str]) -> None:
    """Record what every registered backend of ``registry`` added (nothing when a
    registration is deferred: that registry did not register everything itself). A cache
    that cannot be written is left alone."""
    if registry.deferred:
        return
    backends = []
    for name in registry.registration_order:
        status = registry.backends.get(name)
        if status is None or not status.available:
            continue
        # what its register() added (a backend may add another backend's: a custom
        # operator's reference implementation)
        impls, converters = registry.added_by(name)
        backends.append({
            "name": name, "origin": status.origin, "version": status.version,
            "impls": impls,
            "layouts": list(status.layouts),
            "converters": converters,
            "custom_ops": list(status.custom_ops),
            # what keys its plans (tuner.fingerprint.implementation_digests)
            "names": registry.names_by_backend([name])[name],
        })
    stamps = {p: s for p in _module_files(new_modules) if (s := _stamp(p)) is not None}
    data = {"format": MANIFEST_FORMAT, "context": ctx, "backends": backends, "stamps": stamps}
    target = folder / FOLDER
    with contextlib.suppress(OSError):
        target.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target, prefix=".manifest-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, target / f"{ctx}.json")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
