"""The quality budget of a quantized or half-precision target: the keys of its `validation`, their ranges, and the
defaults per variant kind (`fp32`, `half`, `int8`, `int4`).

Pure data (pydantic only), read by the recipe (`exporters.recipe.variants`, `exporters.recipe.model`) and by the
checks that judge a target (`exporters.validate.checks`, the layouts' proofs).

Example:
    >>> resolve_budget("int4", None)["min_top1_agreement"]
    0.75
    >>> variant_kind(None, "bfloat16")
    'half'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictFloat, StrictInt, ValidationInfo, field_validator

from exporters.recipe._base import Strict

VariantKind = Literal["fp32", "half", "int8", "int4"]
KINDS: tuple[VariantKind, ...] = ("fp32", "half", "int8", "int4")

# What a budget may be set to: a recipe can loosen a budget, never so far that the check stops checking (an agreement
# of 0, a KL no artifact exceeds, a cosine a reversed vector meets, no greedy token). (least, most, what it measures)
BUDGET_RANGES: dict[str, tuple[float, float, str]] = {
    "min_top1_agreement": (0.5, 1, "a share of positions; below 0.5 most argmaxes may differ"),
    "max_kl": (0, 1, "nats; a broken variant is far above 1"),
    "min_cosine": (0.5, 1, "below 0.5 a vector pointing elsewhere passes"),
    "min_greedy_match": (1, 512, "tokens, capped at what eager produced"),
}


class QualityBudget(Strict):
    """Task-level quality a quantized or half-precision target must keep against the eager float32 model (each key
    inside `BUDGET_RANGES`: loosened, never switched off)."""

    min_top1_agreement: StrictFloat | StrictInt | None = Field(
        default=None, ge=0.5, le=1, description="Share of logit positions whose argmax matches eager (0.5-1)."
    )
    max_kl: StrictFloat | StrictInt | None = Field(
        default=None, ge=0, le=1,
        description="Mean KL divergence of the next-token distribution, KL(eager || artifact), in nats (0-1).",
    )
    min_cosine: StrictFloat | StrictInt | None = Field(
        default=None, ge=0.5, le=1,
        description="Lowest cosine similarity of any hidden-state vector (encoders, components without logits; 0.5-1).",
    )
    min_greedy_match: StrictInt | None = Field(
        default=None, ge=1, le=512,
        description="Greedy tokens that must match eager before the first divergence (generation; 1-512).",
    )

    @field_validator(*BUDGET_RANGES, mode="before")
    @classmethod
    def _in_range(cls, value: Any, info: ValidationInfo) -> Any:
        """A budget outside its range is refused, saying what it would do (before pydantic's bare bound message)."""
        least, most, unit = BUDGET_RANGES[info.field_name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or least <= value <= most:
            return value
        raise ValueError(f"{info.field_name} {value!r} is outside [{least:g}, {most:g}] ({unit}): a recipe can loosen "
                         "a quality budget, not switch the check off")


BUDGET_KEYS = tuple(QualityBudget.model_fields)


class TargetValidation(QualityBudget):
    """A target's `validation`: atol/rtol (float32 artifacts) and the quality budget (quantized and half-precision
    ones, judged by task metrics instead)."""

    atol: StrictFloat | StrictInt | None = Field(default=None, ge=0, description="Absolute tolerance.")
    rtol: StrictFloat | StrictInt | None = Field(default=None, ge=0, description="Relative tolerance.")

# Defaults per variant kind. Per-channel int8 post-training quantization of a real LLM keeps ~97-99% of argmaxes and a
# next-token KL around 1e-3-1e-2 (llama.cpp publishes Q8_0 ~0.001, Q4_K_M ~0.03); a broken variant (wrong scales, a
# dropped layer) lands near chance. The defaults sit between: loose enough for honest quantization, far from broken.
DEFAULT_BUDGETS: dict[VariantKind, dict[str, float | int]] = {
    "half": {"min_top1_agreement": 0.98, "max_kl": 0.01, "min_cosine": 0.999, "min_greedy_match": 8},
    "int8": {"min_top1_agreement": 0.90, "max_kl": 0.05, "min_cosine": 0.99, "min_greedy_match": 4},
    "int4": {"min_top1_agreement": 0.75, "max_kl": 0.25, "min_cosine": 0.95, "min_greedy_match": 2},
}


def variant_kind(quantize: Any, dtype: str | None) -> VariantKind:
    """`fp32` (held to atol/rtol), `half` (float16/bfloat16), `int8` or `int4` (judged by task metrics)."""
    if quantize is not None:
        return quantize.kind
    return "half" if dtype in ("float16", "bfloat16") else "fp32"


def resolve_budget(kind: VariantKind, validation: Any) -> dict[str, float | int]:
    """The kind's defaults, overridden by the keys the target's `validation` sets."""
    budget = dict(DEFAULT_BUDGETS.get(kind, {}))
    for key in BUDGET_KEYS:
        value = getattr(validation, key, None) if validation is not None else None
        if value is not None:
            budget[key] = value
    return budget
