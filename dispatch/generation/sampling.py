"""Choosing the next token from a step's logits: greedy, or sampled with a seed.

Sampling follows transformers' order of logits processors: temperature, then top-k, then
top-p (the smallest set of most likely tokens whose probability reaches ``top_p``), then one
draw from the renormalised distribution by numpy's PCG64 generator seeded with ``seed``, so
that a seed gives the same tokens on every way and every run.
"""

from __future__ import annotations

import numpy as np

from dispatch.errors import ArgumentError


class Sampler:
    """The token chooser of one generation (see the module docstring)."""

    def __init__(self, *, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None) -> None:
        if not temperature > 0:
            raise ArgumentError(f"temperature must be > 0, received {temperature}")
        if int(top_k) < 0:
            raise ArgumentError(f"top_k must be >= 0 (0: every token), received {top_k}")
        if not 0 < top_p <= 1:
            raise ArgumentError(f"top_p must be in (0, 1], received {top_p}")
        self.do_sample = bool(do_sample)
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def choose(self, logits: np.ndarray) -> int:
        """The next token from the logits of the last position, [vocabulary]."""
        if not self.do_sample:
            return int(np.argmax(logits))
        scores = logits.astype(np.float64) / self.temperature
        order = np.argsort(-scores, kind="stable")
        if self.top_k and self.top_k < order.size:
            order = order[: self.top_k]
        kept = scores[order]
        probs = np.exp(kept - kept[0])
        probs /= probs.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        pick = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))
        return int(order[min(pick, order.size - 1)])
