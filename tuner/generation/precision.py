"""Reduced-precision weight plans of a decoder: the variants tried and their accuracy.

The variants are files made by onnxruntime's own quantization tools
(:mod:`dispatch.generation.weights`: int8 by ``quantize_dynamic``, 4-bit by
``MatMulNBitsQuantizer``), cached by the source file's digest and the recipe. Before any of
its step ways is timed, a variant's accuracy is measured against float32 on the user's
prompts, each run for ``steps`` new tokens:

* **teacher-forced token agreement** (``tokens``, the fair metric, the one budgets use by
  default): float32 generates its greedy tokens; the variant is then fed float32's prompt and
  tokens, step by step through its own key/value cache, and at each position its top-1 token
  is compared with float32's. One early difference does not drag every later position with
  it, so the figure measures the variant, not the chaos of a diverged continuation;
* **free-running prefix** (``prefix``): the variant generates on its own; the fraction of the
  steps before its first token that differs from float32's (1.0: identical over all steps).
  Reported; a budget may use it but it is harsh (a near-tie at step 3 scores 3/128);
* **worst cosine of the logits** (``cosine``): per position, the cosine similarity of the
  variant's logits to float32's, the worst over every position and prompt.

A budget is ``METRIC:BUDGET`` (:class:`GenerationAccuracy`): ``tokens:0.95`` (teacher-forced
agreement at least 0.95), ``prefix:0.5``, ``cosine:0.99``; the worst prompt decides.

Prompts come from the user (:func:`load_prompts`: token ids in an ``.npy`` or ``.npz``; real
text tokenised by any tokenizer, e.g. the MiniLM WordPiece requests that
``bench/models/shapes_models.py`` writes), else seeded random ids. With a random-weight
decoder (the tests' and the benchmark's), real-text ids measure the numerical faithfulness of
the variant on realistic id sequences, not language quality: no language was learnt.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.generation.weights import WeightRecipe
from tuner.tune_types import TuningError

#: the metrics a generation's accuracy budget may use, and what the budget means
METRICS: dict[str, str] = {
    "tokens": "teacher-forced top-1 agreement with float32's greedy tokens, at least BUDGET (0..1)",
    "prefix": "fraction of the steps before the first greedy token that differs from float32's, "
              "at least BUDGET (0..1)",
    "cosine": "worst cosine similarity of a step's logits to float32's, at least BUDGET (0..1]",
}
#: prompts used when the user gives none / at most
DEFAULT_PROMPTS, MAX_PROMPTS = 4, 16


def default_recipes() -> list[WeightRecipe]:
    """The variants tried, cheapest in bytes last: int8 per channel and 4-bit (block 32,
    accuracy level 4 and 0; block 128 level 4), each with the LM head quantized and, for int8
    and 4-bit block 32 level 4, without."""
    return [WeightRecipe("int8", head=True), WeightRecipe("int8", head=False),
            WeightRecipe("int4", head=True, block_size=32, accuracy_level=4),
            WeightRecipe("int4", head=False, block_size=32, accuracy_level=4),
            WeightRecipe("int4", head=True, block_size=32, accuracy_level=0),
            WeightRecipe("int4", head=True, block_size=128, accuracy_level=4)]


@dataclass(frozen=True)
class GenerationAccuracy:
    """A generation's accuracy budget: ``metric`` (one of :data:`METRICS`) at least ``budget``."""

    metric: str
    budget: float

    @classmethod
    def parse(cls, text: str) -> GenerationAccuracy:
        metric, sep, value = str(text).partition(":")
        try:
            budget = float(value) if sep else float("nan")
        except ValueError:
            budget = float("nan")
        if metric not in METRICS or not 0 <= budget <= 1 or (metric == "cosine" and budget <= 0):
            raise TuningError(f"generation accuracy {text!r}: expected METRIC:BUDGET with METRIC "
                              f"one of " + "; ".join(f"{m} ({why})" for m, why in METRICS.items())
                              + ", e.g. tokens:0.95")
        return cls(metric, budget)

    @property
    def spec(self) -> str:
        return f"{self.metric}:{self.budget:g}"

    def passes(self, acc: VariantAccuracy) -> bool:
        return acc.figure(self.metric) >= self.budget


@dataclass
class Reference:
    """float32's greedy generation after one prompt: its tokens and the logits that chose them
    (``logits[i]`` chose ``tokens[i]``)."""

    prompt: np.ndarray
    tokens: np.ndarray
    logits: np.ndarray


@dataclass
class VariantAccuracy:
    """A variant's figures against float32 (see the module docstring); each the worst prompt's."""

    tokens: float = 1.0
    prefix: float = 1.0
    cosine: float = 1.0
    per_prompt: list[dict[str, float]] = field(default_factory=list)

    def figure(self, metric: str) -> float:
        return float(getattr(self, metric))

    def describe(self) -> str:
        return (f"teacher-forced tokens {self.tokens:.3f}, free-running prefix {self.prefix:.3f}, "
                f"worst logits cosine {self.cosine:.5f} (worst of {len(self.per_prompt)} prompt(s))")

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": round(self.tokens, 4), "prefix": round(self.prefix, 4),
                "cosine": round(self.cosine, 6), "prompts": len(self.per_prompt)}


def load_prompts(path: str | os.PathLike, vocab: int, limit: int = MAX_PROMPTS,
                 max_len: int | None = None) -> list[np.ndarray]:
    """The prompts (int64 token ids) in ``path``: an ``.npy`` of one prompt ``[L]`` or of rows
    ``[N, L]`` (or ``[N, 1, L]``), or an ``.npz`` whose ``input_ids`` (else every integer
    array) holds them; where the ``.npz`` has an ``attention_mask`` beside ``input_ids``, each
    row keeps its unmasked ids (padding dropped). At most ``limit`` prompts, each cut to
    ``max_len`` ids; ids at or above ``vocab`` are folded (``id % vocab``: a tokenizer of
    another vocabulary on a random-weight decoder)."""
    text = os.fspath(path)
    try:
        loaded = np.load(text, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TuningError(f"--prompts {text!r}: expected an .npy or .npz of token ids, could not "
                          f"read it ({exc})") from None
    rows: list[np.ndarray] = []
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            names = ["input_ids"] if "input_ids" in loaded.files else list(loaded.files)
            mask = loaded["attention_mask"] if "attention_mask" in loaded.files else None
            for name in names:
                array = loaded[name]
                if array.dtype.kind not in "iu":
                    continue
                flat = array.reshape(-1, array.shape[-1]) if array.ndim > 1 else array[None]
                keep = None if mask is None or name != "input_ids" else mask.reshape(flat.shape)
                rows += [r[keep[i] != 0] if keep is not None else r for i, r in enumerate(flat)]
    else:
        if loaded.dtype.kind not in "iu":
            raise TuningError(f"--prompts {text!r}: expected integer token ids, received "
                              f"{loaded.dtype.name}")
        rows = list(loaded.reshape(-1, loaded.shape[-1]) if loaded.ndim > 1 else loaded[None])
    prompts = [np.asarray(r, dtype=np.int64)[:max_len] % vocab for r in rows if len(r)][:limit]
    if not prompts:
        raise TuningError(f"--prompts {text!r}: expected at least one non-empty row of integer token "
                          f"ids, found none")
    return prompts


def random_prompts(vocab: int, length: int, n: int = DEFAULT_PROMPTS, seed: int = 1) -> list[np.ndarray]:
    """``n`` seeded random prompts of ``length`` ids (when the user gives none)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=length, dtype=np.int64) for _ in range(n)]


def prompts_digest(prompts: Sequence[np.ndarray]) -> str:
    """The hexadecimal digest naming the accuracy data of a plan key: the prompts' ids (not the
    steps measured: ``run --generate N`` finds the plan whatever its N)."""
    h = hashlib.sha256(b"generation-prompts\n")
    for p in prompts:
        h.update(np.asarray(p, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:32]


def reference_runs(gen: Any, prompts: Sequence[np.ndarray], steps: int) -> list[Reference]:
    """float32's greedy ``steps`` tokens and their logits after each prompt, with the float32
    generator ``gen``."""
    out = []
    for prompt in prompts:
        tokens = np.empty(steps, dtype=np.int64)
        logits = np.empty((steps, gen.io.vocab), dtype=np.float32)
        row = gen.prefill(prompt)[0, -1]
        for i in range(steps):
            logits[i] = row
            tokens[i] = int(np.argmax(row))
            if i + 1 < steps:
                row = gen.step([int(tokens[i])])[0, -1]
        out.append(Reference(np.asarray(prompt, dtype=np.int64), tokens, logits))
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    den = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64 / den) if den > 0 else float(np.array_equal(a64, b64))


def variant_accuracy(gen: Any, references: Sequence[Reference]) -> VariantAccuracy:
    """The figures of the variant generator ``gen`` against float32's ``references`` (see the
    module docstring); NaN or Inf logits count as a cosine of -1 and a disagreement."""
    acc = VariantAccuracy()
    for ref in references:
        steps = len(ref.tokens)
        agree, worst = 0, 1.0
        row = gen.prefill(ref.prompt)[0, -1]
        for i in range(steps):
            finite = bool(np.isfinite(row).all())
            agree += int(finite and int(np.argmax(row)) == int(ref.tokens[i]))
            worst = min(worst, _cosine(row, ref.logits[i]) if finite else -1.0)
            if i + 1 < steps:
                row = gen.step([int(ref.tokens[i])])[0, -1]
        free = gen.generate(ref.prompt, steps)
        differs = np.nonzero(free[:steps] != ref.tokens[: len(free)])[0]
        prefix = (int(differs[0]) if len(differs) else steps) / steps
        figures = {"tokens": agree / steps, "prefix": prefix, "cosine": worst}
        acc.per_prompt.append(figures)
        acc.tokens = min(acc.tokens, figures["tokens"])
        acc.prefix = min(acc.prefix, prefix)
        acc.cosine = min(acc.cosine, worst)
    return acc


@dataclass
class VariantCheck:
    """One recipe's outcome before timing: its file, its accuracy, or why it was rejected."""

    recipe: WeightRecipe
    path: str | None = None
    made: bool = False
    accuracy: VariantAccuracy | None = None
    rejected: str | None = None

    @property
    def label(self) -> str:
        return self.recipe.spec

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"recipe": self.recipe.to_dict(), "describe": self.recipe.describe()}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy.to_dict()
        if self.path is not None:
            out["bytes"] = os.path.getsize(self.path)
        if self.rejected is not None:
            out["rejected"] = self.rejected
        return out


def check_variants(source: str, digest: str, recipes: Sequence[WeightRecipe],
                   references: Sequence[Reference], target: GenerationAccuracy,
                   make_gen: Callable[[str], Any], folder: str | os.PathLike | None = None,
                   log: Callable[[str], None] | None = None) -> list[VariantCheck]:
    """Make (or find cached) each recipe's variant of ``source`` and measure it against
    ``references`` with the generator ``make_gen(path)`` builds; a variant over ``target``,
    one that cannot be made or run, is rejected with its figure or the error."""
    import gc

    from dispatch.generation.weights import ensure_variant

    say = log or (lambda _msg: None)
    out = []
    for recipe in recipes:
        check = VariantCheck(recipe)
        out.append(check)
        try:
            path, check.made = ensure_variant(source, recipe, digest=digest, folder=folder)
            check.path = os.fspath(path)
        except Exception as exc:  # the tool refused this model
            check.rejected = f"not made: {type(exc).__name__}: {str(exc)[:300]}"
            say(f"  variant {recipe.spec}: {check.rejected}")
            continue
        try:
            gen = make_gen(check.path)
            check.accuracy = variant_accuracy(gen, references)
            del gen
            gc.collect()
        except Exception as exc:
            check.rejected = f"did not run: {type(exc).__name__}: {str(exc)[:300]}"
            say(f"  variant {recipe.spec}: {check.rejected}")
            continue
        if not target.passes(check.accuracy):
            check.rejected = (f"over the accuracy budget: {target.metric} "
                              f"{check.accuracy.figure(target.metric):.4f} < {target.budget:g} "
                              f"({check.accuracy.describe()})")
        say(f"  variant {recipe.spec} ({recipe.describe()}): {check.accuracy.describe()}"
            + (f": rejected, {target.metric} under {target.budget:g}" if check.rejected else ""))
    return out
