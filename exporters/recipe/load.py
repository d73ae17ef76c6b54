"""Reading a recipe: the three forms, normalised to one [`Recipe`], from text, a file or a model folder.

- the seed form: one upstream config dict, `{"export_format": "onnx", "dynamic": true, ...}`;
- a list of such dicts;
- the full form: `{"schema_version": 1, "exports": [...], "inputs": {...}, "generation": {...}, "validation": {...}}`.

Every problem raises [`RecipeError`] naming the JSON path and line, with a did-you-mean for unknown keys; its
`problems` lists every one found.

Example:
    >>> recipe = parse_recipe('{"export_format": "onnx", "opset_version": 18}')
    >>> [(t.name, t.export_format) for t in recipe.exports]
    [('onnx', 'onnx')]
    >>> parse_recipe('{"export_format": "onnx", "opset": 18}')
    Traceback (most recent call last):
    ...
    exporters.errors.RecipeError: $.opset (line 1): unknown key 'opset'; did you mean 'opset_version'?
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from exporters.errors import RecipeError, RecipeProblem
from exporters.files import CONFIG_FILE, RECIPE_FILE
from exporters.recipe._base import KIND_WORDS, PathValueError, file_path
from exporters.recipe.dims import DimSpec
from exporters.recipe.jsonpos import JsonPath, JsonPositionError, format_path, nearest_line, parse_with_positions
from exporters.recipe.model import (
    CONFIG_FIELD,
    FORMATS,
    ComponentOverride,
    DynamoTarget,
    ExecutorchTarget,
    GenerationSpec,
    InputsSpec,
    OnnxTarget,
    Recipe,
    RecipeSource,
    ValidationSpec,
)
from exporters.recipe.budgets import TargetValidation
from exporters.recipe.variants import METHODS, CalibrationSpec, method_message

# A recipe file larger than this is refused before it is parsed (docs/recipe.md, "Limits").
MAX_RECIPE_BYTES = 8 << 20


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



def _known_fields() -> dict[str, set[str]]:
    """Field names per model, for did-you-mean."""
    models = [Recipe, InputsSpec, GenerationSpec, ValidationSpec, TargetValidation, ComponentOverride, DimSpec,
              CalibrationSpec, *METHODS.values()]
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
        expected = [KIND_WORDS.get(tag.strip(" '"), tag) for tag in error["ctx"]["expected_tags"].split(",")]
        return f"expected {' or '.join(expected)}, got {json.dumps(error['input'])}"
    if kind in ("union_tag_invalid", "union_tag_not_found") and error.get("ctx", {}).get("discriminator") == "'method'":
        return method_message(error)
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
    if kind in ("too_long", "string_too_long", "less_than_equal"):
        message += " (the recipe's limits: docs/recipe.md, \"Limits\")"
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
        recipe = Recipe.model_validate(full)
    except ValidationError as err:
        problems: list[RecipeProblem] = []
        for error in err.errors():
            loc = tuple(error["loc"])
            ctx_error = error.get("ctx", {}).get("error")
            if isinstance(ctx_error, PathValueError):
                base, _ = _walk_data(full, loc, error["type"])
                internal, message = (*base, *ctx_error.path), str(ctx_error)
            else:
                internal, _ = _walk_data(full, loc, error["type"])
                message = _message(error, internal, full)
                if error["type"] in ("union_tag_invalid", "union_tag_not_found") and "export_format" in message:
                    internal = (*internal, "export_format")
                elif error.get("ctx", {}).get("discriminator") == "'method'":
                    internal = (*internal, "method")
            path = (*prefix, *file_path(internal, exports_at))
            problems.append(RecipeProblem(format_path(path), nearest_line(lines, path), message))
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        raise RecipeError(first.message + more, path=first.path, line=first.line, file=file,
                          problems=problems) from None
    recipe._source = RecipeSource(file=file, lines=dict(lines), prefix=tuple(prefix), exports_at=exports_at)
    return recipe


def parse_recipe(text: str, *, file: str | None = None) -> Recipe:
    """Parse recipe JSON text (any of the three forms)."""
    try:
        data, lines = parse_with_positions(text)
    except JsonPositionError as err:
        raise RecipeError(f"not valid JSON: {err.message}", path="$", line=err.line, file=file) from None
    return parse_recipe_data(data, lines=lines, file=file)


def load_recipe_file(path: str | Path) -> Recipe:
    """Load an `export_config.json`, or a `config.json` holding an `export_config` field.

    Example:
        >>> recipe = load_recipe_file("examples/demo-model/export_config.json")  # doctest: +SKIP
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise RecipeError(f"the recipe file is {size} bytes; a recipe is at most {MAX_RECIPE_BYTES} (the recipe's "
                              "limits: docs/recipe.md, \"Limits\")", file=str(path))
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {path}", file=str(path)) from None
    except UnicodeDecodeError:
        raise RecipeError("recipe file is not UTF-8 text", file=str(path)) from None
    if path.name == CONFIG_FILE:
        try:
            data, lines = parse_with_positions(text)
        except JsonPositionError as err:
            raise RecipeError(f"not valid JSON: {err.message}", line=err.line, file=str(path)) from None
        if not isinstance(data, dict) or CONFIG_FIELD not in data:
            raise RecipeError(f"config.json has no '{CONFIG_FIELD}' field", file=str(path))
        return parse_recipe_data(data[CONFIG_FIELD], lines=lines, file=str(path), prefix=(CONFIG_FIELD,))
    return parse_recipe(text, file=str(path))


def where_a_recipe_goes() -> str:
    """How a model repo declares its recipe, in the words every front end shows when it has none."""
    return f"add an {RECIPE_FILE} (see docs/recipe.md) or an '{CONFIG_FIELD}' field in {CONFIG_FILE}"


def missing_recipe(where: str, *, option: str | None = None) -> RecipeError:
    """The error for a model without a recipe (`option`: the option that can give one instead).

    Example:
        >>> str(missing_recipe("org/model"))
        "$: no export recipe in org/model: add an export_config.json (see docs/recipe.md) or an 'export_config' field in config.json"
    """
    alternative = f", or give a recipe file with `{option}`" if option else ""
    return RecipeError(f"no export recipe in {where}: {where_a_recipe_goes()}{alternative}", option=option)


def find_recipe(folder: str | Path) -> tuple[Recipe, Path, list[str]] | None:
    """The recipe of a model folder: `export_config.json`, else `config.json`'s `export_config`.

    Returns `(recipe, file, warnings)`, or None when the folder declares no recipe. When both exist the file wins,
    with a warning.
    """
    folder = Path(folder)
    recipe_file, config_file = folder / RECIPE_FILE, folder / CONFIG_FILE
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
