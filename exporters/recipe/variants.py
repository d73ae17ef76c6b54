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
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from exporters.recipe._base import Strict
from exporters.recipe.budgets import VariantKind

# Calibration text (docs/recipe.md, "Limits"): each prompt, and all of them together.
MAX_PROMPT_CHARS = 65_536
MAX_CALIBRATION_CHARS = 1 << 20



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
        default=False, description="Also an untied embedding table (`Gather` -> `GatherBlockQuantized`, 4-bit blocks "
                                   "along the hidden axis). An untied LM head's MatMul is quantized either way; a "
                                   "tied table and head follow `shared_embeddings`.")
    shared_embeddings: StrictBool = Field(
        default=True, description="A table tied to the LM head stored once, in 4 bits: the head a `MatMulNBits`, the "
                                  "lookup a `GatherBlockQuantized` reading the head's blocks (GenAI's builder's "
                                  "`shared_embeddings`, its default for a tied model). false: both stay one float "
                                  "table. No effect on an untied model.")

    @property
    def kind(self) -> VariantKind:
        return "int4"

    def options(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "accuracy_level": self.accuracy_level, "symmetric": self.symmetric,
                "quantize_embeddings": self.quantize_embeddings, "shared_embeddings": self.shared_embeddings}


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


# the dtype files an encoder-decoder's merged decoder cannot have (its If branches read their weights from the outer
# graph and each hold their own `zeros`: exporters.layouts.transformers_js.dtypes refuses each after export)
MERGED_DECODER_REFUSED = {
    "int8-dynamic": "ONNX Runtime's dynamic quantizer leaves the If branches' weights float (a q8 file of float "
                    "weights would be mislabelled)",
    "fp16": "ONNX Runtime's float16 converter refuses the If branches' shared initializer names",
    "q4f16": "ONNX Runtime's float16 converter refuses the If branches' shared initializer names",
}


def dtype_files_refusal(target: Any, family: str) -> str | None:
    """Why a transformers.js target's `variants` cannot all be dtype files of its folder, said before its export
    (naming the variant and the layout): an encoder-decoder's (Whisper's, Moonshine's) merged decoder takes `int4`
    (`_q4`) only; None where they fit.

    Example:
        >>> from types import SimpleNamespace
        >>> target = SimpleNamespace(export_format="onnx", layout="transformers.js", variants=["fp32", "fp16"])
        >>> dtype_files_refusal(target, "speech-seq2seq")[:55]
        "variant 'fp16' cannot take layout 'transformers.js' for"
        >>> dtype_files_refusal(target, "vision-language") is None
        True
    """
    if not keeps_variants(target) or family not in ("seq2seq", "speech-seq2seq"):
        return None
    refused = [variant for variant in target.variants if variant in MERGED_DECODER_REFUSED]
    if not refused:
        return None
    return (f"variant '{refused[0]}' cannot take layout 'transformers.js' for an encoder-decoder model: its merged "
            f"decoder gets the 'int4' dtype file (_q4) only, and {MERGED_DECODER_REFUSED[refused[0]]}; list "
            "\"fp32\" and \"int4\" for this target")


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
