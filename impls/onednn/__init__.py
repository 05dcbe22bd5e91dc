"""The oneDNN backend: oneDNN's primitives (``_opdispatch_onednn``), the formats they pick and
their fused post-ops."""
