"""Quantized and half-precision variants in the recipe: the `quantize` object of a target, `inputs.calibration`, the
quality budget keys of a target's `validation`, and the `variants` shorthand.

Pure data (pydantic only): the recipe module builds on it, and `exporters.export.quantize` turns a [`QuantizeSpec`] into
the upstream quantizer. Methods are chosen by these documented names, never by an import path from the recipe.

Example:
    >>> spec = XnnpackQuantize(method="pt2e-xnnpack", scheme="8da4w")
    >>> (spec.formats, spec.kind, spec.needs_calibration)
    (('executorch',), 'int4', False)
    >>> [name for name, _ in expand_variant_names("onnx", ["fp32", "int8-dynamic"])]
    ['onnx', 'onnx-int8']
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from exporters.recipe._base import Strict

# Calibration text (docs/recipe.md, "Limits"): each prompt, and all of them together.
MAX_PROMPT_CHARS = 65_536
MAX_CALIBRATION_CHARS = 1 << 20

VariantKind = Literal["fp32", "half", "int8", "int4"]
KINDS: tuple[VariantKind, ...] = ("fp32", "half", "int8", "int4")


# ── quantize: one model per method ────────────────────────────────────────────


class _Method(Strict):
    formats: ClassVar[tuple[str, ...]] = ()
    needs_calibration_always: ClassVar[bool] = False

    @property
    def kind(self) -> VariantKind:
        return "int8"

    @property
    def needs_calibration(self) -> bool:
        """Whether activation ranges are measured ahead of time (static quantization): then the recipe must give
        `inputs.calibration`."""
        return self.needs_calibration_always

    def options(self) -> dict[str, Any]:
        """The options set in the recipe (what `export.json` records)."""
        return self.model_dump(exclude={"method"}, exclude_none=True)


class OnnxRuntimeDynamicQuantize(_Method):
    """ONNX Runtime `quantize_dynamic`: int8 weights, activations quantized at run time; no calibration."""

    formats: ClassVar[tuple[str, ...]] = ("onnx",)

    method: Literal["onnxruntime-dynamic"]
    per_channel: StrictBool | None = Field(default=None, description="Per-channel weight scales (ONNX Runtime: false).")
    reduce_range: StrictBool | None = Field(default=None, description="7-bit weights, for older x86 CPUs.")
    weight_type: Literal["int8", "uint8"] | None = Field(default=None, description="ONNX Runtime's default: int8.")
    op_types_to_quantize: list[str] | None = Field(default=None, description="ONNX op types, e.g. ['MatMul'].")
    nodes_to_exclude: list[str] | None = Field(default=None, description="ONNX node names kept in float.")


class OnnxRuntimeStaticQuantize(_Method):
    """ONNX Runtime `quantize_static`: int8 weights and activations (QDQ), activation ranges calibrated on
    `inputs.calibration`."""

    formats: ClassVar[tuple[str, ...]] = ("onnx",)
    needs_calibration_always: ClassVar[bool] = True

    method: Literal["onnxruntime-static"]
    quant_format: Literal["qdq", "qoperator"] | None = Field(default=None, description="ONNX Runtime's default: qdq.")
    per_channel: StrictBool | None = None
    reduce_range: StrictBool | None = None
    activation_type: Literal["int8", "uint8"] | None = None
    weight_type: Literal["int8", "uint8"] | None = None
    calibrate_method: Literal["minmax", "entropy", "percentile"] | None = None
    op_types_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] | None = None


class OnnxRuntimeInt4Quantize(_Method):
    """ONNX Runtime's `MatMulNBitsQuantizer`: weight-only, block-wise 4-bit weights of every `MatMul` (the
    `MatMulNBits` op), activations in float; no calibration. The defaults are ONNX Runtime GenAI's model builder's for
    the CPU (`--precision int4`)."""

    formats: ClassVar[tuple[str, ...]] = ("onnx",)

    method: Literal["onnxruntime-int4"]
    block_size: Literal[16, 32, 64, 128, 256] = Field(default=32, description="Weights per scale (GenAI's builder: 32).")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        default=4, description="MatMulNBits' compute type for activations: 4 int8 (GenAI's CPU default), 1 fp32, "
                               "2 fp16, 3 bf16, 0 the runtime's choice.")
    symmetric: StrictBool = Field(default=True, description="Symmetric (no zero points; GenAI's builder: true).")
    quantize_embeddings: StrictBool = Field(
        default=False, description="Also the embedding table (`Gather` -> `GatherBlockQuantized`, 4-bit blocks along "
                                   "the hidden axis); a tied LM head's MatMul is quantized either way.")

    @property
    def kind(self) -> VariantKind:
        return "int4"

    def options(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "accuracy_level": self.accuracy_level, "symmetric": self.symmetric,
                "quantize_embeddings": self.quantize_embeddings}


class XnnpackQuantize(_Method):
    """PT2E quantization for ExecuTorch's XNNPACK backend: linear layers with 8-bit dynamic (per-token) activations
    and per-channel symmetric 8- or 4-bit weights (`8da8w`, `8da4w`)."""

    formats: ClassVar[tuple[str, ...]] = ("executorch",)

    method: Literal["pt2e-xnnpack"]
    scheme: Literal["8da8w", "8da4w"] = Field(default="8da8w", description="8-bit dynamic activations, 8- or 4-bit weights.")

    @property
    def kind(self) -> VariantKind:
        return "int4" if self.scheme == "8da4w" else "int8"

    def options(self) -> dict[str, Any]:
        return {"scheme": self.scheme}


GroupSize = Literal[0, 16, 32, 64, 128, 256]


class TorchaoXnnpackQuantize(_Method):
    """torchao's `quantize_` before export, as optimum-executorch's `--qlinear 8da4w --qembedding 8w`: linears with
    int8 dynamic activations and group-wise int4 (`8da4w`) or per-channel int8 (`8da8w`) weights, the embedding table
    with int8 or int4 weights; a tied output projection is untied (each quantized its own way)."""

    formats: ClassVar[tuple[str, ...]] = ("executorch",)

    method: Literal["torchao-xnnpack"]
    linear: Literal["8da4w", "8da8w"] = Field(default="8da4w", description="Linear layers' scheme.")
    group_size: GroupSize | None = Field(default=None, description="Weights per scale of a 4-bit linear (default "
                                         "32, optimum-executorch's; 0: per channel). 8da8w is per channel.")
    embedding: Literal["8w", "4w", "none"] = Field(default="8w", description="The table: 8-, 4-bit or float.")
    embedding_group_size: GroupSize = Field(default=0, description="Weights per scale of the table (0: per row).")

    @model_validator(mode="after")
    def _groups_fit(self) -> TorchaoXnnpackQuantize:
        if self.linear == "8da8w" and self.group_size not in (None, 0):
            raise ValueError("'group_size' groups 4-bit weights; 8da8w weights are per channel: drop 'group_size' "
                             "or use linear '8da4w'")
        return self

    @property
    def kind(self) -> VariantKind:
        return "int4" if self.linear == "8da4w" or self.embedding == "4w" else "int8"

    def options(self) -> dict[str, Any]:
        group = 0 if self.linear == "8da8w" else (32 if self.group_size is None else self.group_size)
        return {"linear": self.linear, "group_size": group, "embedding": self.embedding,
                "embedding_group_size": self.embedding_group_size}


class X86Quantize(_Method):
    """PT2E quantization with torchao's `X86InductorQuantizer` (int8 QDQ) for `torch.export` programs and ONNX."""

    formats: ClassVar[tuple[str, ...]] = ("dynamo", "onnx")

    method: Literal["pt2e-x86"]
    dynamic: StrictBool = Field(
        default=False, description="Dynamic activations (no calibration); false: static, calibrated on inputs.calibration."
    )

    @property
    def needs_calibration(self) -> bool:
        return not self.dynamic

    def options(self) -> dict[str, Any]:
        return {"dynamic": self.dynamic}


METHODS: dict[str, type[_Method]] = {
    "onnxruntime-dynamic": OnnxRuntimeDynamicQuantize,
    "onnxruntime-static": OnnxRuntimeStaticQuantize,
    "onnxruntime-int4": OnnxRuntimeInt4Quantize,
    "pt2e-xnnpack": XnnpackQuantize,
    "torchao-xnnpack": TorchaoXnnpackQuantize,
    "pt2e-x86": X86Quantize,
}

QuantizeSpec = Annotated[
    Union[OnnxRuntimeDynamicQuantize, OnnxRuntimeStaticQuantize, OnnxRuntimeInt4Quantize, XnnpackQuantize,
          TorchaoXnnpackQuantize, X86Quantize],
    Field(discriminator="method"),
]


def methods_for(export_format: str) -> list[str]:
    """The quantize methods that apply to `export_format` exports."""
    return [name for name, model in METHODS.items() if export_format in model.formats]


# ── inputs.calibration ────────────────────────────────────────────────────────


class CalibrationSpec(Strict):
    """Calibration data for static quantization, from the recipe only (never the network): `prompts` tokenized with
    the repo's tokenizer, or `samples` synthesized like the sample inputs. Every sample has the traced shape (prompts
    are cut or repeated to the sample's sequence length), so it stays inside the declared shapes."""

    prompts: list[Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]] | None = Field(
        default=None, min_length=1, max_length=1024,
        description=f"Texts, each at most {MAX_PROMPT_CHARS} characters, {MAX_CALIBRATION_CHARS} in all.")
    samples: StrictInt | None = Field(default=None, ge=1, le=1024, description="Synthesized samples (random tokens).")

    @model_validator(mode="after")
    def _one_source(self) -> CalibrationSpec:
        if (self.prompts is None) == (self.samples is None):
            raise ValueError("give calibration data as either 'prompts' (a list of texts) or 'samples' (a count)")
        return self

    @field_validator("prompts")
    @classmethod
    def _bounded(cls, prompts: list[str] | None) -> list[str] | None:
        total = sum(len(prompt) for prompt in prompts or [])
        if total > MAX_CALIBRATION_CHARS:
            raise ValueError(f"the calibration prompts hold {total} characters; at most {MAX_CALIBRATION_CHARS} in all "
                             "(each sample is cut to the traced length anyway): give fewer or shorter prompts")
        return prompts

    @property
    def count(self) -> int:
        return len(self.prompts) if self.prompts is not None else int(self.samples or 0)


# ── quality budget ────────────────────────────────────────────────────────────


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


# ── variants shorthand ────────────────────────────────────────────────────────

Variant = Literal["fp32", "fp16", "bf16", "int8-dynamic", "int8-static", "int4", "q4f16", "8da8w", "8da4w"]

# What XNNPACK users mean by 4-bit (optimum-executorch's --qlinear 8da4w --qembedding 8w): group-wise int4 linears,
# an int8 embedding table.
TORCHAO_8DA4W = {"method": "torchao-xnnpack", "linear": "8da4w", "embedding": "8w"}

# variant -> (name suffix, target settings per format); a format missing from the map does not take the variant.
VARIANTS: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "fp32": ("", {f: {"dtype": "float32"} for f in ("dynamo", "onnx", "executorch")}),
    "fp16": ("-fp16", {f: {"dtype": "float16"} for f in ("dynamo", "onnx", "executorch")}),
    "bf16": ("-bf16", {f: {"dtype": "bfloat16"} for f in ("dynamo", "onnx", "executorch")}),
    "int8-dynamic": ("-int8", {
        "onnx": {"quantize": {"method": "onnxruntime-dynamic"}},
        "dynamo": {"quantize": {"method": "pt2e-x86", "dynamic": True}},
        "executorch": {"quantize": {"method": "pt2e-xnnpack", "scheme": "8da8w"}},
    }),
    "int8-static": ("-int8-static", {
        "onnx": {"quantize": {"method": "onnxruntime-static"}},
        "dynamo": {"quantize": {"method": "pt2e-x86", "dynamic": False}},
    }),
    "int4": ("-int4", {"onnx": {"quantize": {"method": "onnxruntime-int4"}},
                       "executorch": {"quantize": TORCHAO_8DA4W}}),
    "q4f16": ("-q4f16", {}),  # a transformers.js dtype file only (TRANSFORMERS_JS_DTYPES)
    "8da8w": ("-8da8w", {"executorch": {"quantize": {"method": "pt2e-xnnpack", "scheme": "8da8w"}}}),
    "8da4w": ("-8da4w", {"executorch": {"quantize": TORCHAO_8DA4W}}),
}


# A transformers.js-layout target keeps its variants in its one folder, as the dtype files transformers.js picks with
# `dtype` (its src/utils/dtypes.js DEFAULT_DTYPE_SUFFIX_MAPPING): variant -> (dtype, file suffix, kind, quantize).
TRANSFORMERS_JS_DTYPES: dict[str, tuple[str, str, VariantKind, dict[str, Any] | None]] = {
    "fp32": ("fp32", "", "fp32", None),
    "fp16": ("fp16", "_fp16", "half", None),
    "int8-dynamic": ("q8", "_quantized", "int8", {"method": "onnxruntime-dynamic", "per_channel": True}),
    "int4": ("q4", "_q4", "int4", {"method": "onnxruntime-int4", "accuracy_level": 0}),
    "q4f16": ("q4f16", "_q4f16", "int4", {"method": "onnxruntime-int4", "accuracy_level": 0}),
}


def keeps_variants(target: Any) -> bool:
    """Whether the target's `variants` stay in its one folder (a transformers.js-layout target's dtype files) instead
    of each becoming its own target.

    Example:
        >>> from types import SimpleNamespace
        >>> keeps_variants(SimpleNamespace(export_format="onnx", layout="transformers.js", variants=["fp32", "int4"]))
        True
    """
    return bool(getattr(target, "variants", None)) and target.export_format == "onnx" \
        and getattr(target, "layout", None) == "transformers.js"


def variants_for(export_format: str) -> list[str]:
    return [name for name, (_, per_format) in VARIANTS.items() if export_format in per_format]


def expand_variant_names(base: str, variants: list[str]) -> list[tuple[str, str]]:
    """`(target name, variant)` for each variant of the target called `base`."""
    return [(base + VARIANTS[variant][0], variant) for variant in variants]


def variant_settings(export_format: str, variant: str) -> dict[str, Any]:
    """The target settings a variant sets, or `ValueError` when the format does not take it."""
    _, per_format = VARIANTS[variant]
    if variant == "q4f16" and export_format == "onnx":
        raise ValueError("variant 'q4f16' is a transformers.js dtype file (4-bit weights in a float16 graph): set "
                         "\"layout\": \"transformers.js\"")
    if export_format not in per_format:
        raise ValueError(
            f"variant '{variant}' does not apply to {export_format} targets; they take {variants_for(export_format)}"
        )
    return per_format[export_format]


Location = tuple[Any, ...]  # a JSON path: ("exports", 0, "variants", 1)


def _where(at: Location) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in at).lstrip(".")


def check_target(target: Any, path_error: Callable[[Location, str], Exception]) -> None:
    """A target's `quantize` fits its format (and backend), and its `variants` fit its format and settings."""
    fmt = target.export_format
    if target.quantize is not None and fmt not in target.quantize.formats:
        raise path_error(("quantize", "method"), f"'{target.quantize.method}' quantizes "
                         f"{' and '.join(target.quantize.formats)} exports, not {fmt} ones; {fmt} targets take "
                         f"{methods_for(fmt)}")
    if target.quantize is not None and getattr(target, "backend", "xnnpack") != "xnnpack":
        raise path_error(("quantize", "method"), f"'{target.quantize.method}' makes XNNPACK programs; this target's "
                                                 f"backend is '{target.backend}'")
    if target.variants is None:
        return
    if target.quantize is not None:
        raise path_error(("variants",), "give either 'variants' or 'quantize': each variant sets its own quantization")
    if target.dtype not in (None, "float32"):
        raise path_error(("dtype",), "with 'variants', each variant sets the precision: drop 'dtype'")
    for index, variant in enumerate(target.variants):
        if variant in target.variants[:index]:
            raise path_error(("variants", index), f"variant '{variant}' is listed twice")
        if keeps_variants(target):
            if variant not in TRANSFORMERS_JS_DTYPES:
                raise path_error(("variants", index), f"variant '{variant}' has no transformers.js dtype file; a "
                                 f"transformers.js target takes {list(TRANSFORMERS_JS_DTYPES)}")
            continue
        try:
            variant_settings(fmt, variant)
        except ValueError as err:
            raise path_error(("variants", index), str(err)) from None


def method_message(error: dict[str, Any]) -> str:
    """The message for an unknown or missing quantize `method` (a pydantic union-tag error)."""

    given = error.get("ctx", {}).get("tag")
    if given is None:
        return f"missing 'method'; use one of {list(METHODS)}"
    close = difflib.get_close_matches(str(given), list(METHODS), n=1)
    return f"unknown quantize method {given!r}; use one of {list(METHODS)}" + (
        f"; did you mean '{close[0]}'?" if close else "")


def expand_targets(exports: list[Any], has_calibration: bool,
                   path_error: Callable[[Location, str], Exception]) -> list[tuple[Any, Location]]:
    """Each target with where it comes from in the recipe (`("exports", i)` or `("exports", i, "variants", j)`):
    `variants` expanded into targets, then checked for calibration data and unique names; a problem raises
    `path_error(path, message)`."""
    expanded: list[tuple[Any, Location]] = []
    for index, target in enumerate(exports):
        if not target.variants or keeps_variants(target):
            expanded.append((target, ("exports", index)))
            continue
        base = target.model_dump(exclude={"variants", "name"}, exclude_none=True)
        for position, (name, variant) in enumerate(expand_variant_names(target.name, target.variants)):
            at = ("exports", index, "variants", position)
            data = {**base, **variant_settings(target.export_format, variant), "name": name}
            try:
                expanded.append((type(target).model_validate(data), at))
            except (ValidationError, ValueError) as err:
                first = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
                raise path_error(at, f"variant '{variant}': {first.removeprefix('Value error, ')}") from None
    for target, at in expanded:
        if target.quantize is not None and target.quantize.needs_calibration and not has_calibration:
            raise path_error(
                at if at[-2:-1] == ("variants",) else (*at, "quantize", "method"),
                f"'{target.quantize.method}' calibrates activation ranges on data, and the recipe has none: add "
                '"inputs": {"calibration": {"prompts": [...]}} (or {"samples": N}), or use a dynamic method',
            )
    seen: dict[str, Location] = {}
    for target, at in expanded:
        if target.name in seen:
            raise path_error(
                at if at[-2:-1] == ("variants",) else (*at, "name"),
                f"target name '{target.name}' is used twice (also by {_where(seen[target.name])}); give each target "
                "a unique 'name'",
            )
        seen[target.name] = at
    return expanded
