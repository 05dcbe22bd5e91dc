"""Fuzz worker: loads (and, when small, runs) each model it receives, in its own process, so
that a crash (a segfault in onnx, protobuf or a native kernel) shows as a negative exit
status instead of killing the test run.

Protocol (stdin/stdout, binary): each request is a 4-byte big-endian length followed by that
many bytes of a serialized model; each answer is one JSON line
``{"outcome": "ok" | "clean" | "bad", "error": "Type: message", "ran": bool}``:

- ``ok``: the Session was created (and run, when its tensors are small);
- ``clean``: an :class:`~dispatch.errors.OpDispatchError` was raised (the expected refusal);
- ``bad``: any other exception escaped (a bug: the importer must raise its own errors).

End of input (stdin closed) ends the worker. ``OPDISPATCH_FUZZ_CONTROL=segv`` makes it crash with
SIGSEGV on its first request and ``=hang`` makes it sleep: the controls prove that the
parent detects a crash and a hang. The worker caps its address space (``RLIMIT_AS``) and the
size of a tensor (:data:`dispatch.graph.MAX_TENSOR_BYTES`), so that a hostile model cannot
exhaust the shared machine's memory.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import struct
import sys
import time
import traceback
import warnings

#: address-space cap of the worker (bytes); allocations past it raise MemoryError
ADDRESS_SPACE_LIMIT = 8 << 30
#: the largest tensor a fuzzed model may declare in the worker
TENSOR_LIMIT = 256 << 20
#: a model whose tensors take at most this much in all is also run once
RUN_LIMIT_BYTES = 16 << 20


def _read_exact(stream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _feeds(session) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for v in session.graph.inputs:
        shape = tuple(v.shape or ())
        if v.dtype.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(v.dtype)
        elif v.dtype.kind in "iub":
            feeds[v.name] = np.ones(shape, v.dtype)
        else:
            feeds[v.name] = np.zeros(shape, v.dtype)
    return feeds


def handle(payload: bytes, registry) -> dict:
    """Load (and maybe run) one model; returns the answer for it."""
    from dispatch.errors import OpDispatchError
    from dispatch.session import Session

    ran = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session = Session(payload, registry=registry, store=False)
            total = sum(v.nbytes for v in session.graph.values.values())
            if total <= RUN_LIMIT_BYTES:
                session.run(None, _feeds(session))
                ran = True
    except OpDispatchError as exc:
        return {"outcome": "clean", "error": f"{type(exc).__name__}: {str(exc)[:300]}", "ran": ran}
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "bad", "ran": ran,
                "error": f"{type(exc).__name__}: {str(exc)[:300]} (at {where.filename}:{where.lineno})"}
    return {"outcome": "ok", "error": "", "ran": ran}


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import dispatch.graph
    from dispatch.backend import load_registry

    dispatch.graph.MAX_TENSOR_BYTES = TENSOR_LIMIT
    registry = load_registry()
    control = os.environ.get("OPDISPATCH_FUZZ_CONTROL", "")
    # answers go to a private copy of stdout; anything a library prints goes to stderr
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    stdout.write(b'{"ready": true}\n')
    stdout.flush()
    while True:
        try:
            (n,) = struct.unpack(">I", _read_exact(stdin, 4))
            payload = _read_exact(stdin, n)
        except EOFError:
            return 0
        if control == "segv":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if control == "hang":
            time.sleep(3600)
        answer = handle(payload, registry)
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
