"""Fixtures of the serving tests: a plan store with real tuned plans of two committed exports
(a CNN and a BERT encoder), and live ``opdispatch serve`` processes on loopback ports.

The server runs in a process of its own, as in production (kserve's framework owns the signal
handlers and the event loop of its process); the tests talk to it with Triton's own client.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

# found, not imported: kserve's gRPC messages and tritonclient's share the protocol's package
# name ("inference") and cannot both load in one process; the server runs in its own anyway
if importlib.util.find_spec("kserve") is None:
    pytest.skip("the serving extra (kserve) is not installed", allow_module_level=True)

CORPUS = Path(__file__).resolve().parents[1] / "models" / "corpus"
#: a CNN with static shapes (batch 2) and a BERT encoder with symbolic batch and sequence
CNN = CORPUS / "resnet_torchscript.onnx"
BERT = CORPUS / "bert_torchscript.onnx"
#: a model that is never tuned in these tests (not ready without --allow-untuned)
UNTUNED = CORPUS / "regnet_torchscript.onnx"
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SEQ = 8
#: the batch sizes of BERT tuned for the dynamic batcher (1 is the served shape)
BERT_BATCHES = (1, 4)
#: the throughput objective the CNN is also tuned for
THROUGHPUT = "throughput@n=2"


def bert_shapes(batch: int) -> dict[str, list[int]]:
    return {name: [batch, SEQ] for name in BERT_INPUTS}


def bert_feeds(seed: int, batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, (batch, SEQ), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((batch, SEQ), np.int64),
            "token_type_ids": np.zeros((batch, SEQ), np.int64)}


def cnn_feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}


@pytest.fixture(scope="session")
def tuned_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store with the CNN (latency and throughput) and BERT (batch 1 and 4) tuned here."""
    import dispatch

    path = str(tmp_path_factory.mktemp("serve-store") / "plans.sqlite")
    dispatch.Session(str(CNN), store=path).tune(budget_s=6)
    dispatch.Session(str(CNN), store=path, objective=THROUGHPUT).tune(budget_s=10)
    for batch in BERT_BATCHES:
        dispatch.Session(str(BERT), store=path, input_shapes=bert_shapes(batch)).tune(budget_s=5)
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    """A running ``opdispatch serve`` process and where it listens."""

    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(self, path: str, body: bytes, content_type: str = "application/json"
             ) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://{self.http_url}{path}", data=body,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post_oversized(self, path: str, size: int) -> bytes:
        """Declare a ``size``-byte body, send its start and read the answer (a server that
        refuses it answers before the body is sent, then closes)."""
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=30) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {size}\r\n\r\n".encode())
            with contextlib.suppress(OSError):
                sock.sendall(b"\0" * min(size, 65536))
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < int(
                    answer.lower().partition(b"content-length: ")[2].split(b"\r\n")[0] or 0):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        return answer

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the server did not stop within {timeout} s of SIGTERM; its "
                                 f"log:\n{self.log.read_text()[-4000:]}") from None


@contextlib.contextmanager
def live_server(args: Sequence[str], folder: Path, ready_timeout: float = 180.0
                ) -> Iterator[LiveServer]:
    """``opdispatch serve ARGS`` on free loopback ports, up once ``/v2/health/live`` answers."""
    http_port, grpc_port = free_port(), free_port()
    log = folder / f"serve-{http_port}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "serve", *args, "--host", "127.0.0.1",
             "--http-port", str(http_port), "--grpc-port", str(grpc_port)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    server = LiveServer(process, http_port, grpc_port, log)
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"opdispatch serve exited with {process.returncode}:\n"
                                     f"{log.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                if server.get("/v2/health/live")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"opdispatch serve did not answer within {ready_timeout} s:"
                                     f"\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            server.stop()
