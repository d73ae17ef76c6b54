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
    (upstream's, plus the stages it leaves out: see `exporters.components`). A merged target takes upstream's
    multi-token decode from it (`exporters.merged.plan`)."""
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


def component_configs(target, components: Components, recipe: Recipe, notes: list[str]) -> dict[str, Any]:
    """The upstream config of every component (the recipe's JSON dynamic shapes turned into `Dim`s); a
    `ShapeSpecError` when a declared key matches no input of any component."""
    from .shapes import ShapeSpecError, build_dynamic_shapes

    configs = {}
    used_keys: set[str] = set()
    for name, (_, inputs) in components.items():
        shapes, used = build_dynamic_shapes(component_shape_spec(target, name), inputs, notes)
        used_keys |= used
        configs[name] = upstream_config(target, target.components.get(name), shapes)
    unused = set(target.dynamic_shapes or {}) - used_keys
    if unused:
        raise ShapeSpecError(
            f"dynamic_shapes keys {sorted(unused)} match no input of components {list(components)}; the inputs are "
            f"{sorted({path for _, inputs in components.values() for path in _input_paths(inputs)})}"
        )
    return configs


def _export_one(exporter, name: str, module, inputs: dict, config):
    try:
        return exporter.export(module, copy.deepcopy(inputs), config).components["model"]
    except Exception as err:
        raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}{_hint(err, config)}") from err


def export_components(model, target, components: Components, recipe: Recipe, notes: list[str]):
    """Export each component with the target's settings, in memory; an upstream `ExportedModel` holding all of them
    (the library API; the pipeline writes each component to disk as soon as it is exported: [`export_to`])."""
    from transformers.exporters import ExportedModel

    exporter = exporter_class(target.export_format)()
    configs = component_configs(target, components, recipe, notes)
    exported = {name: _export_one(exporter, name, module, inputs, configs[name])
                for name, (module, inputs) in components.items()}
    generation_config = generation_config_for(model, recipe) if target.mode == "generation" else None
    return ExportedModel(exported, target.export_format, config=model.config, generation_config=generation_config)


def export_to(model, target, components: Components, recipe: Recipe, directory: Path, notes: list[str]) -> dict:
    """Export every component and write the target to `directory`, holding one exported program at a time, with
    the weights stored once: an ExecuTorch target is one `.pte` with a method per component, the components of an
    ONNX target share one external-data file, a `transformers.js` layout is rewritten in place.

    Returns `{"components", "export_only_s", "save_s"}`."""
    import gc
    import time

    from transformers.exporters import ExportedModel

    from . import onnx_files

    exporter = exporter_class(target.export_format)()
    configs = component_configs(target, components, recipe, notes)
    generation_config = generation_config_for(model, recipe) if target.mode == "generation" else None
    timings = {"export_only_s": 0.0, "save_s": 0.0}
    if target.export_format == "executorch" and len(components) > 1:
        from .et_program import export_methods, save_methods

        started = time.time()
        program, metadata = export_methods(exporter, components, configs)
        timings["export_only_s"] = time.time() - started
        started = time.time()
        save_methods(program, metadata, directory, model.config, generation_config)
        timings["save_s"] = time.time() - started
    else:
        entries: dict[str, Any] = {}
        for name, (module, inputs) in components.items():
            started = time.time()
            component = _export_one(exporter, name, module, inputs, configs[name])
            timings["export_only_s"] += time.time() - started
            started = time.time()
            ExportedModel({name: component}, target.export_format, config=model.config,
                          generation_config=generation_config).save_pretrained(directory)
            entries.update(read_manifest(directory)["components"])
            del component  # the next component is exported with this one's program released
            gc.collect()
            timings["save_s"] += time.time() - started
        started = time.time()
        manifest = read_manifest(directory)
        manifest["components"] = entries
        write_manifest(directory, manifest)
        if target.export_format == "onnx":
            onnx_files.apply_onnx_file_options(target, directory)
            if len(entries) > 1 and target.external_data:
                onnx_files.share_external_data(directory)
            if getattr(target, "layout", "upstream") == "transformers.js":
                from .tjs_layout import write_transformers_js

                write_transformers_js(directory, target, model)
        timings["save_s"] += time.time() - started
    return {"components": list(components), **{k: round(v, 3) for k, v in timings.items()}}


MANIFEST_FILE = "export.json"


def read_manifest(directory: Path) -> dict[str, Any]:
    """A saved export's `export.json` (upstream's manifest: `export_format`, and `components` naming each one's file
    and metadata)."""
    import json

    return json.loads((Path(directory) / MANIFEST_FILE).read_text(encoding="utf-8"))


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    import json

    (Path(directory) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


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
    """Write an in-memory export with upstream `save_pretrained`, then apply the seed's ONNX file options."""
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
    """Load a saved export with upstream `ExportedModel.from_pretrained`, or, for the layouts it does not read, with
    upstream's program loaders and runners: an ExecuTorch program with one method per component
    (`exporters.et_program`), a `transformers.js` folder (`exporters.tjs_layout`).

    `.pt2` programs are pickles that run code when loaded: they load only when this run produced them
    (`produced_by_this_run`, or the operator passed --trust-remote-code for artifacts made elsewhere).
    """
    from transformers.exporters import ExportedModel

    manifest = read_manifest(directory)
    if any("method" in entry for entry in manifest["components"].values()):
        from .et_program import load_methods

        return load_methods(Path(directory), manifest)
    if manifest.get("layout") == "transformers.js":
        from .tjs_layout import load_transformers_js

        return load_transformers_js(Path(directory), manifest, device)
    runner_kwargs = {"session_options": lean_session_options()} if manifest["export_format"] == "onnx" else {}
    with quiet_torch_serde():
        return ExportedModel.from_pretrained(
            directory, device=device, trust_remote_code=produced_by_this_run,  # own artifact, or operator-allowed
            **runner_kwargs,
        )


def lean_session_options():
    """ONNX Runtime options for validation sessions: weights read in place from the external-data file instead of
    repacked into a second copy (`session.disable_prepacking`), no memory arena kept at its high-water mark. A
    session then costs the graph's activations, not another copy of the model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    return options
