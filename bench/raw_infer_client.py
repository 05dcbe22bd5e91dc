"""A lean Open Inference Protocol client for the serving bench's load generator
(bench/serve_load.py): one request, encoded once by Triton's own HTTP client, sent again and
again on one kept-alive loopback connection.

Why: the load generator runs on the machine it measures. On the 2-core AVX2 machine, Triton's
HTTP client (geventhttpclient under 16 Python threads, the request's JSON and body joined
again for every request, the response decoded into an ``InferResult``) took 0.12-0.14 cores
loading ``served`` mobilenet_v2 at 135 requests/s (``perf``: half of it in the interpreter, a
seventh in ``memmove``): about 0.9 ms of CPU a request taken from the server it measures. A
load generator that sends a pre-encoded request, as ``wrk`` or Triton's ``perf_analyzer`` do,
measures the server and not itself.

The bytes on the wire are the Triton client's: the body comes from
``tritonclient.http.InferenceServerClient.generate_request_body`` (binary tensor data
extension, every output asked in binary), the headers are those it sends (``Content-Length``
and ``Inference-Header-Content-Length``, no content type). An answer counts as a success when its status is
200 and its JSON header, decoded, has the ``outputs`` asked for; anything else (another
status, a closed connection, a timeout, a malformed answer) is an error whose text says what
was received. Only ``127.0.0.1`` is ever connected to (the caller checks the address with
``serve_load.loopback_url``).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Mapping, Sequence
from urllib.parse import quote

import numpy as np

#: the largest answer head (status line and headers) read
_MAX_HEAD = 64 << 10
#: the largest answer body read
_MAX_BODY = 256 << 20


class RawInferClient:
    """One connection to ``host:port`` and one encoded inference request for ``model``.

    Args:
        address: ``127.0.0.1:PORT``.
        model: the model's name on the server.
        feeds: ``{input name: array}``, sent in the binary tensor data extension.
        outputs: the outputs asked for (binary), all of them when empty.
        timeout_s: seconds a connection or an answer may take.
    """

    def __init__(self, address: str, model: str,
                 feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
                 outputs: Sequence[str], timeout_s: float) -> None:
        host, _, port = address.rpartition(":")
        self.address = (host, int(port))
        self.timeout_s = timeout_s
        self.outputs = list(outputs)
        # several requests (mixed shapes): encoded once each, sent in turn
        every = [feeds] if isinstance(feeds, Mapping) else list(feeds)
        self.requests = [self._encode(address, model, f) for f in every]
        self.request = self.requests[0]
        self._turn = 0
        self._sock: socket.socket | None = None
        self._buffer = bytearray(1 << 16)
        self._view = memoryview(self._buffer)

    def _encode(self, address: str, model: str, feeds: Mapping[str, np.ndarray]) -> bytes:
        """One request's bytes, as Triton's client writes them."""
        import tritonclient.http as httpclient
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        for name, array in feeds.items():
            tensor = httpclient.InferInput(name, list(array.shape),
                                           np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(np.ascontiguousarray(array), binary_data=True)
            inputs.append(tensor)
        asked = [httpclient.InferRequestedOutput(n, binary_data=True) for n in self.outputs]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs, outputs=asked or None)
        head = [f"POST /v2/models/{quote(model)}/infer HTTP/1.1", f"Host: {address}",
                f"Content-Length: {len(body)}"]
        if json_size is not None:  # as Triton's client: no content type
            head.append(f"Inference-Header-Content-Length: {json_size}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    def send(self) -> str | None:
        """One request (the next of several, in turn); ``None`` when answered with the
        outputs, else the error's text."""
        self.request = self.requests[self._turn % len(self.requests)]
        self._turn += 1
        try:
            sock = self._connected()
            sock.sendall(self.request)
            status, headers, body = self._answer(sock)
        except (OSError, ValueError) as exc:
            self.close()
            return f"{type(exc).__name__}: {exc}"[:500]
        if headers.get("connection", "").lower() == "close":
            self.close()
        if status != 200:
            return f"HTTP {status}: {bytes(body[:400]).decode(errors='replace')}"
        return self._check(headers, body)

    def close(self) -> None:
        """Close the connection (the next :meth:`send` opens another)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    # -- the answer -------------------------------------------------------------------------
    def _connected(self) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        return self._sock

    def _answer(self, sock: socket.socket) -> tuple[int, dict[str, str], memoryview]:
        """``(status, headers in lower case, body)`` of one answer (the body is a view of
        this client's buffer, valid until the next request)."""
        filled = 0
        while True:
            end = self._buffer.find(b"\r\n\r\n", 0, filled)
            if end >= 0:
                break
            if filled == len(self._buffer):
                if filled >= _MAX_HEAD:
                    raise ValueError(f"an answer head over {_MAX_HEAD} bytes")
                self._grow(2 * filled)
            filled += self._recv(sock, filled)
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP/1.1 answer: {lines[0][:100]!r}")
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return int(parts[1]), headers, self._chunked(sock, start, filled)
        length = headers.get("content-length", "")
        if not length.isdigit() or int(length) > _MAX_BODY:
            raise ValueError(f"an answer without a usable Content-Length (received "
                             f"{length or 'none'}) or chunked transfer-encoding")
        size = int(length)
        filled = self._fill(sock, filled, start + size)
        if filled != start + size:
            raise ValueError(f"{filled - start - size} bytes after the answer: the client sends "
                             f"one request at a time")
        return int(parts[1]), headers, self._view[start:start + size]

    def _chunked(self, sock: socket.socket, start: int, filled: int) -> memoryview:
        """The body of a chunked answer whose chunks start at ``start`` (``filled`` bytes of
        the buffer read), joined in place from ``start``."""
        at = body_end = start
        while True:
            line_end = self._buffer.find(b"\r\n", at, filled)
            while line_end < 0:
                if filled - at > 1024:
                    raise ValueError("a chunk size line over 1 KiB")
                filled = self._fill(sock, filled, filled + 1)
                line_end = self._buffer.find(b"\r\n", at, filled)
            text = bytes(self._buffer[at:line_end]).split(b";")[0].strip()
            try:
                size = int(text, 16)
            except ValueError:
                raise ValueError(f"a chunk size of {text[:40]!r}") from None
            if body_end - start + size > _MAX_BODY:
                raise ValueError(f"a chunked answer over {_MAX_BODY} bytes")
            data = line_end + 2
            filled = self._fill(sock, filled, data + size + 2)
            if size == 0:  # the last chunk (no trailers expected)
                if filled != data + 2:
                    raise ValueError("bytes after the last chunk: the client sends one request "
                                     "at a time")
                return self._view[start:body_end]
            self._buffer[body_end:body_end + size] = self._buffer[data:data + size]
            body_end += size
            at = data + size + 2

    def _fill(self, sock: socket.socket, filled: int, wanted: int) -> int:
        """Read until at least ``wanted`` bytes of the buffer are filled; returns how many."""
        if wanted > len(self._buffer):
            self._grow(wanted)
        while filled < wanted:
            filled += self._recv(sock, filled)
        return filled

    def _recv(self, sock: socket.socket, at: int) -> int:
        received = sock.recv_into(self._view[at:])
        if received == 0:
            raise ConnectionResetError("the server closed the connection")
        return received

    def _grow(self, size: int) -> None:
        grown = bytearray(size)
        grown[:len(self._buffer)] = self._buffer
        self._buffer, self._view = grown, memoryview(grown)

    def _check(self, headers: Mapping[str, str], body: memoryview) -> str | None:
        """``None`` when the answer's JSON names every output asked for, else what is wrong."""
        size = headers.get("inference-header-content-length")
        if size is not None and (not size.isdigit() or int(size) > len(body)):
            return f"an Inference-Header-Content-Length of {size!r} for a body of {len(body)}"
        try:
            answer = json.loads(bytes(body[:int(size)] if size is not None else body))
            names = {o["name"] for o in answer["outputs"]}
        except (ValueError, KeyError, TypeError) as exc:
            return f"a malformed answer ({type(exc).__name__}: {exc}): {bytes(body[:200])!r}"
        missing = [n for n in self.outputs if n not in names]
        return f"the answer lacks output(s) {missing}" if missing else None
