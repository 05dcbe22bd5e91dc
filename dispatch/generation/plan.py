"""A generation plan: which step way runs the prompt and which runs the token steps.

The prompt (prefill: a matrix product per layer over every prompt position) and the token
steps (a matrix-vector product per layer, bound by memory bandwidth) may want different
libraries or settings. The tuner (:mod:`tuner.generation.tune_generate`) measures every step
way at the user's prompt length and number of new tokens and stores a :class:`GenerationPlan`
inside a :class:`~dispatch.plan.Plan` (``Plan.generation``): a *choice* per phase (way, threads)
and the figures that made each win. Two phases on two ways share one key/value cache (both
ways write their presents into the same :class:`~dispatch.generation.kv_cache.KVCache`), so
the hand-over from prompt to steps copies nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dispatch.errors import PlanError


@dataclass(frozen=True)
class StepChoice:
    """One phase's way: the step way's name and its threads (``None``: every usable core)."""

    way: str
    threads: int | None = None

    def label(self) -> str:
        return self.way + ("" if self.threads is None else f" ({self.threads} thread(s))")

    @classmethod
    def from_dict(cls, data: Any) -> StepChoice:
        if not isinstance(data, dict) or not isinstance(data.get("way"), str):
            raise PlanError(f"a generation plan's phase must be {{'way': NAME, 'threads': N|null}}, "
                            f"received {data!r}")
        threads = data.get("threads")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise PlanError(f"a generation plan's threads must be a positive integer or null, "
                            f"received {threads!r}")
        return cls(data["way"], threads)


@dataclass
class GenerationPlan:
    """The ways of one decoder's generation on one machine (see the module docstring).

    Attributes:
        prefill: the way that runs the prompt.
        decode: the way that runs the token steps.
        why: per phase, why its way won (its measured margin over the next).
        measured: per candidate label, its figures (``prefill_ms``, ``step_ms``,
            ``tokens_per_s``, or ``rejected`` with the reason).
        notes: the prompt length and new tokens it was tuned for, the bandwidth bound, the
            budget.
        precision: the weights both phases run: ``float32`` (the model file itself) or a
            weight-reduced variant's :attr:`~dispatch.generation.weights.WeightRecipe.spec`.
        recipe: the variant's :class:`~dispatch.generation.weights.WeightRecipe` as a dict
            (``None`` for float32): the variant is found in the variant cache by it, or made
            again from it (:func:`~dispatch.generation.planned.planned_generator`).
        accuracy: the variant's figures against float32 and the budget they met.
    """

    prefill: StepChoice
    decode: StepChoice
    why: dict[str, str] = field(default_factory=dict)
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    precision: str = "float32"
    recipe: dict[str, Any] | None = None
    accuracy: dict[str, Any] = field(default_factory=dict)

    @property
    def split(self) -> bool:
        """Whether the prompt and the steps run on different ways."""
        return self.prefill != self.decode

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> GenerationPlan:
        if not isinstance(data, dict):
            raise PlanError(f"a generation plan must be a JSON object, received {type(data).__name__}")
        missing = [k for k in ("prefill", "decode") if k not in data]
        if missing:
            raise PlanError(f"a generation plan needs 'prefill' and 'decode'; missing {missing}; "
                            f"received keys {sorted(data)}")
        recipe = data.get("recipe")
        if recipe is not None:
            from dispatch.generation.weights import WeightRecipe

            WeightRecipe.from_dict(recipe)  # checked: a plan that cannot rebuild its variant fails here
        precision = data.get("precision", "float32")
        if not isinstance(precision, str) or (precision != "float32") != (recipe is not None):
            raise PlanError(f"a generation plan's precision is 'float32' without a recipe or a "
                            f"variant's name with its recipe; received precision {precision!r} and "
                            f"recipe {recipe!r}")
        return cls(StepChoice.from_dict(data["prefill"]), StepChoice.from_dict(data["decode"]),
                   dict(data.get("why") or {}), dict(data.get("measured") or {}),
                   dict(data.get("notes") or {}), precision,
                   dict(recipe) if recipe is not None else None, dict(data.get("accuracy") or {}))

    def describe(self) -> str:
        lines = [f"prompt: {self.prefill.label()}" + (f"  ({self.why['prefill']})"
                                                       if self.why.get("prefill") else ""),
                 f"token steps: {self.decode.label()}" + (f"  ({self.why['decode']})"
                                                           if self.why.get("decode") else "")]
        if self.recipe is not None:
            lines.append(f"weights: {self.precision}" + (f" ({self.accuracy['describe']})"
                                                         if self.accuracy.get("describe") else ""))
        if self.split:
            lines.append("the prompt's key/value cache is handed to the steps' way in place (one "
                         "cache, no copy)")
        for label, fig in self.measured.items():
            if "rejected" in fig:
                lines.append(f"  {label}: rejected: {fig['rejected']}")
            elif "accuracy" in fig:
                acc = fig["accuracy"]
                lines.append(f"  {label}: within budget: teacher-forced tokens {acc['tokens']}, "
                             f"prefix {acc['prefix']}, worst cosine {acc['cosine']}")
            elif "prefill_ms" not in fig:
                continue
            else:
                lines.append(f"  {label}: prompt {fig['prefill_ms']:.2f} ms, step "
                             f"{fig['step_ms']:.3f} ms ({fig['tokens_per_s']:.1f} tokens/s)")
        return "\n".join(lines)
