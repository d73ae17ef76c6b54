"""The one adapter to upstream `transformers.exporters`: configs, decomposition, export, save and load.

Upstream is experimental and changes between releases; everything this project needs from it goes through here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from .recipe import ComponentOverride, Recipe

Components = dict[str, tuple[torch.nn.Module, dict[str, Any]]]


def exporter_class(export_format: str):
    from transformers.exporters.auto import get_exporter_class

    return get_exporter_class(export_format)


def upstream_config(target, override: ComponentOverride | None = None, dynamic_shapes: Any = None):
    """The upstream config object for a target (and a component's overrides)."""
    config_class = exporter_class(target.export_format).config_class
    names = {f.name for f in dataclasses.fields(config_class)} - {"quantizer", "export_format"}
    values = {name: getattr(target, name) for name in names if hasattr(target, name)}
    if override is not None:
        for name in ("dynamic", "strict", "prefer_deferred_runtime_asserts_over_guards"):
            if getattr(override, name) is not None:
                values[name] = getattr(override, name)
    values["dynamic_shapes"] = dynamic_shapes
    return config_class(**values)


def component_shape_spec(target, component: str) -> dict[str, Any] | None:
    override = target.components.get(component)
    if override is not None and override.dynamic_shapes is not None:
        return override.dynamic_shapes
    return target.dynamic_shapes


def generation_config_for(model, recipe: Recipe):
    """The generation config the capture runs with (the model's own, with the recipe's cache settings)."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample = False
    if recipe.generation.cache_implementation == "static":
        config.cache_implementation = "static"
        if recipe.generation.max_cache_len is not None:
            config.max_cache_len = recipe.generation.max_cache_len
    return config


def decompose(model, mode: str, forward_inputs: dict, generate_inputs: dict, *, recipe: Recipe,
              multi_token_decode: bool, family: str | None = None) -> Components:
    """`{component: (module, forward kwargs)}`: one `model` graph, or the complete set of generation components
    (upstream's, plus the stages it leaves out: see `exporters.components`)."""
    if mode == "model":
        return {"model": (model, copy.deepcopy(forward_inputs))}
    from transformers.exporters.utils import decompose_for_generation

    from .components import complete_components
    from .inputs import detect_family

    generation_config = generation_config_for(model, recipe)
    with torch.no_grad():
        components = decompose_for_generation(
            model,
            copy.deepcopy(generate_inputs),
            generation_config=generation_config,
            multi_token_decode=multi_token_decode,
        )
    return complete_components(model, components, generate_inputs, family or detect_family(model), generation_config,
                               multi_token_decode)


def export_components(model, target, components: Components, recipe: Recipe, notes: list[str]):
    """Export each component with the target's settings; an upstream `ExportedModel` holding all of them."""
    from transformers.exporters import ExportedModel

    from .shapes import ShapeSpecError, build_dynamic_shapes

    exporter = exporter_class(target.export_format)()
    exported = {}
    used_keys: set[str] = set()
    for name, (module, inputs) in components.items():
        spec = component_shape_spec(target, name)
        shapes, used = build_dynamic_shapes(spec, inputs, notes)
        used_keys |= used
        config = upstream_config(target, target.components.get(name), shapes)
        try:
            single = exporter.export(module, copy.deepcopy(inputs), config)
        except Exception as err:
            raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}{_hint(err, config)}") from err
        exported[name] = single.components["model"]
    declared = set(target.dynamic_shapes or {})
    unused = declared - used_keys
    if unused:
        raise ShapeSpecError(
            f"dynamic_shapes keys {sorted(unused)} match no input of components {list(components)}; the inputs are "
            f"{sorted({path for _, inputs in components.values() for path in _input_paths(inputs)})}"
        )
    generation_config = generation_config_for(model, recipe) if target.mode == "generation" else None
    return ExportedModel(exported, target.export_format, config=model.config, generation_config=generation_config)


def _hint(err: Exception, config) -> str:
    """What to change in the recipe for the failures users hit most."""
    text = str(err)
    if "Constraints violated" in text and not config.prefer_deferred_runtime_asserts_over_guards:
        return (
            "\nhint: with explicit {name, min, max} dims most LLMs need "
            "'prefer_deferred_runtime_asserts_over_guards': true in the target"
        )
    if "Constraints violated" in text:
        return "\nhint: the declared range does not hold for the model; narrow min/max, or mark the axis 'auto'"
    return ""


def _input_paths(inputs: dict) -> list[str]:
    from transformers.exporters.utils import get_leaf_tensors

    return list(get_leaf_tensors(inputs))


def save_exported(exported, target, directory: Path) -> None:
    """Write the export with upstream `save_pretrained`, then apply the seed's ONNX file options."""
    exported.save_pretrained(directory)
    if target.export_format == "onnx":
        from .onnx_files import apply_onnx_file_options

        apply_onnx_file_options(target, directory)


# torch 2.13's `.pt2` loader logs a warning whose format string has no placeholder for its argument: the logging
# call itself fails ("--- Logging error ---" on stderr, an exception under pytest). See docs/upstream-gaps.md.
TORCH_SERDE_LOGGER = "torch._export.serde.serialize"


@contextlib.contextmanager
def quiet_torch_serde():
    """Silence the broken warning of torch's `.pt2` deserializer while loading."""
    logger = logging.getLogger(TORCH_SERDE_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_exported(directory: Path, device: str | None = None, *, produced_by_this_run: bool = False):
    """Load a saved export with upstream `ExportedModel.from_pretrained`.

    `.pt2` programs are pickles that run code when loaded: they load only when this run produced them
    (`produced_by_this_run`, or the operator passed --trust-remote-code for artifacts made elsewhere).
    """
    from transformers.exporters import ExportedModel

    with quiet_torch_serde():
        return ExportedModel.from_pretrained(
            directory, device=device, trust_remote_code=produced_by_this_run  # own artifact, or operator-allowed
        )
