"""Plain onnxruntime behind the same server framework: the serving bench's baseline
(bench/test_bench_serve.py, issue 32).

One ``onnxruntime.InferenceSession`` (default settings: all graph optimisations, intra-op
threads = onnxruntime's default, the physical cores; or ``--threads T``) in a minimal
``kserve.Model`` subclass, served by :func:`tuner.serve.server.serve_models`, the very
function ``opdispatch serve`` serves its models with: kserve's ``ModelServer``, the same HTTP
routes (readiness, metadata), the same body limit, the same host binding (127.0.0.1 here,
always). Only the model class differs, so the difference between the two servers' figures is
the model's: the tuned plan and its serving configuration against one plain session.

Requests are run off the event loop in a thread pool of ``--workers`` threads (default
Python's default for a pool, ``min(32, cores + 4)``), all calling the one session, as a user
serving onnxruntime from several threads does; ``--workers 0`` runs each request on the event
loop instead (a synchronous ``predict``, as kserve's custom-model example does: one request at
a time).

    python bench/ort_kserve_server.py MODEL.onnx --http-port 8090 [--threads 2] [--name NAME]

It serves until SIGTERM or SIGINT (graceful: requests in flight are answered).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: onnxruntime's type strings -> the protocol's datatypes
DATATYPES = {
    "tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(double)": "FP64",
    "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}
#: the loopback address: the only one this bench server binds
HOST = "127.0.0.1"


def _model_class() -> type:
    """The model class (built here so that importing this module imports no kserve)."""
    from kserve import Model
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferRequest, InferResponse

    from tuner.serve.oip_model import infer_response

    class OrtModel(Model):
        """One onnxruntime session answering Open Inference Protocol requests."""

        def __init__(self, name: str, path: str, threads: int | None = None,
                     workers: int | None = None) -> None:
            super().__init__(name)
            self.path = path
            self.threads = threads
            self.workers = workers
            self.session: Any = None
            self._pool: ThreadPoolExecutor | None = None

        def load(self) -> bool:
            import onnxruntime as ort

            options = ort.SessionOptions()
            if self.threads:
                options.intra_op_num_threads = self.threads
            self.session = ort.InferenceSession(self.path, options,
                                                providers=["CPUExecutionProvider"])
            if self.workers != 0:
                self._pool = ThreadPoolExecutor(max_workers=self.workers,
                                                thread_name_prefix=f"ort-{self.name}")
            self.ready = True
            return True

        def start(self) -> None:  # readiness is load()'s
            pass

        async def describe(self) -> dict[str, Any]:
            """What :func:`tuner.serve.server.serve_models`' readiness and metadata routes
            show."""
            import onnxruntime as ort

            return {"ready": self.ready, "reason": "" if self.ready else "not loaded",
                    "platform": "onnxruntime_onnx",
                    "version": None, "inputs": _tensors(self.session.get_inputs()),
                    "outputs": _tensors(self.session.get_outputs()),
                    "plan": {"runtime": f"onnxruntime {ort.__version__}",
                             "intra_op_threads": self.threads or "default",
                             "workers": (self._pool._max_workers if self._pool is not None
                                         else "the event loop")}}

        def _run(self, names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
            return self.session.run(names, feeds)

        async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None,
                          response_headers: dict[str, str] | None = None) -> InferResponse:
            if not isinstance(payload, InferRequest):
                raise InvalidInput(f"model {self.name!r} speaks the Open Inference Protocol "
                                   f"(v2): POST /v2/models/{self.name}/infer")
            try:
                feeds = {t.name: t.as_numpy() for t in payload.inputs}
            except Exception as exc:
                raise InvalidInput(f"an input cannot be decoded: {exc}") from None
            names = [o.name for o in payload.request_outputs or []] or [
                o.name for o in self.session.get_outputs()]
            try:
                if self._pool is None:
                    results = self._run(names, feeds)
                else:
                    loop = asyncio.get_running_loop()
                    results = await loop.run_in_executor(self._pool, self._run, names, feeds)
            except Exception as exc:  # onnxruntime's errors on a bad feed
                if type(exc).__module__.startswith("onnxruntime"):
                    raise InvalidInput(f"onnxruntime: {exc}") from None
                raise
            return infer_response(payload, self.name, dict(zip(names, results)))

        def close(self) -> None:
            """Release the request threads (once the server stopped; the framework's
            ``stop()``, called on SIGTERM, only marks the model not ready)."""
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    return OrtModel


def _tensors(args: Any) -> list[dict[str, Any]]:
    """onnxruntime's inputs or outputs as the protocol's ``$metadata_tensor`` (``-1``: a
    symbolic dimension)."""
    return [{"name": a.name, "datatype": DATATYPES.get(a.type, a.type),
             "shape": [d if isinstance(d, int) and d >= 0 else -1 for d in (a.shape or [])]}
            for a in args]


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the .onnx model")
    p.add_argument("--http-port", type=int, required=True, help="HTTP/REST port on 127.0.0.1")
    p.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default 0: no gRPC)")
    p.add_argument("--name", default=None, help="the model's name (default: the file's stem)")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime intra-op threads (default: onnxruntime's)")
    p.add_argument("--workers", type=int, default=None,
                   help="threads running requests (default min(32, cores + 4); 0: the event "
                        "loop, one request at a time)")
    p.add_argument("--max-body-mb", type=float, default=64.0,
                   help="largest request body accepted, in MiB (default 64, as opdispatch serve)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="on SIGTERM, how long requests in flight may take (default 30)")
    args = p.parse_args(argv)
    if not Path(args.model).is_file():
        p.error(f"{args.model}: no such model file")
    from tuner.serve.server import serve_models

    model = _model_class()(args.name or Path(args.model).stem, args.model, args.threads,
                           args.workers)
    model.load()
    print(f"ort_kserve_server: {model.name} (onnxruntime, intra-op threads "
          f"{args.threads or 'default'}) on http://{HOST}:{args.http_port}", file=sys.stderr,
          flush=True)
    try:
        serve_models([model], host=HOST, http_port=args.http_port,
                     grpc_port=args.grpc_port or None,
                     max_body_bytes=int(args.max_body_mb * (1 << 20)), grace_s=args.grace_s)
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
