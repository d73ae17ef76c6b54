"""The export recipe: what a model owner publishes in `export_config.json` (or `config.json`'s `export_config`).

Three forms are accepted, all normalised to one [`Recipe`]:

- the seed form: one upstream config dict, `{"export_format": "onnx", "dynamic": true, ...}`;
- a list of such dicts;
- the full form: `{"schema_version": 1, "exports": [...], "inputs": {...}, "generation": {...}, "validation": {...}}`.

Every problem raises [`RecipeError`] naming the JSON path and line, with a did-you-mean for unknown keys.

Example:
    >>> recipe = parse_recipe('{"export_format": "onnx", "opset_version": 18}')
    >>> [(t.name, t.export_format) for t in recipe.exports]
    [('onnx', 'onnx')]
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import RecipeError
from .jsonpos import JsonPath, JsonPositionError, format_path, nearest_line, parse_with_positions

RECIPE_FILE = "export_config.json"
CONFIG_FIELD = "export_config"
SCHEMA_VERSION = 1
FORMATS = ("dynamo", "onnx", "executorch")
TARGET_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
DIM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=True)


class DimSpec(_Strict):
    """A named dynamic dimension. One name used on several inputs is one shared dimension."""

    name: str = Field(pattern=DIM_NAME_PATTERN, description="Dimension name; the same name on two axes ties them.")
    min: StrictInt | None = Field(default=None, ge=0, description="Smallest size the export must accept.")
    max: StrictInt | None = Field(default=None, ge=1, description="Largest size the export must accept.")

    @model_validator(mode="after")
    def _bounds(self) -> DimSpec:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        return self


def _kind_of(value: Any) -> str:
    """Pick the union branch from the JSON type, so errors name the field, not every branch."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "keyword"
    return "other"


_KIND_WORDS = {"object": "an object", "list": "a list", "keyword": "a string ('static' or 'auto')"}


AxisSpec = Annotated[
    Union[Annotated[Literal["static", "auto"], Tag("keyword")], Annotated[DimSpec, Tag("object")]],
    Discriminator(_kind_of),
]
ShapeSpec = Annotated[
    Union[
        Annotated[list[AxisSpec], Tag("list")],
        Annotated[dict[Annotated[str, Field(pattern=r"^-?[0-9]+$")], AxisSpec], Tag("object")],
        Annotated[Literal["auto"], Tag("keyword")],
    ],
    Discriminator(_kind_of),
]
DynamicShapesSpec = dict[str, ShapeSpec]


class Tolerance(_Strict):
    """Numerical tolerance for comparing an artifact's outputs with the eager model's."""

    atol: StrictFloat | StrictInt | None = Field(default=None, ge=0, description="Absolute tolerance.")
    rtol: StrictFloat | StrictInt | None = Field(default=None, ge=0, description="Relative tolerance.")


class ComponentOverride(_Strict):
    """Settings for one component of a generation export (`prefill`, `decode`, `language_model`, ...)."""

    dynamic: StrictBool | None = None
    strict: StrictBool | None = None
    dynamic_shapes: DynamicShapesSpec | None = None
    prefer_deferred_runtime_asserts_over_guards: StrictBool | None = None
    validation: Tolerance | None = None


class _TargetBase(_Strict):
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
    merged: StrictBool | None = Field(
        default=None,
        description="Generation: one graph ('model') for the prompt (empty cache) and every decode step, instead of "
        "prefill + decode. Default: true for ONNX targets of decoder-only models with dynamic shapes and a dynamic "
        "cache, false otherwise.",
    )
    components: dict[str, ComponentOverride] = Field(default_factory=dict)
    expected_components: list[str] | None = None
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    validation: Tolerance | None = None
    timeout: StrictFloat | StrictInt | None = Field(default=None, gt=0, description="Seconds the export of this target may take.")

    @model_validator(mode="after")
    def _default_name(self):
        if self.name is None:
            self.name = self.export_format  # type: ignore[attr-defined]
        return self

    @model_validator(mode="after")
    def _merged_is_one_graph(self):
        if self.merged and self.mode == "model":
            raise _PathValueError(("merged",), "merged applies to mode 'generation' (mode 'model' is one graph already)")
        if self.merged:
            separate = sorted(set(self.components) & {"prefill", "decode"})
            if separate:
                raise _PathValueError(
                    ("components", separate[0]),
                    f"a merged export has one component, 'model', and no {separate}: put these settings under "
                    "components.model, or set merged: false",
                )
        return self

    @field_validator("expected_components")
    @classmethod
    def _unique_components(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("component names repeat")
        return value


class DynamoTarget(_TargetBase):
    """A `torch.export` program (`.pt2`)."""

    export_format: Literal["dynamo"]


class OnnxTarget(_TargetBase):
    """An ONNX graph (`.onnx` with its `.onnx.data` weights)."""

    export_format: Literal["onnx"]
    opset_version: StrictInt | None = Field(default=None, ge=18, le=23, description="ONNX opset (onnxscript supports 18+).")
    optimize: StrictBool = True
    ort_fusions: Literal["cpu", "cuda", "webgpu", "dml"] | None = None
    output_path: str | None = Field(
        default=None, description="Also write the (single-graph) model to this path inside the target's folder."
    )
    external_data: StrictBool = Field(default=True, description="Weights in the `.onnx.data` sidecar (False: embedded).")
    export_params: StrictBool = Field(default=True, description="False: strip the weights (they are supplied at runtime).")
    keep_initializers_as_inputs: StrictBool = Field(default=False, description="List the weights as graph inputs too.")
    layout: Literal["upstream", "transformers.js"] = Field(
        default="upstream",
        description="'transformers.js': write onnx/model.onnx (past_key_values.{i}.key/value inputs, present.{i}.* "
        "outputs) with model.onnx_data and the config files, so transformers.js can load the target folder.",
    )

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
            raise _PathValueError(("ort_fusions",), "ort_fusions requires optimize: true")
        return self

    @model_validator(mode="after")
    def _transformers_js_layout(self) -> OnnxTarget:
        if self.layout != "transformers.js":
            return self
        if self.merged is False:
            raise _PathValueError(("merged",), "layout 'transformers.js' needs the merged graph (transformers.js runs "
                                               "one decoder graph): drop merged: false")
        if self.dtype == "bfloat16":
            raise _PathValueError(("dtype",), "transformers.js has no bfloat16 models: use dtype float32 or float16")
        for key, default in (("output_path", None), ("external_data", True), ("export_params", True),
                             ("keep_initializers_as_inputs", False)):
            if getattr(self, key) != default:
                raise _PathValueError((key,), f"{key} is not supported with layout 'transformers.js' yet: the layout "
                                              "writes onnx/model.onnx with model.onnx_data itself")
        return self


class ExecutorchTarget(_TargetBase):
    """An ExecuTorch program (`.pte`)."""

    export_format: Literal["executorch"]
    backend: Literal["xnnpack", "cuda", "mlx"] = "xnnpack"
    alloc_graph_input: StrictBool = True
    alloc_graph_output: StrictBool = True
    alloc_mutable_buffers: StrictBool = True


Target = Annotated[Union[DynamoTarget, OnnxTarget, ExecutorchTarget], Field(discriminator="export_format")]


class InputsSpec(_Strict):
    """How sample inputs are made: tokenized from `prompt` when the repo has a tokenizer, else synthesized."""

    batch_size: StrictInt = Field(default=1, ge=1, le=64)
    sequence_length: StrictInt = Field(default=8, ge=2, le=8192)
    prompt: str | None = None
    image_size: StrictInt | None = Field(default=None, ge=1, le=4096)
    audio_length: StrictInt | None = Field(default=None, ge=1, description="Audio frames (feature length) for speech models.")
    decoder_sequence_length: StrictInt = Field(default=4, ge=1, le=4096)
    seed: StrictInt = 0


class GenerationSpec(_Strict):
    """How `generate()` is captured for generation exports."""

    cache_implementation: Literal["dynamic", "static"] = "dynamic"
    max_cache_len: StrictInt | None = Field(default=None, ge=2)
    max_new_tokens: StrictInt = Field(default=8, ge=1, le=512, description="Tokens compared in the generation-parity check.")

    @model_validator(mode="after")
    def _static_needs_len(self) -> GenerationSpec:
        if self.max_cache_len is not None and self.cache_implementation != "static":
            raise _PathValueError(("max_cache_len",), "max_cache_len only applies with cache_implementation 'static'")
        return self


class ValidationSpec(_Strict):
    """Tolerances (global, then per format) and how hard to probe."""

    atol: StrictFloat | StrictInt | None = Field(default=None, ge=0)
    rtol: StrictFloat | StrictInt | None = Field(default=None, ge=0)
    formats: dict[Literal["dynamo", "onnx", "executorch"], Tolerance] = Field(default_factory=dict)
    probe_unseen_shapes: StrictBool = True
    max_probe_elements: StrictInt = Field(default=1_000_000, ge=1, description="Skip probes whose inputs are larger.")


class Recipe(_Strict):
    """A whole recipe, in its full form."""

    schema_version: Literal[1] = 1
    exports: list[Target] = Field(min_length=1)
    inputs: InputsSpec = Field(default_factory=InputsSpec)
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)

    @model_validator(mode="after")
    def _unique_names(self) -> Recipe:
        seen: dict[str, int] = {}
        for index, target in enumerate(self.exports):
            if target.name in seen:
                raise _PathValueError(
                    ("exports", index, "name"),
                    f"target name '{target.name}' is used twice (also by exports[{seen[target.name]}]); "
                    "give each target a unique 'name'",
                )
            seen[target.name] = index
        return self

    def target(self, name: str) -> DynamoTarget | OnnxTarget | ExecutorchTarget:
        """The target called `name`; `KeyError` listing the names otherwise."""
        for target in self.exports:
            if target.name == name:
                return target
        raise KeyError(f"no target named {name!r}; the recipe has {[t.name for t in self.exports]}")

    def sha256(self) -> str:
        """A stable hash of the normalised recipe (what publishing and caching key on)."""
        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()

    def target_sha256(self, name: str) -> str:
        """A stable hash of one target plus the recipe-wide settings it depends on."""
        data = self.model_dump(mode="json")
        data["exports"] = [t for t in data["exports"] if t["name"] == name]
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()


class _PathValueError(ValueError):
    """A validation error whose location is known better than pydantic's."""

    def __init__(self, path: JsonPath, message: str):
        self.path = path
        super().__init__(message)


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


# ── Loading ───────────────────────────────────────────────────────────────────


def _normalise(data: Any) -> tuple[dict[str, Any], JsonPath | None]:
    """The full form of `data`, and where its `exports` list lives in the original (None: a seed dict)."""
    if isinstance(data, list):
        return {"exports": data}, ()
    if isinstance(data, dict) and ("exports" in data or "schema_version" in data):
        return data, ("exports",)
    if isinstance(data, dict):
        return {"exports": [data]}, None
    raise RecipeError(
        f"a recipe is a JSON object or a list of objects, got {type(data).__name__}; "
        'start from {"export_format": "onnx"}'
    )


def _file_path(internal: JsonPath, exports_at: JsonPath | None) -> JsonPath:
    """Map a path in the normalised recipe back to the path in the file."""
    if internal[:1] != ("exports",):
        return internal
    if exports_at is None:  # seed dict: exports[0] is the whole document
        return tuple(internal[2:])
    return (*exports_at, *internal[1:])


def _known_fields() -> dict[str, set[str]]:
    """Field names per model, for did-you-mean."""
    models = [Recipe, InputsSpec, GenerationSpec, ValidationSpec, Tolerance, ComponentOverride, DimSpec]
    known = {m.__name__: set(m.model_fields) for m in models}
    for target in (DynamoTarget, OnnxTarget, ExecutorchTarget):
        known[target.__name__] = set(target.model_fields)
    return known


def _target_fields() -> dict[str, set[str]]:
    return {t.model_fields["export_format"].annotation.__args__[0]: set(t.model_fields) for t in
            (DynamoTarget, OnnxTarget, ExecutorchTarget)}


def _walk_data(data: Any, loc: tuple, kind: str) -> tuple[JsonPath, Any]:
    """Follow pydantic's `loc` through `data`, dropping the parts that name union branches rather than keys."""
    path: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
            path.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            path.append(part)
        elif kind == "missing" and isinstance(node, dict) and isinstance(part, str) and loc[-1] == part:
            path.append(part)  # a missing or unknown key: name it
            node = None
    return tuple(path), node


def _message(error: dict[str, Any], path: JsonPath, data: dict[str, Any]) -> str:
    kind = error["type"]
    key = path[-1] if path else None
    if kind == "extra_forbidden" and isinstance(key, str):
        return _unknown_key_message(key, path, data)
    if kind == "union_tag_invalid" and error.get("ctx", {}).get("discriminator") == "_kind_of()":
        expected = [_KIND_WORDS.get(tag.strip(" '"), tag) for tag in error["ctx"]["expected_tags"].split(",")]
        return f"expected {' or '.join(expected)}, got {json.dumps(error['input'])}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        given = error.get("input", {}).get("export_format") if isinstance(error.get("input"), dict) else None
        if given is None:
            return f"missing 'export_format'; use one of {list(FORMATS)}"
        close = difflib.get_close_matches(str(given), FORMATS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown export_format {given!r}; use one of {list(FORMATS)}{hint}"
    if kind == "missing":
        return f"missing required key '{key}'"
    message = error["msg"]
    message = message.removeprefix("Value error, ")
    return message


def _unknown_key_message(key: str, path: JsonPath, data: dict[str, Any]) -> str:
    parent_path = path[:-1]
    parent = data
    for part in parent_path:
        parent = parent[part]
    candidates: set[str] = set()
    for fields in _known_fields().values():
        candidates |= fields
    if isinstance(parent, dict) and isinstance(parent.get("export_format"), str):
        fmt = parent["export_format"]
        per_format = _target_fields()
        own = per_format.get(fmt, set())
        others = [f for f, fields in per_format.items() if key in fields and f != fmt]
        if others:
            return f"'{key}' is not a setting of {fmt!r} targets (only of {', '.join(repr(o) for o in others)})"
        candidates = own or candidates
    close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.6)
    close = close or sorted(c for c in candidates if c.startswith(key) or key in c)[:1]
    if close and close[0] == key:
        allowed = _allowed_here(parent_path)
        return f"'{key}' is not allowed here" + (f"; allowed keys: {', '.join(sorted(allowed))}" if allowed else "")
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{key}'{hint}"


def _allowed_here(parent_path: JsonPath) -> set[str]:
    """The keys allowed in the object at `parent_path` of the normalised recipe, when it is a known place."""
    if len(parent_path) >= 2 and parent_path[-2] == "components":
        return set(ComponentOverride.model_fields)
    return set()


def parse_recipe_data(
    data: Any, *, lines: dict[JsonPath, int] | None = None, file: str | None = None, prefix: JsonPath = ()
) -> Recipe:
    """Validate already-parsed recipe `data` (any of the three forms) into a [`Recipe`].

    `lines` maps JSON paths (relative to the file, including `prefix`) to lines; `prefix` is where the recipe sits in
    the file (`("export_config",)` inside `config.json`).
    """
    lines = lines or {}
    try:
        full, exports_at = _normalise(data)
    except RecipeError as err:
        raise RecipeError(err.message, path=format_path(prefix), line=nearest_line(lines, prefix) or 1,
                          file=file) from None
    try:
        return Recipe.model_validate(full)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            loc = tuple(error["loc"])
            ctx_error = error.get("ctx", {}).get("error")
            if isinstance(ctx_error, _PathValueError):
                base, _ = _walk_data(full, loc, error["type"])
                internal, message = (*base, *ctx_error.path), str(ctx_error)
            else:
                internal, _ = _walk_data(full, loc, error["type"])
                message = _message(error, internal, full)
                if error["type"] in ("union_tag_invalid", "union_tag_not_found") and "export_format" in message:
                    internal = (*internal, "export_format")
            path = (*prefix, *_file_path(internal, exports_at))
            problems.append((format_path(path), nearest_line(lines, path), message))
        first_path, first_line, first_message = problems[0]
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        error = RecipeError(first_message + more, path=first_path, line=first_line, file=file)
        error.problems = problems  # type: ignore[attr-defined]
        raise error from None


def parse_recipe(text: str, *, file: str | None = None) -> Recipe:
    """Parse recipe JSON text (any of the three forms)."""
    try:
        data, lines = parse_with_positions(text)
    except JsonPositionError as err:
        raise RecipeError(f"not valid JSON: {err}", path="$", line=err.line, file=file) from None
    return parse_recipe_data(data, lines=lines, file=file)


def load_recipe_file(path: str | Path) -> Recipe:
    """Load an `export_config.json`, or a `config.json` holding an `export_config` field.

    Example:
        >>> recipe = load_recipe_file("examples/demo-model/export_config.json")  # doctest: +SKIP
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {path}", file=str(path)) from None
    except UnicodeDecodeError:
        raise RecipeError("recipe file is not UTF-8 text", file=str(path)) from None
    if path.name == "config.json":
        try:
            data, lines = parse_with_positions(text)
        except JsonPositionError as err:
            raise RecipeError(f"not valid JSON: {err}", line=err.line, file=str(path)) from None
        if not isinstance(data, dict) or CONFIG_FIELD not in data:
            raise RecipeError(f"config.json has no '{CONFIG_FIELD}' field", file=str(path))
        return parse_recipe_data(data[CONFIG_FIELD], lines=lines, file=str(path), prefix=(CONFIG_FIELD,))
    return parse_recipe(text, file=str(path))


def find_recipe(folder: str | Path) -> tuple[Recipe, Path, list[str]] | None:
    """The recipe of a model folder: `export_config.json`, else `config.json`'s `export_config`.

    Returns `(recipe, file, warnings)`, or None when the folder declares no recipe. When both exist the file wins,
    with a warning.
    """
    folder = Path(folder)
    recipe_file, config_file = folder / RECIPE_FILE, folder / "config.json"
    in_config = False
    if config_file.is_file():
        try:
            in_config = CONFIG_FIELD in json.loads(config_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            in_config = False
    warnings: list[str] = []
    if recipe_file.is_file():
        if in_config:
            warnings.append(
                f"both {RECIPE_FILE} and config.json's '{CONFIG_FIELD}' exist: using {RECIPE_FILE} "
                f"(remove one to silence this)"
            )
        return load_recipe_file(recipe_file), recipe_file, warnings
    if in_config:
        return load_recipe_file(config_file), config_file, warnings
    return None


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of the full form (committed as `exporters/export_config.schema.json`)."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://github.com/hf/export-action/exporters/export_config.schema.json"
    schema["title"] = "export-action recipe (export_config.json, full form)"
    return schema


SCHEMA_PATH = Path(__file__).with_name("export_config.schema.json")


def write_schema(path: Path = SCHEMA_PATH) -> None:
    """Regenerate the committed JSON Schema."""
    path.write_text(json.dumps(recipe_json_schema(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_schema()
