"""The seed API, completed: `AutoHfExporter.from_pretrained` and `supports_export_format`, and
`AutoExportConfig.from_dict` accepting the seed's fields.

Example:
    >>> exporter = AutoHfExporter.from_pretrained("org/model-name")  # doctest: +SKIP
    >>> program = exporter.export(model, inputs)  # the owner's settings, in one call  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

from torch.export import Dim

from exporters import upstream
from exporters.capture import merged
from exporters.capture.cache_settings import check_second_step
from exporters.capture.components import cache_setting_for, decompose
from exporters.capture.inputs import detect_family
from exporters.capture.shapes import DimTable, axis_specs, build_dynamic_shapes
from exporters.errors import RecipeError
from exporters.export import convert as engine
from exporters.files import RECIPE_FILE, RECIPE_SOURCES
from exporters.recipe.load import find_recipe, missing_recipe, parse_recipe_data
from exporters.recipe.model import Recipe
from exporters.upstream import EXPORT_BACKENDS


class RecipeExporter:
    """An exporter bound to one target of an owner's recipe: `export` and `export_for_generation` apply the
    owner's settings (format, dynamic-shape contract, strict, opset, backend, ...) in one call."""

    def __init__(self, recipe: Recipe, target_name: str | None = None, source: str | None = None):
        self.recipe = recipe
        self.target = recipe.target(target_name) if target_name else recipe.exports[0]
        self.source = source
        self.exporter = upstream.exporter_class(self.target.export_format)()

    def __repr__(self) -> str:
        return f"RecipeExporter(target={self.target.name!r}, format={self.target.export_format!r}, source={self.source!r})"

    @property
    def export_format(self) -> str:
        return self.target.export_format

    def config_for(self, inputs: dict[str, Any], component: str = "model"):
        """The upstream config for these forward `inputs` (JSON dynamic shapes turned into `Dim`s)."""
        shapes, _ = build_dynamic_shapes(self.target.shape_spec(component), inputs)
        return engine.upstream_config(self.target, self.target.components.get(component), shapes)

    def export(self, model, inputs: dict[str, Any]):
        """Export one graph with the recipe's settings; an upstream `ExportedModel`."""
        return self.exporter.export(model, copy.deepcopy(inputs), self.config_for(inputs))

    def export_for_generation(self, model, inputs: dict[str, Any], *, multi_token_decode: bool | None = None):
        """Export the generation components (prefill/decode, multimodal parts) with the recipe's settings; a merged
        target (`"merged": true`, or the dynamo and ONNX default) is one graph, `model`."""
        target = self.target.model_copy(update={"mode": "generation"}, deep=True)
        if multi_token_decode is not None:
            target.multi_token_decode = multi_token_decode
        setting = cache_setting_for(model, target, self.recipe)
        asked = target.merged
        target.merged = merged.planned_merged(target, detect_family(model), setting.implementation, model.config)
        components = decompose(model, "generation", {}, inputs, setting=setting,
                                      multi_token_decode=bool(target.multi_token_decode or target.merged))
        if target.merged and asked is None and not merged.takes_cache(components):  # a default it cannot have
            target.merged = False
            components = decompose(model, "generation", {}, inputs, setting=setting,
                                   multi_token_decode=target.multi_token_decode)
        if target.merged:
            components = merged.plan(target, components)
        check_second_step(target, components, setting)
        return engine.export_components(model, target, components, self.recipe, [])


def _read_remote_recipe(repo_id: str, revision: str | None, token: str | None, endpoint: str | None):
    """Download only the recipe (or config.json) of a Hub repo."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    folder: Path | None = None
    for name in RECIPE_SOURCES:
        try:
            path = hf_hub_download(repo_id, name, revision=revision, token=token, endpoint=endpoint)
            folder = Path(path).parent
        except EntryNotFoundError:
            continue
    if folder is None:
        raise RecipeError(f"{repo_id} has neither {RECIPE_FILE} nor config.json")
    return folder


class AutoHfExporter(upstream.UpstreamAutoHfExporter):
    """Upstream's auto exporter, plus the recipe workflow it sketched."""

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        revision: str | None = None,
        token: str | None = None,
        target: str | None = None,
        endpoint: str | None = None,
    ) -> RecipeExporter:
        """An exporter bound to the owner's recipe in a local folder or Hub repo (`export_config.json`, or
        `config.json`'s `export_config`). `target` picks a target by name (default: the first).

        Example:
            >>> exporter = AutoHfExporter.from_pretrained("examples/demo-model", target="onnx")  # doctest: +SKIP
            >>> exporter.export(model, {"input_ids": ids}).save_pretrained("out")  # doctest: +SKIP
        """
        location = Path(pretrained_model_name_or_path)
        folder = location if location.is_dir() else _read_remote_recipe(
            str(pretrained_model_name_or_path), revision, token, endpoint
        )
        found = find_recipe(folder)
        if found is None:
            raise missing_recipe(str(pretrained_model_name_or_path))
        recipe, _, notes = found
        for note in notes:
            warnings.warn(note, stacklevel=2)
        try:
            return RecipeExporter(recipe, target, source=str(pretrained_model_name_or_path))
        except KeyError as err:
            raise RecipeError(str(err.args[0])) from None

    @classmethod
    def supports_export_format(cls, export_config_dict: dict) -> bool:
        """True when the dict's `export_format` has both a registered config class and a registered exporter.
        Warns with what to do when the format is missing, unknown, or only half-registered.

        Example:
            >>> AutoHfExporter.supports_export_format({"export_format": "onnx"})
            True
        """
        if not isinstance(export_config_dict, dict) or "export_format" not in export_config_dict:
            warnings.warn(
                f"The config has no 'export_format': add one of {sorted(EXPORT_BACKENDS)}.", UserWarning, stacklevel=2
            )
            return False
        export_format = export_config_dict["export_format"]
        backend = EXPORT_BACKENDS.get(str(export_format))
        if backend is None:
            import difflib

            close = difflib.get_close_matches(str(export_format), sorted(EXPORT_BACKENDS), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            warnings.warn(
                f"Unknown export_format {export_format!r}: registered formats are {sorted(EXPORT_BACKENDS)}.{hint} "
                "A new backend registers with transformers.exporters.register_backend.",
                UserWarning, stacklevel=2,
            )
            return False
        missing = [part for part in ("config", "exporter") if getattr(backend, part, None) is None]
        if missing:
            warnings.warn(
                f"export_format {export_format!r} is only half-registered (no {' and no '.join(missing)} class): "
                "register both with transformers.exporters.register_backend.",
                UserWarning, stacklevel=2,
            )
            return False
        try:
            upstream.exporter_class(str(export_format))
        except ImportError as err:
            warnings.warn(
                f"export_format {export_format!r} is registered but its exporter cannot be imported ({err}): "
                "install its packages (see constraints.txt).", UserWarning, stacklevel=2,
            )
            return False
        return True


class AutoExportConfig(upstream.UpstreamAutoExportConfig):
    """Upstream's config factory, accepting the seed's fields (validated like a recipe)."""

    @classmethod
    def from_dict(cls, export_config_dict: dict):
        """The upstream config for a seed dict; `RecipeError` with the JSON path for an invalid one.

        Example:
            >>> AutoExportConfig.from_dict({"export_format": "onnx", "opset_version": 18}).opset_version
            18
        """
        recipe = parse_recipe_data(dict(export_config_dict))
        target = recipe.exports[0]
        shapes = None
        if target.dynamic_shapes:
            shapes = {}
            table = DimTable()  # one table for every key: a name used on two inputs is one dimension
            for key, spec in target.dynamic_shapes.items():
                if "." in key or "*" in key:
                    raise RecipeError(
                        "a leaf path in dynamic_shapes needs the model's inputs to resolve: use "
                        "AutoHfExporter.from_pretrained(...).config_for(inputs)",
                        path=f"$.dynamic_shapes.{key}",
                    )
                items = axis_specs(spec, len(spec) if isinstance(spec, list) else 1 + max(
                    (int(a) for a in spec), default=0), key) if spec != "auto" else {}
                shapes[key] = {
                    axis: Dim.AUTO if value == "auto" else table.get(value)
                    for axis, value in items.items() if value != "static"
                }
        return engine.upstream_config(target, None, shapes)
