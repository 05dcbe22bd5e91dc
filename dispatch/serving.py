"""A plan's serving configuration: how many requests it runs at once, and on what.

A plan tuned for latency runs one request at a time on every core: one executor, its library
regions built with the configured threads. A plan tuned for throughput
(``throughput@n=N[,p99=MS]``: :class:`dispatch.objective.Objective`) also records how
a server runs it (:class:`ServingConfig`, ``Plan.serving``), in one of two modes:

- ``streams``: ``streams`` independent executors of the plan, each with its own library
  sessions and compiled models built for ``threads`` threads (onnxruntime intra-op threads,
  OpenVINO inference threads, the OpenMP threads of native and oneDNN steps); a request takes
  a free stream, or waits for one (:class:`dispatch.stream_pool.StreamPool`). ``2 x 1`` on two
  cores is onnxruntime's "one session per request, one thread each";
- ``shared``: one executor that up to ``requests`` requests run at once; its OpenVINO regions
  are compiled with the throughput hint and ``streams`` of OpenVINO's own CPU streams when
  ``streams`` > 1 (each request on an infer request of its own, OpenVINO scheduling them onto
  its streams), else as for latency; its onnxruntime sessions run the requests on their
  intra-op pool of ``threads``. ``shared`` with one stream and the configured threads is
  what a latency plan does when several threads call it.

While an executor is built for a configuration, :func:`building` puts its settings in force
for the region builders to read (:func:`build_settings`): nothing else changes a library's
settings, and a plan without a configuration builds exactly as before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dispatch.errors import PlanError

#: how a configuration runs concurrent requests (see the module docstring)
MODES = ("streams", "shared")


@dataclass(frozen=True)
class ServingConfig:
    """How a plan serves concurrent requests (see the module docstring).

    Attributes:
        mode: ``"streams"`` (independent executors) or ``"shared"`` (one executor, the
            libraries' own streams and pools).
        streams: executors (``streams`` mode) or OpenVINO CPU streams (``shared`` mode).
        threads: threads per stream (``streams`` mode); in ``shared`` mode each library's
            threads (OpenVINO's shared among its streams). ``0``: the configured threads.
        requests: how many requests may run at once (more wait for a free one).
        concurrency: the requests in flight the configuration was tuned for.
        batch: the batch size a server's batcher should group requests into (``None``: the
            model is run as it is fed; a model exported with batch 1 is never re-batched).
    """

    mode: str = "streams"
    streams: int = 1
    threads: int = 0
    requests: int = 1
    concurrency: int = 1
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PlanError(f"serving: mode must be one of {', '.join(MODES)}, received {self.mode!r}")
        for name in ("streams", "requests", "concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(f"serving: {name} must be a positive integer, received {value!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise PlanError(f"serving: threads must be a non-negative integer, received {self.threads!r}")
        if self.batch is not None and (not isinstance(self.batch, int) or isinstance(self.batch, bool)
                                       or self.batch < 1):
            raise PlanError(f"serving: batch must be null or a positive integer, received {self.batch!r}")
        if self.mode == "streams" and self.requests != self.streams:
            raise PlanError(f"serving: in streams mode each stream runs one request at a time, so "
                            f"requests ({self.requests}) must equal streams ({self.streams})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> ServingConfig:
        """The configuration of a plan's JSON ``serving`` object; anything else raises
        :class:`PlanError` saying what was received and what is expected."""
        if not isinstance(data, Mapping):
            raise PlanError(f"plan: serving must be a JSON object, received {type(data).__name__}")
        names = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - names)
        if unknown:
            raise PlanError(f"plan: serving has unknown field(s) {unknown}; expected {sorted(names)}")
        return cls(**dict(data))

    def label(self) -> str:
        """A short description, e.g. ``2 streams x 1 thread``, ``1 executor shared by 4
        requests, the configured threads, OpenVINO throughput hint with 2 streams`` or
        ``2 streams x 1 thread, batches of 2``."""
        threads = "the configured threads" if self.threads == 0 else (
            f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        batch = f", batches of {self.batch}" if self.batch else ""
        if self.mode == "shared":
            hint = (f", OpenVINO throughput hint with {self.streams} streams" if self.streams > 1
                    else "")
            if self.requests == 1:
                return f"1 executor, 1 request at a time, {threads}{hint}{batch}"
            return f"1 executor shared by {self.requests} requests, {threads}{hint}{batch}"
        return f"{self.streams} stream{'s' if self.streams != 1 else ''} x {threads}{batch}"

    @property
    def concurrent(self) -> bool:
        """Whether more than one request runs at once."""
        return self.requests > 1


@dataclass(frozen=True)
class BuildSettings:
    """What region builders read while an executor is built for a configuration."""

    #: threads per stream for every library (``0``: each library's configured threads)
    threads: int = 0
    #: OpenVINO CPU streams under the throughput hint (``0``: the latency set-up, one stream)
    library_streams: int = 0
    #: whether several streams share the cores (library pools must not spin between runs)
    shared_cores: bool = False


_BUILD: contextvars.ContextVar[BuildSettings | None] = contextvars.ContextVar(
    "opdispatch_serving_build", default=None)


def settings_of(config: ServingConfig | None) -> BuildSettings | None:
    """The build settings of ``config`` (``None``: the latency set-up)."""
    if config is None:
        return None
    if config.mode == "shared":
        return BuildSettings(threads=config.threads,
                             library_streams=config.streams if config.streams > 1 else 0)
    return BuildSettings(threads=config.threads, shared_cores=config.streams > 1)


@contextlib.contextmanager
def building(config: ServingConfig | None) -> Iterator[BuildSettings | None]:
    """Put ``config``'s build settings in force (in this thread and context) while the block
    builds an executor."""
    settings = settings_of(config)
    token = _BUILD.set(settings)
    try:
        yield settings
    finally:
        _BUILD.reset(token)


def build_settings() -> BuildSettings | None:
    """The settings of the configuration an executor is being built for, else ``None``."""
    return _BUILD.get()
