"""The numpy backend's implementation table; every module of this package registers here."""

from __future__ import annotations

from dispatch.registry import ImplTable

#: the reference backend: its kernels size their outputs from the arrays they receive, so
#: they also run nodes whose shapes only the data decides (dynamic values)
impls = ImplTable("numpy", dynamic_shapes=True)
