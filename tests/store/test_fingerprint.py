"""Plan-key fingerprints: what changes a model fingerprint and what must not; hardware and
software fingerprints; human-readable key differences."""

from __future__ import annotations

import json
import stat

import numpy as np
import onnx
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.graph import Graph
from dispatch.onnx_import import import_model
from dispatch.plan import PLAN_FORMAT_VERSION
from tests.builders import ModelBuilder, small_cnn
from tuner import fingerprint as fpmod
from tuner.fingerprint import (
    PlanKey,
    hardware_digest,
    hardware_fingerprint,
    input_signature,
    model_fingerprint,
    parse_cpuinfo,
    software_digest,
    software_fingerprint,
)

# ------------------------------------------------------------------------------------------
# model fingerprint
# ------------------------------------------------------------------------------------------


def _renamed(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every tensor and node renamed."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    names: dict[str, str] = {}

    def new(name: str) -> str:
        if not name:
            return name
        return names.setdefault(name, f"renamed_{len(names)}_{name[::-1]}")

    for vi in list(g.input) + list(g.output) + list(g.value_info):
        vi.name = new(vi.name)
    for init in g.initializer:
        init.name = new(init.name)
    for k, node in enumerate(g.node):
        node.name = f"node_{k}_{node.name}x"
        node.input[:] = [new(n) for n in node.input]
        node.output[:] = [new(n) for n in node.output]
    return out


def _session_graph(proto: onnx.ModelProto) -> Graph:
    return Session(proto, backends=["numpy"], store=False).graph


def _activation(op: str = "LeakyRelu", dtype=np.float32, shape=(2, 8), **attrs) -> onnx.ModelProto:
    b = ModelBuilder()
    x = b.input("x", list(shape), dtype)
    r = b.op(op, [x], **attrs)
    b.output(b.op("Relu", [r]), dtype)
    return b.build()


def test_renaming_tensors_and_nodes_keeps_the_fingerprint():
    proto = small_cnn()
    a, b = _session_graph(proto), _session_graph(_renamed(proto))
    assert {v.name for v in a.values.values()}.isdisjoint(v.name for v in b.values.values())
    assert model_fingerprint(a) == model_fingerprint(b)


def test_new_weight_values_keep_the_fingerprint():
    a, b = _session_graph(small_cnn(seed=0)), _session_graph(small_cnn(seed=1))
    assert model_fingerprint(a) == model_fingerprint(b)
    ia, ib = import_model(small_cnn(seed=0)), import_model(small_cnn(seed=1))
    assert model_fingerprint(ia) == model_fingerprint(ib)


def test_fingerprint_is_stable_and_a_sha256():
    fp = model_fingerprint(_session_graph(small_cnn()))
    assert fp == model_fingerprint(_session_graph(small_cnn()))
    assert len(fp) == 64 and int(fp, 16) >= 0


def test_an_attribute_change_changes_the_fingerprint():
    a = import_model(_activation(alpha=0.1))
    b = import_model(_activation(alpha=0.2))
    assert a.nodes[0].outputs[0].shape == b.nodes[0].outputs[0].shape
    assert model_fingerprint(a) != model_fingerprint(b)


@pytest.mark.parametrize("change", [
    {"shape": (3, 8)},
    {"dtype": np.float64},
    {"op": "Sigmoid"},
])
def test_a_shape_dtype_or_op_change_changes_the_fingerprint(change):
    base = import_model(_activation("Tanh"))
    other = import_model(_activation(**{"op": "Tanh", **change}))
    assert model_fingerprint(base) != model_fingerprint(other)


def test_the_wiring_counts_by_position():
    def model(swap: bool):
        b = ModelBuilder()
        x = b.input("x", [2, 4])
        r = b.op("Relu", [x])
        b.output(b.op("Sub", [r, x] if swap else [x, r]))
        return b.build()

    assert model_fingerprint(import_model(model(False))) != model_fingerprint(import_model(model(True)))


def test_small_int64_constants_are_structure_and_float_weights_are_not():
    def model(indices, bias):
        b = ModelBuilder()
        x = b.input("x", [4, 3])
        g = b.op("Gather", [x, b.const(np.array(indices, np.int64))], axis=0)
        b.output(b.op("Add", [g, b.const(np.array(bias, np.float32))]))
        return b.build()

    base = model_fingerprint(import_model(model([0, 1], [1.0, 2.0, 3.0])))
    assert base == model_fingerprint(import_model(model([0, 1], [7.0, 8.0, 9.0])))
    assert base != model_fingerprint(import_model(model([1, 2], [1.0, 2.0, 3.0])))


def test_tensor_attributes_count_by_value():
    a = import_model(_activation())
    b = import_model(_activation())
    a.nodes[0].attrs["value"] = np.array([1.0], np.float32)
    b.nodes[0].attrs["value"] = np.array([2.0], np.float32)
    assert model_fingerprint(a) != model_fingerprint(b)
    b.nodes[0].attrs["value"] = np.array([1.0], np.float32)
    assert model_fingerprint(a) == model_fingerprint(b)


def test_input_signature_names_dtypes_and_shapes():
    g = import_model(_activation(shape=(2, 8)))
    assert input_signature(g) == "x:float32[2,8]"
    renamed = import_model(_renamed(_activation(shape=(2, 8))))
    assert input_signature(renamed) != input_signature(g)
    assert model_fingerprint(renamed) == model_fingerprint(g)


# ------------------------------------------------------------------------------------------
# hardware
# ------------------------------------------------------------------------------------------

X86_CPUINFO = """\
processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni amx_tile mmx

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni amx_tile mmx

processor\t: 2
model name\t: Intel(R) Xeon(R) Platinum 8488C
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512_vnni amx_tile mmx
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp sve i8mm bf16
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
"""


def test_parse_cpuinfo_x86():
    info = parse_cpuinfo(X86_CPUINFO)
    assert info.model == "Intel(R) Xeon(R) Platinum 8488C"
    assert {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile"} <= set(info.isa)
    assert "fpu" not in info.isa and "mmx" not in info.isa
    assert info.physical_cores == 2


def test_parse_cpuinfo_arm():
    info = parse_cpuinfo(ARM_CPUINFO)
    assert info.model == "implementer 0x41 part 0xd40 variant 0x1"
    assert {"asimd", "asimddp", "sve", "i8mm", "bf16"} <= set(info.isa)
    assert "aes" not in info.isa
    assert info.physical_cores is None


def test_hardware_fingerprint_is_json_stable_and_counts_threads():
    hw = hardware_fingerprint()
    assert {"arch", "cpu_model", "isa", "physical_cores", "logical_cores", "threads", "gpus"} <= set(hw)
    assert hw["cpu_model"] and hw["threads"] >= 1
    assert json.loads(json.dumps(hw)) == hw
    assert hardware_digest(hw) == hardware_digest(hardware_fingerprint())
    assert hardware_digest(dict(reversed(list(hw.items())))) == hardware_digest(hw)
    assert hardware_fingerprint(threads=3)["threads"] == 3
    assert (hardware_digest(hardware_fingerprint(threads=3))
            != hardware_digest(hardware_fingerprint(threads=4)))


def test_hardware_thread_count_follows_the_configuration(monkeypatch):
    monkeypatch.setenv("OPDISPATCH_THREADS", "5")
    assert hardware_fingerprint()["threads"] == 5
    monkeypatch.setenv("OPDISPATCH_THREADS", "0")
    assert hardware_fingerprint()["threads"] == fpmod.usable_cores()


def _fake_nvidia_smi(tmp_path, body: str):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


@pytest.mark.parametrize(("body", "expect"), [
    ("echo 'NVIDIA H100 80GB HBM3'; echo 'NVIDIA H100 80GB HBM3'", ("NVIDIA H100 80GB HBM3",) * 2),
    ("echo 'driver not loaded' >&2; exit 9", ()),
    ("sleep 5", ()),
])
def test_gpu_names_never_fail(tmp_path, monkeypatch, body, expect):
    exe = _fake_nvidia_smi(tmp_path, body)
    monkeypatch.setattr(fpmod.shutil, "which", lambda name: exe if name == "nvidia-smi" else None)
    monkeypatch.setattr(fpmod, "GPU_QUERY_TIMEOUT_S", 0.3)
    fpmod.gpu_names.cache_clear()
    try:
        assert fpmod.gpu_names() == expect
        assert hardware_fingerprint()["gpus"] == list(expect)
    finally:
        fpmod.gpu_names.cache_clear()


def test_no_nvidia_smi_means_no_gpus(monkeypatch):
    monkeypatch.setattr(fpmod.shutil, "which", lambda name: None)
    fpmod.gpu_names.cache_clear()
    try:
        assert fpmod.gpu_names() == ()
    finally:
        fpmod.gpu_names.cache_clear()


# ------------------------------------------------------------------------------------------
# software
# ------------------------------------------------------------------------------------------


def test_software_fingerprint_lists_available_backends():
    registry = load_registry()
    sw = software_fingerprint(registry)
    assert sw["opdispatch"] == fpmod.opdispatch_version() != "unknown"
    assert sw["plan_format"] == PLAN_FORMAT_VERSION
    assert sw["backends"]["numpy"] == f"numpy {np.__version__}"
    assert set(sw["backends"]) == set(registry.available_backends())
    assert set(software_fingerprint(registry, ["numpy"])["backends"]) == {"numpy"}
    assert software_digest(sw) == software_digest(software_fingerprint(registry))
    assert software_digest(sw) != software_digest(software_fingerprint(registry, ["numpy"])) or \
        registry.available_backends() == ["numpy"]


def test_software_fingerprint_includes_the_native_build_id():
    registry = load_registry()
    if "native" not in registry.available_backends():
        pytest.skip(f"native backend unavailable: {registry.backends['native'].reason}")
    from impls.native import _module

    build_id = _module.native().build_id
    assert build_id and build_id in software_fingerprint(registry)["backends"]["native"]


def test_a_newly_registered_implementation_changes_the_software_fingerprint():
    """A backend's Python registration can change without its version (a kernel wired in):
    plans naming implementations another process may not have must not be shared."""
    from dispatch.registry import ImplTable

    registry = load_registry(fresh=True)
    before = software_fingerprint(registry)
    table = ImplTable("numpy")

    @table.register("Relu", "another_one")
    def _relu(node):
        """A second numpy Relu (test double)."""
        return lambda x: np.maximum(x, 0)

    registry.add_table(table)
    after = software_fingerprint(registry)
    assert after["backends"] == before["backends"]
    assert after["implementations"]["numpy"] != before["implementations"]["numpy"]
    lines = _key(software=before).explain_difference(_key(software=after))
    assert any(line.startswith("numpy: registered implementations or layouts changed")
               for line in lines), lines


# ------------------------------------------------------------------------------------------
# plan keys
# ------------------------------------------------------------------------------------------

HW = {"arch": "x86_64", "cpu_model": "AMD EPYC 7B13", "isa": ["avx", "avx2", "fma"],
      "physical_cores": 2, "logical_cores": 2, "threads": 2, "gpus": []}
SW = {"backends": {"native": "native build 1a2b (GNU 12.2.0, isa avx2)", "numpy": "numpy 2.0.0",
                   "onnxruntime": "onnxruntime 1.31.1"}, "opdispatch": "0.1.0", "plan_format": 1}


def _key(**changes) -> PlanKey:
    base = {"model": "m" * 64, "inputs": "x:float32[1,3,224,224]", "hardware": HW,
            "software": SW, "objective": "latency"}
    return PlanKey(**{**base, **changes})


def test_digest_is_stable_and_covers_every_part():
    assert _key().digest() == _key().digest()
    assert _key(hardware=dict(reversed(list(HW.items())))).digest() == _key().digest()
    variants = [_key(model="n" * 64), _key(inputs="x:float32[2,3,224,224]"),
                _key(hardware={**HW, "threads": 4}), _key(software={**SW, "opdispatch": "0.2.0"}),
                _key(objective="memory")]
    digests = {k.digest() for k in variants} | {_key().digest()}
    assert len(digests) == len(variants) + 1


def test_equal_keys_explain_nothing():
    assert _key().explain_difference(_key()) == []


def test_explain_difference_lines():
    new_sw = {**SW, "backends": {**SW["backends"], "onnxruntime": "onnxruntime 1.32.0",
                                 "native": "native build 3c4d (GNU 12.2.0, isa avx2)"}}
    new_hw = {**HW, "cpu_model": "Intel Xeon 8488C", "isa": ["avx", "avx2", "avx512f"],
              "threads": 4, "gpus": ["NVIDIA H100"]}
    lines = _key().explain_difference(_key(software=new_sw, hardware=new_hw, objective="memory",
                                           model="n" * 64, inputs="x:float32[2,3,224,224]"))
    assert lines == [
        "model structure changed",
        "inputs: x:float32[1,3,224,224] -> x:float32[2,3,224,224]",
        "hardware: CPU model AMD EPYC 7B13 -> Intel Xeon 8488C",
        "hardware: threads 2 -> 4",
        "hardware: GPU none -> NVIDIA H100",
        "hardware: ISA flags +avx512f, -fma",
        "native: build 1a2b (GNU 12.2.0, isa avx2) -> build 3c4d (GNU 12.2.0, isa avx2)",
        "onnxruntime: 1.31.1 -> 1.32.0",
        "objective: latency -> memory",
    ]


def test_explain_difference_backends_added_and_removed():
    fewer = {**SW, "backends": {"numpy": "numpy 2.0.0", "onednn": "onednn 3.5"}}
    lines = _key().explain_difference(_key(software=fewer))
    assert "onnxruntime: 1.31.1 -> not used" in lines
    assert "onednn: not used -> 3.5" in lines
    assert "native: build 1a2b (GNU 12.2.0, isa avx2) -> not used" in lines
    assert _key().explain_difference(_key(software={**SW, "plan_format": 2})) == ["plan format: 1 -> 2"]
