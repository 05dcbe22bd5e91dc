"""The OpenVINO regions' settings, set by ``OpenVinoBackend.configure`` without importing the
region module (a backend whose registration is deferred is still configured:
dispatch.backend_manifest)."""

from __future__ import annotations

from typing import Any

#: threads 0: every core this process may use; the compiled cache's folder setting
SETTINGS: dict[str, Any] = {"threads": 0, "compiled_cache": "off"}
