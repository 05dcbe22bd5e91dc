"""The generate extension of a live ``opdispatch serve`` (:mod:`tuner.serve.generate_route`) on
loopback, serving the committed tiny GPT-2 decoder beside a model that is not a decoder: the
tokens of ``/generate`` and of ``/generate_stream`` (one Server-Sent Event per token) equal
``Session.generate``'s, greedy and seeded sampling, stop tokens, the client's mistakes (400 with
what was received and expected), concurrent streams, a client that leaves mid-stream, and the
metadata and readiness of a decoder. No timing is asserted."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import dispatch
from tests.serve.conftest import UNTUNED, live_server

GPT2 = Path(__file__).resolve().parents[1] / "models" / "decoders" / "gpt2_tiny.onnx"
PROMPT = [5, 17, 42, 9, 200, 3, 77, 31]
OTHER = [1, 2, 3]
NEW = 24
#: the positions one generation holds (tuner.serve.generate_route.CAPACITY)
CAPACITY = 1024


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """An empty store: no generation plan, so the server runs the default step way."""
    return str(tmp_path_factory.mktemp("gen-store") / "plans.sqlite")


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-generate")
    repo = root / "models"
    (repo / "gpt2").mkdir(parents=True)
    shutil.copy(GPT2, repo / "gpt2" / "model.onnx")
    (repo / "untuned").mkdir()
    shutil.copy(UNTUNED, repo / "untuned" / "model.onnx")
    with live_server([str(repo), "--store", store], root) as live:
        yield live


@pytest.fixture(scope="module")
def session(store):
    return dispatch.Session(str(GPT2), store=store)


def _post(server, path: str, body: Any) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer = server.post(path, data)
    return status, json.loads(answer)


def _stream(server, body: dict) -> list[dict]:
    """The events of ``/generate_stream``, read as they come (one ``data:`` line each)."""
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/gpt2/generate_stream",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        for line in answer:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
            else:
                assert line.strip() == b"", line  # events are separated by a blank line
    return events


def _metric(server, name: str, **labels: str) -> float:
    status, text = server.get("/metrics")
    assert status == 200
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.decode().splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1:line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_generate_equals_session_generate_greedy(server, session):
    expected = session.generate(PROMPT, NEW).tolist()
    status, body = _post(server, "/v2/models/gpt2/generate",
                         {"input_ids": PROMPT, "parameters": {"max_tokens": NEW}, "id": "a1"})
    assert status == 200, body
    assert body["output_ids"] == expected
    assert body["finish_reason"] == "length"
    assert body["model_name"] == "gpt2" and body["id"] == "a1"
    assert body["timings"]["tokens"] == NEW and "prompt_ms" in body["timings"]
    # batch 1 as one row, and the default number of new tokens
    status, row = _post(server, "/v2/models/gpt2/generate", {"input_ids": [PROMPT]})
    assert status == 200 and row["output_ids"] == expected[:16]


def test_stream_yields_one_event_per_token_in_order(server, session):
    expected = session.generate(PROMPT, NEW).tolist()
    events = _stream(server, {"input_ids": PROMPT, "parameters": {"max_tokens": NEW}})
    tokens, last = events[:-1], events[-1]
    assert [e["index"] for e in tokens] == list(range(NEW))
    assert [e["token_id"] for e in tokens] == expected
    assert last["finish_reason"] == "length" and last["output_ids"] == expected


def test_seeded_sampling_is_reproducible(server, session):
    params = {"max_tokens": NEW, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 7}
    expected = session.generate(PROMPT, NEW, do_sample=True, temperature=0.8, top_k=40,
                                top_p=0.95, seed=7).tolist()
    first = _post(server, "/v2/models/gpt2/generate", {"input_ids": PROMPT, "parameters": params})
    again = _post(server, "/v2/models/gpt2/generate", {"input_ids": PROMPT, "parameters": params})
    assert first[1]["output_ids"] == again[1]["output_ids"] == expected
    streamed = _stream(server, {"input_ids": PROMPT, "parameters": params})
    assert [e["token_id"] for e in streamed[:-1]] == expected
    other = _post(server, "/v2/models/gpt2/generate",
                  {"input_ids": PROMPT, "parameters": {**params, "seed": 8}})
    assert other[1]["output_ids"] != expected  # 24 draws over 40 tokens: not all the same
    greedy = session.generate(PROMPT, NEW).tolist()
    assert expected != greedy
    zero = _post(server, "/v2/models/gpt2/generate",
                 {"input_ids": PROMPT, "parameters": {"max_tokens": NEW, "temperature": 0}})
    assert zero[1]["output_ids"] == greedy  # temperature 0 is greedy


def test_stop_tokens_end_the_generation(server, session):
    expected = session.generate(PROMPT, NEW).tolist()
    at = next(i for i in range(2, NEW) if expected[i] not in expected[:i])
    unused = next(t for t in range(256) if t not in expected[: at + 1])  # a second stop id
    params = {"max_tokens": NEW, "stop_token_ids": [unused, expected[at]]}
    status, body = _post(server, "/v2/models/gpt2/generate", {"input_ids": PROMPT, "parameters": params})
    assert status == 200
    assert body["output_ids"] == expected[: at + 1] and body["finish_reason"] == "stop"
    events = _stream(server, {"input_ids": PROMPT, "parameters": params})
    assert [e["token_id"] for e in events[:-1]] == expected[: at + 1]
    assert events[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize("body, status, says", [
    ({"text_input": "Hello"}, 400, ["text_input", "tokenizer", "input_ids"]),
    ({"input_ids": [1, 256, -1]}, 400, ["outside the vocabulary 0..255", "-1, 256"]),
    ({"input_ids": PROMPT, "parameters": {"max_tokens": CAPACITY}}, 400,
     [f"max_tokens {CAPACITY}", f"{CAPACITY + len(PROMPT)} positions", f"at most {CAPACITY}",
      f"at most {CAPACITY - len(PROMPT)} new tokens"]),
    ({"input_ids": "hello"}, 400, ["input_ids must be a list of integer token ids", '"hello"']),
    ({"input_ids": [1.5, 2]}, 400, ["input_ids must be a list of integer", "1.5"]),
    ({"input_ids": []}, 400, ["input_ids is empty"]),
    ({"parameters": {"max_tokens": 4}}, 400, ["no input_ids", '"input_ids"']),
    ({"input_ids": PROMPT, "parameters": {"max_tokens": "5"}}, 400,
     ["max_tokens must be an integer >= 1", '"5"']),
    ({"input_ids": PROMPT, "parameters": {"temperature": -1}}, 400, ["temperature", "-1"]),
    ({"input_ids": PROMPT, "parameters": {"top_p": 0}}, 400, ["top_p must be a number in (0, 1]"]),
    ({"input_ids": PROMPT, "parameters": {"stop_token_ids": [999]}}, 400,
     ["stop_token_ids", "999"]),
    ({"input_ids": PROMPT, "parameters": {"max_new_tokens": 5}}, 400,
     ["unknown parameter(s) max_new_tokens", "max_tokens"]),
    ({"input_ids": PROMPT, "prompt": "x"}, 400, ["unknown key(s) prompt", "input_ids"]),
    ([1, 2, 3], 400, ["received a JSON list", "input_ids"]),
    (b"{not json", 400, ["not JSON"]),
])
@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_bad_requests_say_what_was_received_and_expected(server, route, body, status, says):
    code, answer = _post(server, f"/v2/models/gpt2/{route}", body)
    assert code == status, answer
    for text in says:
        assert text in answer["error"], answer


def test_a_model_that_is_not_a_decoder_or_unknown(server):
    code, answer = _post(server, "/v2/models/untuned/generate", {"input_ids": [1]})
    assert code == 400
    assert "does not generate" in answer["error"] and "not a decoder" in answer["error"]
    assert "past_key_values" in answer["error"]  # what a decoder has
    code, answer = _post(server, "/v2/models/nope/generate_stream", {"input_ids": [1]})
    assert code == 404 and "gpt2" in answer["error"]


def test_metadata_and_readiness(server):
    status, raw = server.get("/v2/models/gpt2")
    assert status == 200
    params = json.loads(raw)["parameters"]
    assert params["generate"] is True and params["generate_ready"] is True
    assert params["generate_ways"]["steps"] == params["generate_ways"]["prompt"]
    assert params["generate_plan"].startswith("untuned: the default step way")
    assert params["generate_capacity"] == CAPACITY
    # its /infer route is not ready (symbolic shapes, no plan) but it generates: ready
    assert params["ready"] is False
    assert server.get("/v2/models/gpt2/ready")[0] == 200
    # readiness and metadata of the other model are as before
    status, raw = server.get("/v2/models/untuned")
    assert status == 200 and "generate" not in json.loads(raw)["parameters"]
    assert server.get("/v2/models/untuned/ready")[0] == 503


def test_two_concurrent_streams_both_complete(server, session):
    expected = {tuple(p): session.generate(p, 48).tolist() for p in (PROMPT, OTHER)}
    results: dict[tuple, list[dict]] = {}
    errors: list[BaseException] = []

    def run(prompt: list[int]) -> None:
        try:
            results[tuple(prompt)] = _stream(server, {"input_ids": prompt,
                                                      "parameters": {"max_tokens": 48}})
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (PROMPT, OTHER, PROMPT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 2
    for prompt, events in results.items():
        assert [e["token_id"] for e in events[:-1]] == expected[prompt]
        assert [e["index"] for e in events[:-1]] == list(range(48))
        assert events[-1]["finish_reason"] == "length"


def test_a_client_leaving_mid_stream_stops_its_generation(server, session):
    before = _metric(server, "opdispatch_generations_total", model="gpt2", finish_reason="cancelled")
    tokens_before = _metric(server, "opdispatch_generated_tokens_total", model="gpt2")
    most = CAPACITY - len(PROMPT)
    body = json.dumps({"input_ids": PROMPT, "parameters": {"max_tokens": most}}).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v2/models/gpt2/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while seen.count(b"data: ") < 2:
            chunk = sock.recv(4096)
            assert chunk, seen
            seen += chunk
        assert b" 200 " in seen.split(b"\r\n", 1)[0]
    for _ in range(600):  # bounded: until the server counted the generation as cancelled
        if _metric(server, "opdispatch_generations_total", model="gpt2",
                   finish_reason="cancelled") > before:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the generation of a client that left was not cancelled")
    generated = _metric(server, "opdispatch_generated_tokens_total", model="gpt2") - tokens_before
    print("generated before the cancel:", generated, "of", most)
    assert 2 <= generated < most
    # the pool goes on serving
    status, answer = _post(server, "/v2/models/gpt2/generate",
                           {"input_ids": PROMPT, "parameters": {"max_tokens": 4}})
    assert status == 200 and answer["output_ids"] == session.generate(PROMPT, 4).tolist()


def test_the_stored_generation_plan_is_what_the_pool_runs(tmp_path, session):
    """Without a server: the pool of a decoder whose generation plan is stored builds its
    generators from that plan, says so, and gives the tokens ``Session.generate`` gives."""
    from types import SimpleNamespace

    from tuner.generation.tune_generate import tune_generate
    from tuner.serve.generate_route import generate_tokens, generation_pools, parse_request
    from tuner.serve.repository import ModelSpec, ServeSettings

    store = str(tmp_path / "plans.sqlite")
    tuned = tune_generate(str(GPT2), prompt_len=4, new_tokens=4, budget_s=2.0, store=store)
    assert tuned.plan_id is not None
    runner = SimpleNamespace(spec=ModelSpec("gpt2", GPT2, ServeSettings()), store=store)
    pools, refused = generation_pools([runner], size=1, capacity=64)
    pool = pools["gpt2"]
    try:
        info = pool.describe()
        assert pool.ready and not refused
        assert info["generate_plan"].startswith("stored generation plan"), info
        assert info["generate_ways"]["steps"] == tuned.generation.decode.label()
        request = parse_request(json.dumps({"input_ids": PROMPT, "parameters": {"max_tokens": 8}})
                                .encode(), pool.io.vocab, pool.capacity)
        tokens: list[int] = []
        reason, timings = generate_tokens(pool._lease(), request, tokens.append, threading.Event())
        assert reason == "length" and timings["tokens"] == 8
        assert tokens == session.generate(PROMPT, 8).tolist()
    finally:
        pool.close()
