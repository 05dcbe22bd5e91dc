"""The serving bench's lean client (bench/raw_infer_client.py) against a loopback socket that
answers with canned HTTP bytes: how it reads lengths, chunks, errors and closed connections
(tests/serve/test_oip_server.py drives it against the live server)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("tritonclient.http")
from bench.raw_infer_client import RawInferClient

HEADER = json.dumps({"model_name": "m", "outputs": [
    {"name": "y", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}
).encode()
BODY = HEADER + np.arange(2, dtype=np.float32).tobytes()


def _plain(body: bytes = BODY, status: str = "200 OK") -> bytes:
    binary = f"inference-header-content-length: {len(HEADER)}\r\n" if body == BODY else ""
    return (f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{binary}\r\n").encode() + body


def _chunked(body: bytes = BODY, pieces: int = 3) -> bytes:
    step = -(-len(body) // pieces)
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step])
                      for i in range(0, len(body), step))
    return (f"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
            f"inference-header-content-length: {len(HEADER)}\r\n\r\n").encode() + chunks + \
        b"0\r\n\r\n"


class Canned:
    """A loopback server answering each request (read up to its declared length) with the
    next canned answer; ``None`` closes the connection instead."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.sock, contextlib.suppress(OSError):  # OSError: closed by the test
            self._answer_all()

    def _answer_all(self) -> None:
        while self.answers:
            conn, _ = self.sock.accept()
            with conn:
                while self.answers:
                    request = self._read(conn)
                    if request is None:
                        break
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    for i in range(0, len(answer), 7):  # in small pieces
                        conn.sendall(answer[i:i + 7])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(10)

    @staticmethod
    def _read(conn: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                return None
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body


@pytest.fixture
def servers() -> Iterator[list[Canned]]:
    made: list[Canned] = []
    yield made
    for server in made:
        server.close()


@pytest.fixture
def canned(servers):
    def make(answers: list[bytes | None]) -> Canned:
        servers.append(Canned(answers))
        return servers[-1]

    return make


@pytest.fixture
def client() -> Iterator[RawInferClient]:
    made: list[RawInferClient] = []

    def make(server: Canned, outputs: list[str] | None = None) -> RawInferClient:
        c = RawInferClient(server.address, "m", {"x": np.ones((1, 3), np.float32)},
                           ["y"] if outputs is None else outputs, timeout_s=10)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_the_request_is_the_triton_clients_binary_encoding(client, canned):
    server = canned([_plain()])
    assert client(server).send() is None
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/m/infer HTTP/1.1"
    size = int(next(v for k, _, v in (line.partition(": ") for line in lines)
                    if k == "Inference-Header-Content-Length"))
    request = json.loads(body[:size])
    assert request["inputs"][0]["parameters"]["binary_data_size"] == 12
    assert request["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]
    np.testing.assert_array_equal(np.frombuffer(body[size:], np.float32), np.ones(3))


def test_lengths_and_chunks_are_read_on_one_kept_connection(client, canned):
    server = canned([_plain(), _chunked(), _chunked(pieces=1), _plain()])
    c = client(server)
    assert [c.send() for _ in range(4)] == [None] * 4
    assert len(server.requests) == 4


def test_an_error_status_is_reported_with_the_answer(client, canned):
    refused = b'{"error": "input x: expected [1, 4]"}'
    server = canned([_plain(refused, "400 Bad Request"), _plain()])
    c = client(server)
    error = c.send()
    assert error is not None and error.startswith("HTTP 400") and "expected [1, 4]" in error
    assert c.send() is None


def test_a_missing_output_or_a_malformed_answer_is_an_error(client, canned):
    assert "lacks output(s) ['z']" in client(canned([_plain()]), ["z"]).send()
    assert "malformed answer" in client(canned([_plain(b"not json")])).send()


def test_a_closed_connection_is_an_error_and_the_next_request_reconnects(client, canned):
    server = canned([None, _plain()])
    c = client(server)
    error = c.send()
    assert error is not None and "closed the connection" in error
    assert c.send() is None
