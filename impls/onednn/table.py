"""The oneDNN backend's implementation table; every module of this package registers here."""

from __future__ import annotations

from dispatch.registry import ImplTable

impls = ImplTable("onednn")
