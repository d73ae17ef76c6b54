"""The export recipe's model: what a model owner can declare in `export_config.json` (or `config.json`'s
`export_config`), as strict pydantic models, and the JSON Schema generated from them.

Reading a recipe file (the three forms, JSON paths and lines in errors) is `exporters.recipe.load`.

Example:
    >>> recipe = Recipe.model_validate({"exports": [{"export_format": "onnx", "opset_version": 18}]})
    >>> [(t.name, t.export_format, t.opset_version) for t in recipe.exports]
    [('onnx', 'onnx', 18)]
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Union

from pydantic import (
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from exporters.errors import RecipeError
from exporters.recipe._base import PathValueError, Strict, file_path
from exporters.recipe.dims import (
    DynamicShapesSpec,
    check_shape_spec,
)
from exporters.recipe.jsonpos import JsonPath, format_path, nearest_line
from exporters.recipe.layout import LayoutSetting, MergedSetting
from exporters.recipe.runner_layout import ExecutorchLayoutSetting
from exporters.recipe.budgets import TargetValidation
from exporters.recipe.variants import (
    MAX_PROMPT_CHARS,
    CalibrationSpec,
    QuantizeSpec,
    Variant,
    check_target,
    expand_targets,
)

CONFIG_FIELD = "export_config"
SCHEMA_VERSION = 1
FORMATS = ("dynamo", "onnx", "executorch")
TARGET_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
# Entries the tool writes in the output folder beside the target folders: a target cannot be called like them.
RESERVED_NAMES = ("logs", "report.json", "report.md", "publish.json")

# Limits on what a recipe can ask for (docs/recipe.md, "Limits"): past them it is refused with the JSON path.
MAX_TARGETS = 64  # after `variants` are expanded
MAX_CACHE_LEN = 1 << 20  # `generation.max_cache_len`, whatever the model; and never past the model's own positions


class Tolerance(Strict):
    """Numerical tolerance for comparing an artifact's outputs with the eager model's."""

    atol: StrictFloat | StrictInt | None = Field(default=None, ge=0, description="Absolute tolerance.")
    rtol: StrictFloat | StrictInt | None = Field(default=None, ge=0, description="Relative tolerance.")


class ComponentOverride(Strict):
    """Settings for one component of a generation export (`prefill`, `decode`, `language_model`, ...)."""

    dynamic: StrictBool | None = None
    strict: StrictBool | None = None
    dynamic_shapes: DynamicShapesSpec | None = None
    prefer_deferred_runtime_asserts_over_guards: StrictBool | None = None
    validation: Tolerance | None = None


class _TargetBase(Strict, MergedSetting):
    name: str | None = Field(
        default=None, pattern=TARGET_NAME_PATTERN, description="Unique name; the output folder. Defaults to the format."
    )
    dynamic: StrictBool = Field(default=False, description="Mark every axis Dim.AUTO when no dynamic_shapes are given.")
    strict: StrictBool = Field(default=False, description="torch.export strict mode.")
    dynamic_shapes: DynamicShapesSpec | None = Field(
        default=None,
        description="Per input (or cache leaf path, '*' wildcards), per axis: 'static', 'auto' or {name, min, max}.",
    )
    prefer_deferred_runtime_asserts_over_guards: StrictBool = False
    mode: Literal["model", "generation"] | None = Field(
        default=None, description="'model': one graph; 'generation': prefill/decode (and multimodal) components."
    )
    multi_token_decode: StrictBool = False
    components: dict[str, ComponentOverride] = Field(default_factory=dict)
    expected_components: list[str] | None = None
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    validation: TargetValidation | None = None
    quantize: QuantizeSpec | None = Field(default=None, description="Post-training quantization, by method name.")
    variants: list[Variant] | None = Field(
        default=None, min_length=1,
        description="One target per variant; a transformers.js-layout target keeps them as dtype files in its folder.")
    timeout: StrictFloat | StrictInt | None = Field(default=None, gt=0, description="Seconds the export of this target may take.")

    def shape_spec(self, component: str) -> DynamicShapesSpec | None:
        """The dynamic-shape spec `component` is exported with: its own override, else the target's."""
        override = self.components.get(component)
        if override is not None and override.dynamic_shapes is not None:
            return override.dynamic_shapes
        return self.dynamic_shapes

    def chose_shapes(self) -> bool:
        """Whether the recipe itself said which axes are dynamic (`dynamic` or `dynamic_shapes`, on the target or a
        component): a default that makes an axis dynamic for a runtime (the runner program's prompt, transformers.js's
        waveform) leaves such a target as written.

        Example:
            >>> from exporters.recipe.load import parse_recipe
            >>> [parse_recipe(text).exports[0].chose_shapes() for text in ('{"export_format": "onnx"}',
            ...     '{"export_format": "onnx", "dynamic": false}',
            ...     '{"export_format": "onnx", "components": {"decode": {"dynamic": true}}}')]
            [False, True, True]
        """
        return "dynamic" in self.model_fields_set or bool(self.dynamic_shapes) or any(
            override.dynamic is not None or override.dynamic_shapes is not None for override in self.components.values())

    @model_validator(mode="after")
    def _default_name(self):
        if self.name is None:
            self.name = self.export_format  # type: ignore[attr-defined]
        return self

    @field_validator("expected_components")
    @classmethod
    def _unique_components(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("component names repeat")
        return value

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str | None) -> str | None:
        if value in RESERVED_NAMES:
            raise ValueError(f"target name {value!r} is reserved: the output folder holds the tool's own "
                             f"{value!r}; reserved names are {list(RESERVED_NAMES)}")
        return value

    @model_validator(mode="after")
    def _consistent_shapes(self):
        check_target(self, PathValueError)
        check_shape_spec(self.dynamic_shapes, ("dynamic_shapes",))
        for component, override in self.components.items():
            check_shape_spec(override.dynamic_shapes, ("components", component, "dynamic_shapes"))
        return self


class DynamoTarget(_TargetBase):
    """A `torch.export` program (`.pt2`)."""

    export_format: Literal["dynamo"]


class OnnxTarget(_TargetBase, LayoutSetting):
    """An ONNX graph (`.onnx` with its `.onnx.data` weights)."""

    export_format: Literal["onnx"]
    opset_version: StrictInt | None = Field(default=None, ge=18, le=23, description="ONNX opset (onnxscript supports 18+).")
    optimize: StrictBool = True
    ort_fusions: Literal["cpu", "cuda", "webgpu", "dml"] | None = None
    unpadded: StrictBool = Field(default=False, description=(
        "Write the fused batch-1 generation graph for ONNX Runtime GenAI's calls only: one unpadded sequence whose "
        "positions count up from 0 (the GenAI builder's graph; a padded call is not computed right); its batch is "
        "fixed at 1. Needs ort_fusions 'cpu' and mode 'generation'."))
    output_path: str | None = Field(
        default=None, description="Also write the (single-graph) model to this path inside the target's folder."
    )
    external_data: StrictBool = Field(default=True, description="Weights in the `.onnx.data` sidecar (False: embedded).")
    export_params: StrictBool = Field(default=True, description="False: strip the weights (they are supplied at runtime).")
    keep_initializers_as_inputs: StrictBool = Field(default=False, description="List the weights as graph inputs too.")

    @field_validator("output_path")
    @classmethod
    def _inside_output(cls, value: str | None) -> str | None:
        if value is None:
            return value
        path = PurePosixPath(value.replace("\\", "/"))
        if path.is_absolute() or value.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", value):
            raise ValueError("output_path must be relative to the target's folder, not absolute")
        if ".." in path.parts or not path.parts:
            raise ValueError("output_path must stay inside the target's folder (no '..')")
        if path.suffix != ".onnx":
            raise ValueError("output_path must end with '.onnx'")
        return str(path)

    @model_validator(mode="after")
    def _fusions_need_optimize(self) -> OnnxTarget:
        if self.ort_fusions is not None and not self.optimize:
            raise PathValueError(("ort_fusions",), "ort_fusions requires optimize: true")
        if self.unpadded and (self.ort_fusions != "cpu" or self.mode != "generation" or self.merged is False):
            raise PathValueError(("unpadded",), "unpadded rewrites the merged graph that ort_fusions 'cpu' fuses for "
                                 "generation: set \"ort_fusions\": \"cpu\" and \"mode\": \"generation\" (and "
                                 "not \"merged\": false), or leave unpadded out")
        if self.unpadded and (self.dynamic or self.layout != "upstream"):
            raise PathValueError(("unpadded",), "unpadded writes ONNX Runtime GenAI's folder for one sequence at a "
                                 "time (the batch fixed at 1): drop \"dynamic\": true and \"layout\" (the "
                                 "transformers.js folder runs padded batches), or leave unpadded out")
        return self

    @model_validator(mode="after")
    def _dtype_its_runtime_runs(self) -> OnnxTarget:
        if self.dtype == "bfloat16" and self.device == "cpu":
            raise PathValueError(("dtype",), "a bfloat16 ONNX graph does not run on ONNX Runtime's CPU provider (it "
                                 "has no bfloat16 kernels for most operators, e.g. Mul): leave dtype unset (float32, "
                                 "the default), or set float16, or device 'cuda'")
        return self


class ExecutorchTarget(_TargetBase, ExecutorchLayoutSetting):
    """An ExecuTorch program (`.pte`)."""

    export_format: Literal["executorch"]
    backend: Literal["xnnpack", "cuda", "mlx"] = "xnnpack"
    alloc_graph_input: StrictBool = True
    alloc_graph_output: StrictBool = True
    alloc_mutable_buffers: StrictBool = True


Target = Annotated[Union[DynamoTarget, OnnxTarget, ExecutorchTarget], Field(discriminator="export_format")]


class InputsSpec(Strict):
    """How sample inputs are made: through the repo's own processor when it ships one, tokenized from `prompt` when
    it has a tokenizer, else synthesized in the family's layout."""

    batch_size: StrictInt = Field(default=1, ge=1, le=64)
    sequence_length: StrictInt = Field(default=8, ge=2, le=8192)
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS,
                               description="Text tokenized for the sample inputs (cut to the traced length).")
    image_size: StrictInt | None = Field(default=None, ge=1, le=4096)
    audio_length: StrictInt | None = Field(default=None, ge=1, description="Audio frames (feature length) for speech models.")
    decoder_sequence_length: StrictInt = Field(default=4, ge=1, le=4096)
    seed: StrictInt = 0
    calibration: CalibrationSpec | None = Field(default=None, description="Calibration data (static quantization).")


class GenerationSpec(Strict):
    """How `generate()` is captured for generation exports."""

    cache_implementation: Literal["dynamic", "static"] = Field(
        default="dynamic",
        description="'static': a fixed-size cache of max_cache_len positions. Unset, an executorch generation target "
                    "without a dynamic cache axis gets a static cache (docs/recipe.md).",
    )
    max_cache_len: StrictInt | None = Field(default=None, ge=2, le=MAX_CACHE_LEN, description="Positions of a "
                                            "static cache (default: min(2048, max_position_embeddings)); at most "
                                            "the model's max_position_embeddings.")
    max_new_tokens: StrictInt = Field(default=8, ge=1, le=512, description="Tokens compared in the generation-parity check.")


class ValidationSpec(Strict):
    """Tolerances (global, then per format) and how hard to probe."""

    atol: StrictFloat | StrictInt | None = Field(default=None, ge=0)
    rtol: StrictFloat | StrictInt | None = Field(default=None, ge=0)
    formats: dict[Literal["dynamo", "onnx", "executorch"], Tolerance] = Field(default_factory=dict)
    probe_unseen_shapes: StrictBool = True
    max_probe_elements: StrictInt = Field(default=1_000_000, ge=1, description=(
        "Skip probes at unseen shapes whose inputs are larger than this and than the traced inputs (the traced "
        "probe always runs)."))


@dataclass(frozen=True)
class RecipeSource:
    """Where a parsed recipe came from: its file, the line of every JSON path, where it sits in the file (`prefix`:
    `("export_config",)` inside config.json) and where its `exports` list is (None: a seed dict is the target)."""

    file: str | None = None
    lines: dict[JsonPath, int] = field(default_factory=dict)
    prefix: JsonPath = ()
    exports_at: JsonPath | None = ("exports",)


class Recipe(Strict):
    """A whole recipe, in its full form."""

    _source: RecipeSource = PrivateAttr(default_factory=RecipeSource)
    _origins: dict[str, JsonPath] = PrivateAttr(default_factory=dict)  # target -> exports[i] (or .variants[j])

    def __eq__(self, other: object) -> bool:  # the same recipe, wherever it was read from
        return isinstance(other, Recipe) and self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]

    schema_version: Literal[1] = 1
    exports: list[Target] = Field(min_length=1, max_length=MAX_TARGETS)
    inputs: InputsSpec = Field(default_factory=InputsSpec)
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)

    @model_validator(mode="after")
    def _expand_and_check(self) -> Recipe:
        """`variants` expanded into targets; calibration and unique names checked (exporters.recipe.variants)."""
        expanded = expand_targets(self.exports, self.inputs.calibration is not None, PathValueError)
        if len(expanded) > MAX_TARGETS:
            raise PathValueError(("exports",), f"the recipe makes {len(expanded)} targets (with its variants); a "
                                 f"recipe makes at most {MAX_TARGETS}: split it, or drop variants")
        self.exports = [target for target, _ in expanded]
        self._origins = {target.name: at for target, at in expanded}
        return self

    @model_validator(mode="after")
    def _cache_len_needs_static(self) -> Recipe:  # unset, an executorch target may default to a static cache
        generation = self.generation
        if generation.max_cache_len is not None and generation.cache_implementation != "static" and (
                "cache_implementation" in generation.model_fields_set
                or all(t.export_format != "executorch" for t in self.exports)):
            raise PathValueError(("generation", "max_cache_len"), "max_cache_len only applies to a static cache: "
                                  "set cache_implementation 'static' (an executorch generation target without a "
                                  "dynamic cache axis gets one by default)")
        return self

    def target(self, name: str) -> DynamoTarget | OnnxTarget | ExecutorchTarget:
        """The target called `name`; `KeyError` listing the names otherwise."""
        for target in self.exports:
            if target.name == name:
                return target
        raise KeyError(f"no target named {name!r}; the recipe has {[t.name for t in self.exports]}")

    def select(self, names: list[str]) -> list[DynamoTarget | OnnxTarget | ExecutorchTarget]:
        """The targets called `names`, in recipe order (every target when `names` is empty).

        Raises `RecipeError` (option `target`) naming the recipe's targets when a name is not one of them.

        Example:
            >>> from exporters.recipe.load import parse_recipe
            >>> recipe = parse_recipe('[{"export_format": "onnx"}, {"export_format": "dynamo"}]')
            >>> [t.name for t in recipe.select(["dynamo"])]
            ['dynamo']
            >>> recipe.select(["tflite"])
            Traceback (most recent call last):
            ...
            exporters.errors.RecipeError: $: `target` ['tflite'] is not in the recipe; its targets are ['onnx', 'dynamo']
        """
        known = [t.name for t in self.exports]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise RecipeError(f"`target` {unknown} is not in the recipe; its targets are {known}",
                              file=self._source.file, option="target")
        return [t for t in self.exports if not names or t.name in names]

    def locate(self, target: str, *inside: str | int) -> tuple[str, int | None]:
        """The JSON path (as written in the file) and line of `inside` within the target called `target`.

        Example:
            >>> from exporters.recipe.load import parse_recipe
            >>> recipe = parse_recipe('{"exports": [\\n  {"export_format": "onnx", "dynamic_shapes": {}}]}')
            >>> recipe.locate("onnx", "dynamic_shapes")
            ('$.exports[0].dynamic_shapes', 2)
        """
        index = self._origins[target][1] if target in self._origins else 0  # expanded variants: their target
        source = self._source
        path = (*source.prefix, *file_path(("exports", index, *inside), source.exports_at))
        return format_path(path), nearest_line(source.lines, path)

    def locate_setting(self, *inside: str | int) -> tuple[str, int | None]:
        """The JSON path (as written in the file) and line of a recipe-wide setting (`"generation",
        "max_cache_len"`).

        Example:
            >>> from exporters.recipe.load import parse_recipe
            >>> recipe = parse_recipe('{"exports": [{"export_format": "onnx"}],\\n "generation": {"max_new_tokens": 4}}')
            >>> recipe.locate_setting("generation", "max_new_tokens")
            ('$.generation.max_new_tokens', 2)
        """
        source = self._source
        if source.exports_at is None:  # a seed dict holds no recipe-wide settings: they are at their defaults
            return format_path((*source.prefix, *inside)), None
        path = (*source.prefix, *inside)
        return format_path(path), nearest_line(source.lines, path)

    @property
    def file(self) -> str | None:
        """The file the recipe was read from (None when parsed from text)."""
        return self._source.file

    def sha256(self) -> str:
        """A stable hash of the normalised recipe (what publishing and caching key on)."""
        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()

    def target_sha256(self, name: str) -> str:
        """A stable hash of one target plus the recipe-wide settings it depends on."""
        data = self.model_dump(mode="json")
        data["exports"] = [t for t in data["exports"] if t["name"] == name]
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of the full form (committed as `exporters/recipe/export_config.schema.json`)."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://github.com/hf/export-action/exporters/recipe/export_config.schema.json"
    schema["title"] = "export-action recipe (export_config.json, full form)"
    return schema


SCHEMA_PATH = Path(__file__).with_name("export_config.schema.json")


def write_schema(path: Path = SCHEMA_PATH) -> None:
    """Regenerate the committed JSON Schema."""
    path.write_text(json.dumps(recipe_json_schema(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

