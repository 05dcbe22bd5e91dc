"""The past buffers are allocated once per generation and never copied on the Python side; memory
stays flat over 1,000 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from dispatch.generation.generate import Generator
from dispatch.generation.kv_cache import CapacityError
from tests.generation.decoders import MODELS, PROMPT, WAYS, way_param

BOUND_WAYS = [way_param("onnxruntime-iobinding"), way_param("openvino")]


def _pointers(arrays: list[np.ndarray]) -> list[int]:
    return [a.ctypes.data for a in arrays]


@pytest.mark.parametrize("way", BOUND_WAYS)
def test_past_buffers_are_allocated_once_and_swapped(way):
    gen = Generator(MODELS["llama"], way, max_length=64)
    gen.prefill(PROMPT)
    kv = gen.runner.kv
    tensors = len(gen.io.cache)
    assert kv.allocations == 2 * tensors  # two buffers (ping-pong) per past tensor
    buffers = kv.buffers()
    identities = [id(b) for b in buffers]
    pointers = set(_pointers(buffers))
    logits_pointer = None
    token = 1
    for _ in range(40):
        pasts = kv.pasts()
        # the past is a view of one of the generation's buffers, starting at its front
        assert all(p.base is not None and p.ctypes.data in pointers for p in pasts)
        assert all(p.shape[2] == kv.length for p in pasts)
        logits = gen.step([token])
        token = int(logits[0, -1].argmax())
        # the present just written is the next past: it lies in the other buffer of each pair
        assert [p.ctypes.data for p in kv.pasts()] != _pointers(pasts)
        assert set(_pointers(kv.pasts())) <= pointers
        logits_pointer = logits_pointer or logits.ctypes.data
        assert logits.ctypes.data == logits_pointer
    assert [id(b) for b in kv.buffers()] == identities
    assert kv.allocations == 2 * tensors
    assert gen.runner.logits_allocations == 1
    assert getattr(gen.runner, "copied_steps", 0) == 0  # OpenVINO wrote into the buffers given
    # another generation of the same capacity reuses them; a longer one allocates once more
    gen.generate(PROMPT, 20)
    assert [id(b) for b in kv.buffers()] == identities and kv.allocations == 2 * tensors
    gen.generate(PROMPT, 100)
    assert kv.allocations == 4 * tensors and kv.capacity == len(PROMPT) + 100


def _peak_during_steps(gen: Generator, steps: int) -> int:
    """The most bytes numpy and Python held at once during ``steps`` steps beyond what they
    held before (tracemalloc sees numpy's allocations, not the libraries' own)."""
    token = 1
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(steps):
            token = int(gen.step([token])[0, -1].argmax())
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("way", [w for w in WAYS if w.values[0] != "onnxruntime"])
def test_no_past_sized_array_is_made_per_step(way):
    """No step makes a numpy array the size of a past (tracemalloc sees numpy's allocations; the
    plain ``run`` way is left out: its presents are onnxruntime's memory, which it does not see)."""
    gen = Generator(MODELS["gpt2"], way, max_length=len(PROMPT) + 400)
    token = int(gen.prefill(PROMPT)[0, -1].argmax())
    for _ in range(300):  # a long past: one past tensor is now 4 x 308 x 16 float32 = 79 kB
        token = int(gen.step([token])[0, -1].argmax())
    one_past = gen.io.cache[0].elements(1, gen.length) * 4
    assert _peak_during_steps(gen, 20) < one_past / 2
    # the same measure sees a copy of the pasts on the Python side
    tracemalloc.start()
    try:
        copies = [p.copy() for p in gen.runner.kv.pasts()] if gen.runner.kv is not None else \
            [np.ones(one_past // 4, np.float32)]
        assert tracemalloc.get_traced_memory()[1] >= one_past
    finally:
        tracemalloc.stop()
    del copies


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


ORT_WAYS = [w for w in WAYS if not w.values[0].startswith("openvino")]
OV_WAYS = [w for w in WAYS if w.values[0].startswith("openvino")]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def _flat_over(way: str, steps: int) -> tuple[int, int, int]:
    """``(length, growth of what tracemalloc sees, growth of the resident set)`` over ``steps``
    steps after the first 100."""
    gen = Generator(MODELS["llama"], way, max_length=len(PROMPT) + steps)
    token = int(gen.prefill(PROMPT)[0, -1].argmax())
    for _ in range(100):
        token = int(gen.step([token])[0, -1].argmax())
    tracemalloc.start()
    try:
        traced = tracemalloc.get_traced_memory()[0]
        rss = _rss_bytes()
        for _ in range(steps - 101):
            token = int(gen.step([token])[0, -1].argmax())
        grown = tracemalloc.get_traced_memory()[0] - traced
    finally:
        tracemalloc.stop()
    with pytest.raises(CapacityError, match=f"maximum is {len(PROMPT) + steps}"):
        gen.step([token, token])
    return gen.length, grown, _rss_bytes() - rss


@LINUX
@pytest.mark.parametrize("way", ORT_WAYS)
def test_memory_stays_flat_over_1000_steps(way):
    length, grown, rss = _flat_over(way, 1000)
    assert length == len(PROMPT) + 999
    # what Python and numpy hold does not grow with the steps (the plain way's last presents
    # are ~4 x 64 kB larger than after step 100; the bound ways' buffers were made before)
    assert grown < 512 * 1024
    # nor does the process (generous: the library's own arenas)
    assert rss < 64 * 1024 * 1024


_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from tests.generation import test_generation_buffers as t
print(json.dumps(t._flat_over({way!r}, 1000)))
"""


@LINUX
@pytest.mark.parametrize("way", OV_WAYS)
def test_openvino_memory_stays_flat_over_1000_steps_without_the_onednn_cache(way):
    """OpenVINO's ways in a process of their own with oneDNN's primitive cache off (see
    dispatch.generation.ov_steps: without it the process grows by ~0.25 MB a step)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", _CHILD.format(root=root, way=way)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    length, grown, rss = json.loads(done.stdout.strip().splitlines()[-1])
    assert length == len(PROMPT) + 999
    assert grown < 512 * 1024
    assert rss < 64 * 1024 * 1024
