"""The thread settings of the BLAS and OpenMP libraries in force while a plan runs.

A plan's numpy steps call into BLAS (numpy's OpenBLAS; MKL or BLIS in other builds), its native
and oneDNN steps into OpenMP. OpenBLAS worker threads spin for 2**28 cycles (~0.1 s) after each
call before they sleep, MKL's for 200 ms: spinning workers hold the cores the next native kernel,
the next plan being validated or another library's pool needs, and a 1 ms kernel takes 4-8 ms
(measured on resnet50: a mixed numpy/native plan ran in 276 ms instead of 62 ms; a T5 encoder
tuned in a script that imported numpy first stored the wrong plan, which then ran 2.4-3.4x slower
than onnxruntime). How long they spin can only be set before the library loads
(``OPENBLAS_THREAD_TIMEOUT``), which a library imported after numpy cannot do.

What this module guarantees instead, whatever was imported first and whatever ran before in the
process: while a plan runs (:meth:`dispatch.executor.Executor.run`) and while the tuner measures
and validates (the whole of ``tuner.tune.tune``), every BLAS library in the process runs at the
plan's BLAS thread count (:class:`ThreadSettings`; :data:`PLAN_BLAS_THREADS`, one thread: a
single BLAS thread runs in the caller and never leaves a worker spinning) and every OpenMP
runtime at the plan's OpenMP thread count on the running thread; the caller's settings are put
back when the run ends, so the program's own numpy use is unchanged. The tuner measures under
the settings plans then run with and records them in the plan (``provenance["threading"]``,
:func:`record`); the tuning summary says when the process's own settings differ
(:func:`differences`).

The libraries are found by ``threadpoolctl`` (once, and again when an executor is built after
new modules were imported: :func:`libraries`); a run does no discovery, only a few ctypes calls
(get the current count, set it where it differs, set it back). Process-wide pools (OpenBLAS
with its own threads) are set by the first of concurrent runs and restored by the last; per-
thread settings (OpenMP, OpenBLAS built on OpenMP) by each run on its own thread.

Why one BLAS thread rather than the plan's thread count: with more, how long the workers spin
after a numpy step would again depend on whether numpy was loaded before dispatch, and so would
the next step's time; and every BLAS spins in its own way (MKL, BLIS). Numpy-only plans are
slower for it (a quiet 16-core machine: resnet50's numpy plan 149 ms at 1 thread against 74 ms
at 16, 192 ms at 16 with ``OPENBLAS_THREAD_TIMEOUT=4``), but they are the reference, not what
the tuner picks. The settings are part of a plan (its provenance), not of its key: the numpy
version in the software fingerprint already names the OpenBLAS a wheel bundles, while the
libraries loaded and their thread counts depend on what the program imported, which must not
decide whether a stored plan is found.

Not covered: the program's own multi-threaded numpy call right before a run can leave OpenBLAS
workers spinning into the run (for ~0.1 s when numpy was loaded before dispatch), as it would
before any other library's call. ``OPENBLAS_THREAD_TIMEOUT=4`` is still set when ``dispatch`` is
imported before numpy, so that then the program's own calls do not leave spinning workers behind
either; plans do not depend on it.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: The environment variable (and value) that makes OpenBLAS threads sleep right after a call;
#: a default set at import when numpy is not loaded yet (it is read when OpenBLAS loads).
BLAS_SPIN_ENV = ("OPENBLAS_THREAD_TIMEOUT", "4")
#: Whether this process's OpenBLAS workers sleep right after each call (the variable was in the
#: environment when numpy loaded it): outside plan runs only, reported, never relied on.
BLAS_SPIN_SHORT = "numpy" not in sys.modules or BLAS_SPIN_ENV[0] in os.environ
if "numpy" not in sys.modules:
    os.environ.setdefault(*BLAS_SPIN_ENV)

#: BLAS threads a plan's numpy steps run with: one, so that no BLAS worker is left spinning
#: after a numpy step (numpy steps are the reference kernels and rarely hot; the tuner measures
#: them under this setting, so a plan that would need a faster numpy BLAS step is not chosen).
PLAN_BLAS_THREADS = 1
#: Environment variables that change how these libraries thread (recorded with a plan).
THREAD_ENV = ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "KMP_BLOCKTIME")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configured_threads() -> int:
    """The thread count the native kernels use: the configured ``threads``, or every usable
    core when it is 0 (as the backends' ``configure`` does)."""
    from dispatch.config import Config
    from dispatch.errors import ConfigError

    try:
        configured = Config.load().threads
    except ConfigError:
        configured = 0
    return configured or _usable_cores()


@dataclass(frozen=True)
class ThreadSettings:
    """The thread counts in force while a plan runs: ``blas`` for every BLAS library (the
    numpy steps), ``openmp`` for every OpenMP runtime (on the thread that runs the plan)."""

    blas: int
    openmp: int

    @classmethod
    def default(cls, threads: int | None = None) -> ThreadSettings:
        """The settings of a plan that records none (untuned plans, plans stored before they
        were recorded): :data:`PLAN_BLAS_THREADS` and ``threads`` (default: the configured
        thread count, :func:`configured_threads`)."""
        return cls(PLAN_BLAS_THREADS, int(threads) if threads else configured_threads())

    @classmethod
    def of_provenance(cls, provenance: Mapping[str, Any] | None) -> ThreadSettings:
        """The settings a plan records in ``provenance["threading"]`` (see :func:`record`), else
        :meth:`default`. A malformed record raises ValueError saying what was received."""
        rec = (provenance or {}).get("threading")
        if rec is None:
            return cls.default()
        counts = [rec.get(k) if isinstance(rec, Mapping) else None
                  for k in ("blas_threads", "openmp_threads")]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
            raise ValueError("plan provenance: threading must be an object with positive integer "
                             f"blas_threads and openmp_threads, received {rec!r}")
        return cls(counts[0], counts[1])


# ------------------------------------------------------------------------------------------
# the libraries
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Library:
    """One thread pool threadpoolctl found: ``api`` ``"blas"`` or ``"openmp"``, ``internal``
    (openblas, mkl, blis, flexiblas, openmp), its file, version and threading layer, how to
    read and set its thread count, and whether the setting is process-wide (a pool of its own)
    or per calling thread (OpenMP)."""

    api: str
    internal: str
    filepath: str
    version: str | None
    threading_layer: str | None
    get: Callable[[], int | None]
    set: Callable[[int], Any]
    process_wide: bool

    def describe(self) -> dict[str, Any]:
        """JSON-able facts about the library and its present thread count."""
        out: dict[str, Any] = {"api": self.internal, "file": os.path.basename(self.filepath),
                               "version": self.version, "threads": self.get()}
        if self.threading_layer:
            out["threading_layer"] = self.threading_layer
        return out


def _openblas_calls(lc: Any) -> tuple[Callable, Callable] | None:
    """OpenBLAS's own get/set functions (any symbol prefix and suffix), called directly: the
    threadpoolctl setter lets only one Python thread ever set OpenBLAS, and plans run from any."""
    dynlib = getattr(lc, "dynlib", None)
    for prefix in ("", "scipy_"):
        for suffix in ("", "64_", "_64"):
            get = getattr(dynlib, f"{prefix}openblas_get_num_threads{suffix}", None)
            put = getattr(dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                return get, put
    return None


def _library(lc: Any) -> Library:
    layer = getattr(lc, "threading_layer", None)
    get, put = lc.get_num_threads, lc.set_num_threads
    process_wide = lc.user_api == "blas" and layer != "openmp"
    if lc.internal_api == "openblas" and layer != "openmp":
        direct = _openblas_calls(lc)
        if direct is not None:
            get, put = direct
    elif lc.user_api == "openmp":
        dynlib = getattr(lc, "dynlib", None)
        omp_get = getattr(dynlib, "omp_get_max_threads", None)
        omp_set = getattr(dynlib, "omp_set_num_threads", None)
        if omp_get is not None and omp_set is not None:
            get, put = omp_get, omp_set
    return Library(lc.user_api, lc.internal_api, lc.filepath, lc.version, layer, get, put, process_wide)


_scan_lock = threading.Lock()
_scanned: tuple[int, tuple[Library, ...]] | None = None


def libraries(refresh: bool = False) -> tuple[Library, ...]:
    """The BLAS and OpenMP libraries loaded in this process, found by threadpoolctl (about
    10 ms) the first time and again, with ``refresh``, when modules were imported since (a
    library loads with the extension module that links it). Empty when threadpoolctl is not
    installed."""
    global _scanned
    if _scanned is not None and (not refresh or _scanned[0] == len(sys.modules)):
        return _scanned[1]
    with _scan_lock:
        if _scanned is not None and (not refresh or _scanned[0] == len(sys.modules)):
            return _scanned[1]
        seen = len(sys.modules)
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            found: tuple[Library, ...] = ()
        else:
            with warnings.catch_warnings():  # its advice on mixed OpenMP runtimes: not ours to give
                warnings.simplefilter("ignore")
                controllers = ThreadpoolController().lib_controllers
            found = tuple(_library(lc) for lc in controllers if lc.user_api in ("blas", "openmp"))
        _scanned = (seen, found)
        return found


# ------------------------------------------------------------------------------------------
# putting the settings in force around a run
# ------------------------------------------------------------------------------------------


class _Shared:
    """The process-wide pools: set by the first of concurrent runs, restored by the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: list[tuple[Library, int]] = []
        self.blas: int | None = None
        #: runs that started while another run held a different BLAS setting (it was kept)
        self.conflicts = 0


_SHARED = _Shared()


def _want(lib: Library, settings: ThreadSettings) -> int:
    return settings.openmp if lib.api == "openmp" else settings.blas


def enter(settings: ThreadSettings) -> list[tuple[Library, int]]:
    """Put ``settings`` in force for a run on this thread; returns what :func:`leave` puts
    back. Every call must be paired with a :func:`leave` of its result (``try/finally``)."""
    libs = _scanned[1] if _scanned is not None else libraries()
    with _SHARED.lock:
        if _SHARED.depth == 0:
            saved = []
            for lib in libs:
                if lib.process_wide:
                    old = lib.get()
                    if old is not None and old != settings.blas:
                        lib.set(settings.blas)
                        saved.append((lib, old))
            _SHARED.saved, _SHARED.blas = saved, settings.blas
        elif _SHARED.blas != settings.blas:
            _SHARED.conflicts += 1
        _SHARED.depth += 1
    mine: list[tuple[Library, int]] = []
    try:
        for lib in libs:
            if not lib.process_wide:
                want = _want(lib, settings)
                old = lib.get()
                if old is not None and old != want:
                    lib.set(want)
                    mine.append((lib, old))
    except BaseException:
        leave(mine)
        raise
    return mine


def leave(token: list[tuple[Library, int]]) -> None:
    """Restore what :func:`enter` changed on this thread and, after the last concurrent run,
    the process-wide pools."""
    for lib, old in reversed(token):
        lib.set(old)
    with _SHARED.lock:
        _SHARED.depth -= 1
        if _SHARED.depth == 0:
            for lib, old in reversed(_SHARED.saved):
                lib.set(old)
            _SHARED.saved, _SHARED.blas = [], None


_local = threading.local()


def current() -> ThreadSettings | None:
    """The settings an enclosing :func:`in_force` block holds on this thread, else None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextmanager
def in_force(settings: ThreadSettings | None = None) -> Iterator[ThreadSettings]:
    """``settings`` in force on this thread inside the block (see :func:`enter`), the
    caller's restored after it. Without ``settings``: those of the enclosing block (the
    tuner's, around its measurements), else :meth:`ThreadSettings.default`. Libraries are
    looked up again first when modules were imported since the last look."""
    settings = settings or current() or ThreadSettings.default()
    libraries(refresh=True)
    token = enter(settings)
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(settings)
    try:
        yield settings
    finally:
        stack.pop()
        leave(token)


# ------------------------------------------------------------------------------------------
# what a plan was tuned with, and how this process differs
# ------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {k: os.environ[k] for k in THREAD_ENV if k in os.environ}


def process_state() -> dict[str, Any]:
    """This process's own settings, outside plan runs (on the calling thread): BLAS and
    OpenMP thread counts per library, whether OpenBLAS workers sleep right after a call
    (:data:`BLAS_SPIN_SHORT`), the relevant environment variables."""
    libs = libraries(refresh=True)
    with _SHARED.lock:  # inside a run the process-wide pools hold the run's setting
        saved = {id(lib): old for lib, old in _SHARED.saved}
    return {
        "libraries": [dict(lib.describe(), threads=saved.get(id(lib), lib.get())) for lib in libs],
        "blas_workers_sleep": BLAS_SPIN_SHORT,
        "env": _env(),
    }


def record(settings: ThreadSettings, outside: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a plan is tuned with, for ``provenance["threading"]``: the settings, every BLAS
    and OpenMP library (name, file, version, threading layer) and the process's own settings
    outside runs (``outside``, default :func:`process_state` now)."""
    outside = dict(outside) if outside is not None else process_state()
    libs = []
    for lib in libraries():
        libs.append(dict(lib.describe(), threads=_want(lib, settings)))
    return {"blas_threads": settings.blas, "openmp_threads": settings.openmp,
            "libraries": libs, "process": outside}


def _names(libs: list[Mapping[str, Any]], openmp: bool) -> str:
    out = [" ".join(str(x) for x in (lib.get("api"), lib.get("version")) if x) + f" ({lib.get('file')})"
           for lib in libs if (lib.get("api") == "openmp") == openmp]
    return ", ".join(out) or "none loaded"


def describe(rec: Mapping[str, Any]) -> str:
    """One line saying which settings a record (:func:`record`) holds."""
    libs = list(rec.get("libraries") or [])
    return (f"{rec.get('blas_threads')} BLAS thread(s) ({_names(libs, False)}) and "
            f"{rec.get('openmp_threads')} OpenMP thread(s) ({_names(libs, True)}), set around "
            "each run")


def differences(rec: Mapping[str, Any], state: Mapping[str, Any] | None = None) -> list[str]:
    """How a process's own settings (``state``, default :func:`process_state` now; the tuner
    passes the record's own ``process``) differ from those plans run with in a record
    (:func:`record`): a library at another thread count outside runs, one loaded now that was
    not then (or gone, or at another version), OpenBLAS workers left spinning after the
    program's own calls, a threading variable set differently. Empty when they match."""
    state = process_state() if state is None else state
    out: list[str] = []
    tuned = {lib.get("file"): lib for lib in rec.get("libraries") or []}
    now = {lib.get("file"): lib for lib in state.get("libraries") or []}
    threads = []
    for name, lib in now.items():
        was = tuned.get(name)
        if was is None:
            out.append(f"{lib.get('api')} ({name}) is loaded now but was not when the plan was tuned")
            continue
        if was.get("version") != lib.get("version"):
            out.append(f"{lib.get('api')} ({name}): version {was.get('version')} when tuned, "
                       f"{lib.get('version')} now")
        if lib.get("threads") is not None and lib.get("threads") != was.get("threads"):
            threads.append(f"{lib.get('api')} ({name}) {lib.get('threads')} thread(s), "
                           f"plans {was.get('threads')}")
    if threads:
        out.append("outside plan runs " + ", ".join(threads) + " (the plans' settings are put "
                   "in force around each run and the process's restored after it)")
    out += [f"{lib.get('api')} ({name}) was loaded when the plan was tuned, not now"
            for name, lib in tuned.items() if name not in now]
    if not state.get("blas_workers_sleep", True):
        out.append("OpenBLAS workers spin ~0.1 s after the program's own multi-threaded numpy "
                   f"calls (numpy was loaded before dispatch without {BLAS_SPIN_ENV[0]}): that "
                   "slows whatever runs right after them")
    env_then = (rec.get("process") or {}).get("env") or {}
    env_now = state.get("env") or {}
    out += [f"{k}: {env_then.get(k, 'unset')} when tuned, {env_now.get(k, 'unset')} now"
            for k in sorted(set(env_then) | set(env_now)) if env_then.get(k) != env_now.get(k)]
    return out
