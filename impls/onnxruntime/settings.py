"""The onnxruntime regions' settings, set by ``OnnxRuntimeBackend.configure`` without
importing the region module (a backend whose registration is deferred is still configured:
dispatch.backend_manifest)."""

from __future__ import annotations

#: 0: every core this process may use (as the native backend; onnxruntime's own default is
#: the physical cores)
SETTINGS: dict[str, int] = {"intra_op_threads": 0}
