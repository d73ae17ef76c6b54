"""Exporting: a target's upstream config, the decomposition into components, the export of each, the save.

Upstream is reached through `exporters.upstream` only.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
from pathlib import Path
from typing import Any, Callable

import torch

from . import upstream
from .errors import ShapeSpecError
from .recipe import ComponentOverride, Recipe

Components = dict[str, tuple[torch.nn.Module, dict[str, Any]]]


def upstream_config(target, override: ComponentOverride | None = None, dynamic_shapes: Any = None,
                    quantizer: Any = None):
    """The upstream config object for a target (and a component's overrides), with the quantizer `exporters.quantize`
    built for it (the recipe's `quantize` is a method name, not an upstream field)."""
    config_class = upstream.config_class(target.export_format)
    names = {f.name for f in dataclasses.fields(config_class)} - {"quantizer", "export_format"}
    values = {name: getattr(target, name) for name in names if hasattr(target, name)}
    if override is not None:
        for name in ("dynamic", "strict", "prefer_deferred_runtime_asserts_over_guards"):
            if getattr(override, name) is not None:
                values[name] = getattr(override, name)
    values["dynamic_shapes"] = dynamic_shapes
    if quantizer is not None:
        values["quantizer"] = quantizer
    return config_class(**values)


def component_shape_spec(target, component: str) -> dict[str, Any] | None:
    override = target.components.get(component)
    if override is not None and override.dynamic_shapes is not None:
        return override.dynamic_shapes
    return target.dynamic_shapes


def spec_locator(recipe: Recipe, target, component: str):
    """Where a dynamic-shape key of `component` is written in the recipe file: `key -> (JSON path, line)`."""
    override = target.components.get(component)
    inside = ("components", component) if override is not None and override.dynamic_shapes is not None else ()

    def locate(key: str) -> tuple[str, int | None]:
        return recipe.locate(target.name, *inside, "dynamic_shapes", key)

    return locate


def cache_setting_for(model, target, recipe: Recipe):
    """The cache `target` is captured, exported and checked with (`exporters.cache_settings`)."""
    from .cache_settings import cache_setting, max_positions

    return cache_setting(target, recipe, max_positions(model.config))


def generation_config_for(model, setting):
    """The generation config the capture runs with: the model's own, greedy, with the target's cache setting."""
    return setting.apply(model.generation_config)


def decompose(model, mode: str, forward_inputs: dict, generate_inputs: dict, *, setting,
              multi_token_decode: bool, family: str | None = None) -> Components:
    """`{component: (module, forward kwargs)}`: one `model` graph, or the complete set of generation components
    (upstream's, plus the stages it leaves out: see `exporters.components`)."""
    if mode == "model":
        return {"model": (model, copy.deepcopy(forward_inputs))}
    from .components import complete_components
    from .inputs import detect_family

    generation_config = generation_config_for(model, setting)
    with torch.no_grad():
        components = upstream.decompose_for_generation(
            model,
            copy.deepcopy(generate_inputs),
            generation_config=generation_config,
            multi_token_decode=multi_token_decode,
        )
    return complete_components(model, components, generate_inputs, family or detect_family(model), generation_config,
                               multi_token_decode)


def export_components(model, target, components: Components, recipe: Recipe, notes: list[str],
                      quantizer_for: Callable[[str, dict[str, Any]], Any] | None = None):
    """Export each component with the target's settings; an upstream `ExportedModel` holding all of them.
    `quantizer_for(component, inputs)`: the upstream quantizer of a quantized target's component."""
    from .shapes import build_dynamic_shapes

    exporter = upstream.exporter_class(target.export_format)()
    exported = {}
    used_keys: set[str] = set()
    for name, (module, inputs) in components.items():
        spec = component_shape_spec(target, name)
        shapes, used = build_dynamic_shapes(spec, inputs, notes, locate=spec_locator(recipe, target, name))
        used_keys |= used
        quantizer = quantizer_for(name, inputs) if quantizer_for is not None else None
        config = upstream_config(target, target.components.get(name), shapes, quantizer)
        lowering = contextlib.nullcontext()
        if quantizer is not None and target.export_format == "executorch":
            lowering = upstream.xnnpack_dynamic_quant_partitioners()
        try:
            with lowering:
                single = exporter.export(module, copy.deepcopy(inputs), config)
        except Exception as err:
            raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}{_hint(err, config)}") from err
        exported[name] = single.components["model"]
    declared = set(target.dynamic_shapes or {})
    unused = declared - used_keys
    if unused:
        path, line = recipe.locate(target.name, "dynamic_shapes", sorted(unused)[0])
        raise ShapeSpecError(
            f"dynamic_shapes keys {sorted(unused)} match no input of components {list(components)}; the inputs are "
            f"{sorted({path for _, inputs in components.values() for path in _input_paths(inputs)})}",
            path=path, line=line,
        )
    setting = cache_setting_for(model, target, recipe)
    generation_config = generation_config_for(model, setting) if target.mode == "generation" else None
    return upstream.ExportedModel(exported, target.export_format, config=model.config, generation_config=generation_config)


def _hint(err: Exception, config) -> str:
    """What to change in the recipe for the failures users hit most."""
    text = str(err)
    fixed = re.findall(r"^\s+(\w+) = (\d+)$", text, re.M) if "specialized it to be a constant" in text else []
    if fixed:
        names = ", ".join(f"'{name}' to {value}" for name, value in fixed)
        return (f"\nhint: the model's code fixes {names}: that axis cannot be dynamic in this model; declare it "
                "'static' (or the model's fixed size) in the recipe")
    if "Constraints violated" in text and not config.prefer_deferred_runtime_asserts_over_guards:
        return (
            "\nhint: with explicit {name, min, max} dims most LLMs need "
            "'prefer_deferred_runtime_asserts_over_guards': true in the target"
        )
    if "Constraints violated" in text:
        return "\nhint: the declared range does not hold for the model; narrow min/max, or mark the axis 'auto'"
    return ""


def _input_paths(inputs: dict) -> list[str]:
    return list(upstream.leaf_tensors(inputs))


def save_exported(exported, target, directory: Path) -> None:
    """Write the export with upstream `save_pretrained`, then apply the seed's ONNX file options."""
    exported.save_pretrained(directory)
    if target.export_format == "onnx":
        from .onnx_files import apply_onnx_file_options

        apply_onnx_file_options(target, directory)
