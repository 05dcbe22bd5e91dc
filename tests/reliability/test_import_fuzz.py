"""Fuzzing the ONNX importer: hostile models always get a clean error, never a crash or a hang.

Every generated model is sent to a worker process (``fuzz_worker.py``) that creates a
Session from it (and runs it once when its tensors are small). The worker answers ``ok``
(loaded) or ``clean`` (an ``OpDispatchError`` subclass); anything else fails the test: another
exception type (``bad``), a crash (the worker dies: negative exit status, e.g. -11 for
SIGSEGV) or a hang (no answer within :data:`PER_INPUT_TIMEOUT_S`). The controls at the end
prove that a crash and a hang in the worker would be detected.

Categories: random bytes, truncated real models, byte-mutated real models, protobuf-level
mutations of real models (dropped initializers and nodes, cycles, undefined inputs, wrong
attribute types, huge / negative / zero dimensions, opsets out of range, unknown domains,
duplicate names) and randomly assembled graphs (random operators, attributes of random
types, random shapes and references).

Bounded in CI: ``DEFAULT_EXAMPLES`` inputs in all (derandomized: the same inputs every run).
On demand: ``OPDISPATCH_FUZZ_EXAMPLES=5000 python -m pytest tests/reliability/test_import_fuzz.py``
spreads that many over the categories, with fresh random inputs. The counts per category
are printed at the end of the module (and written as JSON to ``$OPDISPATCH_FUZZ_REPORT``
when set).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.builders import ModelBuilder, small_cnn

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fuzz_worker.py")
#: a worker answer slower than this is a hang
PER_INPUT_TIMEOUT_S = 60.0
#: inputs tried in all by default (CI); ``OPDISPATCH_FUZZ_EXAMPLES`` overrides
DEFAULT_EXAMPLES = 280
ON_DEMAND = "OPDISPATCH_FUZZ_EXAMPLES" in os.environ
TOTAL_EXAMPLES = int(os.environ.get("OPDISPATCH_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
#: share of the inputs each category gets
WEIGHTS = {"random_bytes": 0.10, "truncated": 0.10, "byte_mutated": 0.18,
           "proto_mutated": 0.22, "random_graph": 0.16, "plausible_graph": 0.24}


def examples(category: str) -> int:
    """How many inputs ``category`` gets."""
    return max(5, round(TOTAL_EXAMPLES * WEIGHTS[category]))


def fuzz_settings(category: str) -> settings:
    return settings(
        max_examples=examples(category), deadline=None, derandomize=not ON_DEMAND,
        database=None, suppress_health_check=list(HealthCheck), print_blob=True,
    )


# -- the worker process ------------------------------------------------------------------


class WorkerFailure(AssertionError):
    """The worker crashed or hung on an input (saved to :attr:`saved`)."""

    def __init__(self, message: str, saved: Path) -> None:
        super().__init__(f"{message}; the input is saved in {saved}")
        self.saved = saved


class FuzzWorker:
    """A worker subprocess fed one model at a time; restarted after a crash or a hang."""

    def __init__(self, env: dict[str, str] | None = None, timeout_s: float = PER_INPUT_TIMEOUT_S):
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.counts: dict[str, Counter[str]] = {}
        #: the first message of each error type, per category (for the report)
        self.samples: dict[str, dict[str, str]] = {}
        self.crash_dir = Path(tempfile.mkdtemp(prefix="opdispatch-fuzz-"))

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, cwd=str(REPO), env=self.env,
        )
        self.proc = proc
        line = self._readline(proc, 120.0)
        if line is None or not line.startswith(b'{"ready"'):
            self._stop()
            raise RuntimeError(f"the fuzz worker did not start: {line!r}; {self._stderr_tail()}")
        return proc

    def _readline(self, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        return proc.stdout.readline() if ready else None

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-1500:].decode(errors="replace")

    def _stop(self) -> None:
        """Kill the worker (if alive), reap it and close its pipes."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(BrokenPipeError):
                        pipe.close()
            self.proc = None

    def _save(self, payload: bytes, category: str) -> Path:
        n = len(list(self.crash_dir.iterdir()))
        path = self.crash_dir / f"{category}-{n}.onnx"
        path.write_bytes(payload)
        return path

    def check(self, payload: bytes, category: str) -> dict[str, Any]:
        """Send ``payload``; return the answer, or raise :class:`WorkerFailure` on a crash or
        a hang."""
        count = self.counts.setdefault(category, Counter())
        count["tried"] += 1
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert proc.stdin is not None
        try:
            proc.stdin.write(struct.pack(">I", len(payload)) + payload)
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._readline(proc, self.timeout_s)
        if line is None:
            self._stop()
            count["hang"] += 1
            raise WorkerFailure(f"the worker gave no answer within {self.timeout_s} s (a hang)",
                                self._save(payload, category))
        if not line:
            code = proc.wait()
            self._stop()
            count["crash"] += 1
            raise WorkerFailure(f"the worker died with exit status {code} (a crash); "
                                f"stderr: {self._stderr_tail()}", self._save(payload, category))
        answer = json.loads(line)
        count[answer["outcome"]] += 1
        if answer["outcome"] == "clean":
            kind = answer["error"].split(":", 1)[0]
            count["error " + kind] += 1
            self.samples.setdefault(category, {}).setdefault(kind, answer["error"])
        count["ran"] += bool(answer.get("ran"))
        return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self._stop()
        self.stderr.close()


SUMMARY: dict[str, Counter[str]] = {}


@pytest.fixture(scope="module")
def worker(request) -> Iterator[FuzzWorker]:
    w = FuzzWorker()
    started = time.perf_counter()
    yield w
    w.close()
    elapsed = time.perf_counter() - started
    SUMMARY.update(w.counts)
    total = sum(c["tried"] for c in w.counts.values())
    lines = [f"import fuzzing: {total} inputs in {elapsed:.1f} s "
             f"({'on demand' if ON_DEMAND else 'CI, derandomized'})"]
    for cat, c in w.counts.items():
        lines.append(f"  {cat:14s} tried {c['tried']:5d}  loaded {c['ok']:5d} (ran {c['ran']:4d})  "
                     f"clean errors {c['clean']:5d}  bad {c['bad']}  crashes {c['crash']}  "
                     f"hangs {c['hang']}")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + "\n".join(lines))
    out = os.environ.get("OPDISPATCH_FUZZ_REPORT")
    if out:
        Path(out).write_text(json.dumps(
            {"total": total, "seconds": round(elapsed, 1), "on_demand": ON_DEMAND,
             "categories": {k: dict(v) for k, v in w.counts.items()},
             "first_message_of_each_error": w.samples}, indent=2))


def assert_clean(worker: FuzzWorker, model: bytes | onnx.ModelProto, category: str) -> None:
    payload = model if isinstance(model, bytes) else model.SerializeToString()
    answer = worker.check(payload, category)
    assert answer["outcome"] in ("ok", "clean"), (
        f"a {category} model raised an exception that is no OpDispatchError: {answer['error']}")


# -- the corpus of real models -----------------------------------------------------------


def _gemm_model() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    b = ModelBuilder(name="gemm")
    x = b.input("x", [2, 8])
    g = b.op("Gemm", [x, b.const(rng.standard_normal((4, 8)).astype(np.float32)),
                      b.const(np.zeros(4, np.float32))], transB=1)
    b.output(b.op("Softmax", [b.op("Relu", [g])], axis=1))
    return b.build()


def _pool_model() -> onnx.ModelProto:
    b = ModelBuilder(name="pool")
    x = b.input("x", [1, 3, 8, 8])
    m = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    a = b.op("AveragePool", [m], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    b.output(b.op("Flatten", [b.op("GlobalAveragePool", [a])]))
    return b.build()


def _shape_model() -> onnx.ModelProto:
    b = ModelBuilder(name="shapes")
    x = b.input("x", [2, 3, 4])
    r = b.op("Reshape", [x, b.const(np.array([6, 4], np.int64))])
    t = b.op("Transpose", [r], perm=[1, 0])
    c = b.op("ConstantOfShape", [b.op("Shape", [t])],
             value=numpy_helper.from_array(np.array([0.5], np.float32)))
    s = b.op("Add", [t, c])
    b.output(b.op("Concat", [s, b.op("Sigmoid", [s])], axis=0))
    return b.build()


def _light(name: str) -> bytes:
    from dispatch.zoo import light_model_path

    return light_model_path(name).read_bytes()


CORPUS: dict[str, Callable[[], bytes]] = {
    "small_cnn": lambda: small_cnn().SerializeToString(),
    "gemm": lambda: _gemm_model().SerializeToString(),
    "pool": lambda: _pool_model().SerializeToString(),
    "shapes": lambda: _shape_model().SerializeToString(),
    # onnx's own test model (real exporter output; weights made by ConstantOfShape)
    "light_squeezenet": lambda: _light("squeezenet"),
}
_CACHE: dict[str, bytes] = {}


def corpus(name: str) -> bytes:
    if name not in _CACHE:
        _CACHE[name] = CORPUS[name]()
    return _CACHE[name]


#: the small models most of the time, the real exporter model now and then
corpus_names = st.sampled_from(["small_cnn", "gemm", "pool", "shapes"] * 3 + ["light_squeezenet"])


def test_the_corpus_loads_and_runs(worker):
    """The unmutated models are valid: the mutations below start from working models."""
    for name in CORPUS:
        answer = worker.check(corpus(name), "corpus")
        assert answer["outcome"] == "ok", (name, answer)


# -- categories ------------------------------------------------------------------------


@fuzz_settings("random_bytes")
@given(data=st.one_of(
    st.binary(max_size=512),
    # protobuf-looking bytes: field tags of ModelProto (ir_version 1, graph 7, opset 8)
    st.lists(st.sampled_from([b"\x08", b"\x3a", b"\x42", b"\x0a", b"\x12", b"\x1a", b"\x22",
                              b"\x07", b"\xff\xff\xff\xff\x0f", b"\x00", b"\x80"]),
             max_size=64).map(b"".join),
))
def test_random_bytes(worker, data):
    assert_clean(worker, data, "random_bytes")


@fuzz_settings("truncated")
@given(name=corpus_names, cut=st.floats(0.0, 1.0, exclude_max=True))
def test_truncated_models(worker, name, cut):
    data = corpus(name)
    assert_clean(worker, data[: int(len(data) * cut)], "truncated")


@fuzz_settings("byte_mutated")
@given(name=corpus_names,
       edits=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 255),
                                st.sampled_from(["set", "insert", "delete", "xor"])),
                      min_size=1, max_size=8))
def test_byte_mutated_models(worker, name, edits):
    data = bytearray(corpus(name))
    for where, value, how in edits:
        if not data:
            break
        k = int(len(data) * where) % len(data)
        if how == "set":
            data[k] = value
        elif how == "insert":
            data.insert(k, value)
        elif how == "delete":
            del data[k]
        else:
            data[k] ^= 1 << (value % 8)
    assert_clean(worker, bytes(data), "byte_mutated")


HUGE = [2**31, 2**40, 2**62, 2**63 - 1]
#: dimensions a mutation writes: zero, negative, huge, ordinary
dims = st.one_of(st.sampled_from([0, -1, -7, *HUGE]), st.integers(1, 9))
#: attribute values of every type (ONNX checks types against the schema; values it does not)
attr_values = st.one_of(
    st.integers(-3, 9), st.sampled_from([*HUGE, -(2**63)]), st.floats(allow_nan=True),
    st.text(max_size=8), st.lists(st.integers(-3, 9), max_size=6),
    st.lists(st.floats(-4, 4), min_size=1, max_size=4), st.lists(st.text(max_size=3), min_size=1, max_size=3),
    st.sampled_from(HUGE).map(lambda v: [v, v, v, v]),
    st.integers(-3, 3).map(lambda v: numpy_helper.from_array(np.array(v, np.int64))),
)
ATTR_NAMES = ["strides", "pads", "dilations", "kernel_shape", "group", "axis", "perm", "to",
              "auto_pad", "transA", "transB", "alpha", "value", "epsilon", "ceil_mode", "mode"]
ELEM_TYPES = [0, 1, 1, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 16, 17, 21, 999]


def _mutate(proto: onnx.ModelProto, how: str, draw: Callable[[Any], Any]) -> None:
    g = proto.graph
    names = [i.name for i in g.input] + [i.name for i in g.initializer] + [
        o for n in g.node for o in n.output]
    if how == "drop_initializer" and g.initializer:
        del g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
    elif how == "drop_node" and g.node:
        del g.node[draw(st.integers(0, len(g.node) - 1))]
    elif how == "rewire" and g.node:
        node = g.node[draw(st.integers(0, len(g.node) - 1))]
        if node.input:
            k = draw(st.integers(0, len(node.input) - 1))
            # another value (maybe produced later: a cycle), its own output, or nothing at all
            node.input[k] = draw(st.sampled_from([*names, node.output[0], "undefined_value", ""]))
    elif how == "input_dim" and g.input:
        vi = g.input[draw(st.integers(0, len(g.input) - 1))]
        shape = vi.type.tensor_type.shape
        if shape.dim:
            d = shape.dim[draw(st.integers(0, len(shape.dim) - 1))]
            if draw(st.booleans()):
                d.dim_value = draw(dims.filter(lambda v: v >= 0 and v < 2**63))
            else:
                d.dim_param = draw(st.sampled_from(["N", "", "batch"]))
    elif how == "input_rank" and g.input:
        vi = g.input[draw(st.integers(0, len(g.input) - 1))]
        shape = vi.type.tensor_type.shape
        if draw(st.booleans()) and shape.dim:
            del shape.dim[-1]
        else:
            shape.dim.add().dim_value = draw(st.integers(0, 4))
    elif how == "elem_type" and g.input:
        g.input[draw(st.integers(0, len(g.input) - 1))].type.tensor_type.elem_type = draw(
            st.sampled_from(ELEM_TYPES))
    elif how == "attribute" and g.node:
        node = g.node[draw(st.integers(0, len(g.node) - 1))]
        name = draw(st.sampled_from(ATTR_NAMES + [a.name for a in node.attribute]))
        for k, a in enumerate(node.attribute):
            if a.name == name:
                del node.attribute[k]
                break
        with contextlib.suppress(ValueError, TypeError):
            node.attribute.append(helper.make_attribute(name, draw(attr_values)))
    elif how == "huge_initializer":
        t = TensorProto(name=draw(st.sampled_from([*names, "extra"])), data_type=TensorProto.FLOAT)
        t.dims.extend(draw(st.lists(dims, min_size=1, max_size=4)))
        t.raw_data = b"\0" * draw(st.sampled_from([0, 4, 16, 64]))
        g.initializer.append(t)
    elif how == "int_initializer" and g.initializer:
        # the shape-like constants (Reshape targets, ConstantOfShape sizes) get hostile values
        k = draw(st.integers(0, len(g.initializer) - 1))
        old = g.initializer[k]
        arr = np.array(draw(st.lists(dims, min_size=1, max_size=4)), np.int64)
        g.initializer[k].CopyFrom(numpy_helper.from_array(arr, old.name))
    elif how == "opset":
        proto.opset_import[0].version = draw(st.sampled_from([-1, 0, 1, 6, 7, 9, 13, 21, 28, 29, 10**6]))
    elif how == "domain" and g.node:
        g.node[draw(st.integers(0, len(g.node) - 1))].domain = draw(
            st.sampled_from(["com.evil", "ai.onnx.ml", "ai.onnx", "", "\x00"]))
        if draw(st.booleans()):
            proto.opset_import.append(helper.make_opsetid("com.evil", draw(st.integers(-1, 3))))
    elif how == "op_type" and g.node:
        g.node[draw(st.integers(0, len(g.node) - 1))].op_type = draw(st.sampled_from(
            ["Frobnicate", "Conv", "Gemm", "Relu", "Loop", "If", "Scan", "Range", "", "relu"]))
    elif how == "duplicate" and g.node:
        g.node.append(g.node[draw(st.integers(0, len(g.node) - 1))])
    elif how == "reverse":
        nodes = list(g.node)[::-1]
        del g.node[:]
        g.node.extend(nodes)
    elif how == "outputs":
        choice = draw(st.sampled_from(["clear", "input", "undefined", "dup"]))
        if choice == "clear":
            del g.output[:]
        elif choice == "dup" and g.output:
            g.output.append(g.output[0])
        else:
            g.output.append(helper.make_tensor_value_info(
                g.input[0].name if choice == "input" and g.input else "undefined_output",
                TensorProto.FLOAT, None))
    elif how == "output_type" and g.output:
        tt = g.output[0].type.tensor_type
        tt.elem_type = draw(st.sampled_from(ELEM_TYPES))
        tt.shape.dim.add().dim_value = draw(st.integers(0, 9))
    elif how == "ir_version":
        proto.ir_version = draw(st.sampled_from([0, 1, 3, 7, 99]))
    elif how == "function":
        proto.functions.add().name = "f"


MUTATIONS = ["drop_initializer", "drop_node", "rewire", "input_dim", "input_rank", "elem_type",
             "attribute", "huge_initializer", "int_initializer", "opset", "domain", "op_type",
             "duplicate", "reverse", "outputs", "output_type", "ir_version", "function"]


@fuzz_settings("proto_mutated")
@given(name=corpus_names, data=st.data())
def test_proto_mutated_models(worker, name, data):
    proto = onnx.load_from_string(corpus(name))
    for how in data.draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        _mutate(proto, how, data.draw)
    assert_clean(worker, proto, "proto_mutated")


#: operators the random graphs use: implemented ones, shape generators, and unknown ones
OPS = ["Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "MaxPool", "AveragePool",
       "GlobalAveragePool", "Softmax", "Reshape", "ConstantOfShape", "Expand", "Tile", "Concat",
       "Transpose", "Flatten", "Range", "Pad", "Slice", "Cast", "BatchNormalization", "Shape",
       "Unsqueeze", "Squeeze", "Clip", "Identity", "Dropout", "Frobnicate"]


def _schema(op: str) -> tuple[int, int, list[str]]:
    """(min inputs, max inputs, attribute names) of ``op`` at opset 17 (unknown: any)."""
    try:
        schema = onnx.defs.get_schema(op, 17)
    except onnx.defs.SchemaError:
        return 0, 4, []
    return schema.min_input, min(schema.max_input, 5), sorted(schema.attributes)


@st.composite
def random_graphs(draw) -> onnx.ModelProto:
    """A graph assembled at random: 1-2 inputs, 0-3 initializers, 1-5 nodes reading any value
    (or none, or a later one), attributes of random types, 1-2 outputs."""
    values: list[str] = []
    inputs = []
    odd_dims = st.sampled_from([0, "N", *HUGE[:2]])
    for k in range(draw(st.integers(1, 2))):
        rank = draw(st.sampled_from([4, 4, 4, 2, 2, 3, 1, 0, 5]))
        shape = [draw(st.integers(1, 6)) if draw(st.integers(0, 9)) else draw(odd_dims)
                 for _ in range(rank)]
        elem = draw(st.sampled_from([1] * 12 + [7, 6, 10, 11, 9, 8]))
        inputs.append(helper.make_tensor_value_info(f"in{k}", elem, shape))
        values.append(f"in{k}")
    inits = []
    for k in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            arr = np.array(draw(st.lists(dims, min_size=1, max_size=4)), np.int64)
        else:
            shape = draw(st.lists(st.integers(0, 4), max_size=4))
            arr = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
        inits.append(numpy_helper.from_array(arr, f"c{k}"))
        values.append(f"c{k}")
    nodes = []
    n_nodes = draw(st.integers(1, 5))
    for k in range(n_nodes):
        op = draw(st.sampled_from(OPS))
        later = [f"v{j}" for j in range(k, n_nodes)]  # k: its own output (a self-loop)
        odd = st.sampled_from([*later, "", "nowhere"])
        # mostly the latest value and earlier ones; now and then a later, empty or undefined one
        more = st.sampled_from(values) if draw(st.integers(0, 5)) else odd
        lo, hi, known_attrs = _schema(op)
        # the schema's arity mostly (ONNX's checker refuses the rest, which is tested too)
        n_in = draw(st.integers(lo, min(hi, lo + 2))) if draw(st.integers(0, 7)) else draw(
            st.integers(0, 4))
        ins = [values[-1],
               *draw(st.lists(more, min_size=max(0, n_in - 1), max_size=max(0, n_in - 1)))][:max(n_in, 1)]
        attrs = {}
        if draw(st.booleans()):
            pool = known_attrs if known_attrs and draw(st.integers(0, 4)) else ATTR_NAMES
            for name in draw(st.lists(st.sampled_from(pool), max_size=2, unique=True)):
                attrs[name] = draw(attr_values)
        out = f"v{k}" if draw(st.integers(0, 9)) else draw(st.sampled_from(values))
        try:
            node = helper.make_node(op, ins, [out], name=f"n{k}",
                                    domain=draw(st.sampled_from([""] * 9 + ["com.evil"])),
                                    **attrs)
        except (ValueError, TypeError):
            node = helper.make_node(op, ins, [out], name=f"n{k}")
        nodes.append(node)
        values.append(out)
    names = [values[-1]] if draw(st.integers(0, 3)) else draw(
        st.lists(st.sampled_from(values), min_size=1, max_size=2))
    outs = [helper.make_tensor_value_info(name, draw(st.sampled_from([1] * 5 + [0, 7])), None)
            for name in names]
    graph = helper.make_graph(nodes, "fuzz", inputs, outs, inits)
    opsets = [helper.make_opsetid("", draw(st.sampled_from([17] * 20 + [7, 11, 13, 21, 1, 99])))]
    if draw(st.booleans()):
        opsets.append(helper.make_opsetid("com.evil", 1))
    return helper.make_model(graph, opset_imports=opsets)


@fuzz_settings("random_graph")
@given(model=random_graphs())
def test_random_graphs(worker, model):
    assert_clean(worker, model, "random_graph")


small = st.integers(-1, 4)


@st.composite
def plausible_graphs(draw) -> onnx.ModelProto:
    """A chain of well-typed layers on an NCHW float input whose attribute and weight
    *values* are random (kernels larger than the input, zero or negative strides and pads,
    channel counts that do not match, axes out of range): these reach onnx's inference, the
    passes, the planner and the kernels, where ``random_graphs`` mostly stops at the checker."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = ModelBuilder(name="plausible")
    n, c, h, w = (draw(st.integers(0, 3)) if draw(st.integers(0, 7)) == 0 else 1,
                  draw(st.integers(1, 9)), draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    x = b.input("x", [n, c, h, w])
    rank = 4
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["conv", "relu", "pool", "add", "gemm", "softmax",
                                     "reshape", "concat", "transpose", "bn", "clip"]))
        if kind == "conv" and rank == 4:
            m, g = draw(st.integers(1, 8)), draw(st.sampled_from([1, 1, 1, 2, c]))
            cin = c // g if g and c % g == 0 and draw(st.integers(0, 5)) else draw(st.integers(1, 4))
            k = draw(st.integers(1, 5))
            wt = rng.standard_normal((m * max(g, 1), cin, k, k)).astype(np.float32)
            attrs: dict[str, Any] = {"group": g}
            if draw(st.booleans()):
                attrs["pads"] = [draw(small)] * 4
            if draw(st.booleans()):
                attrs["strides"] = [draw(small)] * 2
            if draw(st.booleans()):
                attrs["dilations"] = [draw(small)] * 2
            if draw(st.integers(0, 5)) == 0:
                attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID", "X"]))
            ins = [x, b.const(wt)]
            if draw(st.booleans()):
                ins.append(b.const(rng.standard_normal(draw(st.sampled_from([m * max(g, 1), 3]))
                                                        ).astype(np.float32)))
            x, c = b.op("Conv", ins, **attrs), m * max(g, 1)
        elif kind == "pool" and rank == 4:
            op = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
            attrs = {}
            if not op.startswith("Global"):
                attrs["kernel_shape"] = [draw(st.integers(0, 5))] * 2
                if draw(st.booleans()):
                    attrs["strides"] = [draw(small)] * 2
                if draw(st.booleans()):
                    attrs["pads"] = [draw(small)] * 4
                if draw(st.booleans()):
                    attrs["ceil_mode"] = 1
            x = b.op(op, [x], **attrs)
        elif kind == "relu":
            x = b.op(draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Abs"])), [x])
        elif kind == "clip":
            lo, hi = sorted(draw(st.lists(st.floats(-5, 5), min_size=2, max_size=2)))
            x = b.op("Clip", [x, b.const(np.array(lo, np.float32)), b.const(np.array(hi, np.float32))])
        elif kind == "add":
            shape = draw(st.sampled_from([[1], [c, 1, 1], [1, c, 1, 1], [draw(st.integers(1, 5))],
                                          [2, 3, 4, 5, 6]]))
            x = b.op(draw(st.sampled_from(["Add", "Mul", "Sub", "Div"])),
                     [x, b.const(rng.standard_normal(shape).astype(np.float32))])
        elif kind == "bn" and rank == 4:
            ch = c if draw(st.integers(0, 4)) else draw(st.integers(1, 9))
            params = [rng.uniform(0.5, 1.5, ch), rng.standard_normal(ch), rng.standard_normal(ch),
                      rng.uniform(-0.5, 1.5, ch)]
            x = b.op("BatchNormalization", [x, *(b.const(p.astype(np.float32)) for p in params)])
        elif kind == "gemm":
            if rank != 2:
                x, rank = b.op("Flatten", [x], axis=draw(st.integers(-1, 4))), 2
            k = draw(st.integers(1, 64))
            x = b.op("Gemm", [x, b.const(rng.standard_normal((draw(st.integers(1, 6)), k)
                                                          ).astype(np.float32))], transB=1)
        elif kind == "softmax":
            x = b.op(draw(st.sampled_from(["Softmax", "LogSoftmax"])), [x],
                     axis=draw(st.integers(-5, 5)))
        elif kind == "reshape":
            target = draw(st.lists(st.integers(-1, 8), min_size=1, max_size=4))
            x = b.op("Reshape", [x, b.const(np.array(target, np.int64))])
            rank = len(target)
        elif kind == "concat":
            x = b.op("Concat", [x, x], axis=draw(st.integers(-5, 5)))
        elif kind == "transpose":
            perm = draw(st.permutations(list(range(rank)))) if draw(st.integers(0, 4)) else [0, 0]
            x = b.op("Transpose", [x], perm=list(perm))
    b.output(x)
    return b.build()


@fuzz_settings("plausible_graph")
@given(model=plausible_graphs())
def test_plausible_graphs(worker, model):
    assert_clean(worker, model, "plausible_graph")


# -- controls: a crash and a hang in the worker are detected -------------------------------


def test_control_a_crash_in_the_worker_is_detected():
    w = FuzzWorker(env={"OPDISPATCH_FUZZ_CONTROL": "segv"})
    try:
        with pytest.raises(WorkerFailure, match=r"died with exit status -11 \(a crash\)") as info:
            w.check(corpus("gemm"), "control")
        assert info.value.saved.read_bytes() == corpus("gemm")
        assert w.counts["control"]["crash"] == 1
    finally:
        w.close()


def test_control_a_hang_in_the_worker_is_detected():
    w = FuzzWorker(env={"OPDISPATCH_FUZZ_CONTROL": "hang"}, timeout_s=2.0)
    try:
        with pytest.raises(WorkerFailure, match=r"no answer within 2.0 s \(a hang\)"):
            w.check(corpus("gemm"), "control")
        assert w.proc is None  # killed
    finally:
        w.close()


def test_control_an_escaping_exception_is_reported_as_bad(tmp_path):
    """The worker's classification: a non-OpDispatchError is ``bad`` (and fails the fuzz)."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        import fuzz_worker
    finally:
        sys.path.remove(str(WORKER.parent))

    class Boom:
        pass

    answer = fuzz_worker.handle(Boom(), None)  # type: ignore[arg-type]
    assert answer["outcome"] == "clean"  # Session refuses a non-model with ModelLoadError
    from unittest import mock

    with mock.patch("dispatch.session.Session.__init__", side_effect=KeyError("oops")):
        answer = fuzz_worker.handle(corpus("gemm"), None)
    assert answer["outcome"] == "bad" and answer["error"].startswith("KeyError: 'oops'")
