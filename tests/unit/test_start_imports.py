"""What a restarting process imports (issue 13: start-up): a Session that finds its graph in the
graph cache and its plan in the store, and runs it on OpenVINO, never imports onnx (~55 ms)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper

from dispatch.io_info import _ONNX_TYPES
from dispatch.io_info import type_string as _type_string
from tests.builders import small_cnn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name", sorted(_ONNX_TYPES))
def test_the_type_strings_agree_with_onnx(name):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(name))
    want = f"tensor({helper.tensor_dtype_to_string(elem).split('.')[-1].lower()})"
    assert _type_string(np.dtype(name)) == want


def test_a_session_from_the_caches_and_the_store_imports_no_onnx(tmp_path):
    pytest.importorskip("openvino")
    from tuner.store import PlanStore
    from tuner.tune import TuneOptions, tune

    path = tmp_path / "model.onnx"
    onnx.save(small_cnn(seed=5), str(path))
    env = dict(os.environ, OPDISPATCH_GRAPH_CACHE=str(tmp_path / "graphs"),
               OPDISPATCH_COMPILED_CACHE=str(tmp_path / "compiled"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    store = PlanStore(str(tmp_path / "plans.db"))
    tune(str(path), store=store, options=TuneOptions(budget_s=10, top_k=1, validate_runs=2,
                                                      backends=["openvino"], progress=False))
    child = textwrap.dedent("""
        import sys
        import numpy as np
        from dispatch import Session
        sess = Session(sys.argv[1], store=sys.argv[2], backends=["openvino"], require_plan=True)
        sess.run(None, {i.name: np.ones(i.shape, i.dtype) for i in sess.get_inputs()})
        print(sess.graph_cached, sorted(sess.plan.backends_used()), "onnx" in sys.modules)
    """)
    runs = [subprocess.run([sys.executable, "-c", child, str(path), str(store.path)], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]  # the first fills the graph cache and the backend manifest
    assert runs[1] == ["True", "['openvino']", "False"], runs
