"""Exporting: a target's upstream config, the decomposition into components, the export of each, the save.

Upstream is reached through `exporters.upstream` only.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import re
import time
from pathlib import Path
from typing import Any, Callable

import torch

from exporters import upstream
from exporters.capture.asr_runner import is_asr
from exporters.capture.audio_text import fixed_audio_stage
from exporters.capture.cache_settings import sliding_window_of
from exporters.capture.components import GLUE_FILE, cache_setting_for, write_glue
from exporters.capture.token_ids import decoder_start_id, special_token_ids
from exporters.capture.llm_runner import DYNAMIC_PROMPT, METHODS_NOTE
from exporters.capture.multimodal_runner import MULTIMODAL_RUNNER
from exporters.capture.shapes import build_dynamic_shapes
from exporters.errors import ShapeSpecError, TargetPlanError
from exporters.export import onnx_files, shared_graphs
from exporters.export.folder_files import complete_folder, model_folder
from exporters.export.footprint import tied_embeddings
from exporters.export.llm_runner import export_runner
from exporters.export.multimodal_runner import export_multimodal_runner
from exporters.upstream.asr_runner import asr_metadata
from exporters.upstream import llm_runner
from exporters.export.onnx_files import apply_onnx_file_options
from exporters.export.trace_metadata import drop_trace_metadata
from exporters.export.onnx_names import rename_merged_graph, unnamed_inputs
from exporters.export.seq2seq_merged import merge_encoder_decoder
from exporters.export.seq2seq_names import fixed_past, is_encoder_decoder_export, rename_encoder_decoder
from exporters.recipe.layout import TRANSFORMERS_JS
from exporters.recipe.model import ComponentOverride, Recipe

Components = dict[str, tuple[torch.nn.Module, dict[str, Any]]]


def upstream_config(target, override: ComponentOverride | None = None, dynamic_shapes: Any = None,
                    quantizer: Any = None):
    """The upstream config object for a target (and a component's overrides), with the quantizer `exporters.export.quantize`
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


def spec_locator(recipe: Recipe, target, component: str):
    """Where a dynamic-shape key of `component` is written in the recipe file: `key -> (JSON path, line)`."""
    override = target.components.get(component)
    inside = ("components", component) if override is not None and override.dynamic_shapes is not None else ()

    def locate(key: str) -> tuple[str, int | None]:
        return recipe.locate(target.name, *inside, "dynamic_shapes", key)

    return locate


def component_configs(target, components: Components, recipe: Recipe, notes: list[str],
                      quantizer_for: Callable[[str, dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """The upstream config of every component (the recipe's JSON dynamic shapes turned into `Dim`s, the quantizer
    `quantizer_for(component, inputs)` gives a quantized target's component); a `ShapeSpecError` naming the recipe
    line when a declared key matches no input of any component."""

    configs = {}
    used_keys: set[str] = set()
    for name, (_, inputs) in components.items():
        spec = target.shape_spec(name)
        shapes, used = build_dynamic_shapes(spec, inputs, notes, locate=spec_locator(recipe, target, name))
        used_keys |= used
        quantizer = quantizer_for(name, inputs) if quantizer_for is not None else None
        configs[name] = upstream_config(target, target.components.get(name), shapes, quantizer)
        if spec is None and fixed_audio_stage(name, components) and getattr(configs[name], "dynamic", False):
            configs[name] = dataclasses.replace(configs[name], dynamic=False)  # the audio keeps its traced length
    unused = set(target.dynamic_shapes or {}) - used_keys
    if unused:
        path, line = recipe.locate(target.name, "dynamic_shapes", sorted(unused)[0])
        raise ShapeSpecError(
            f"dynamic_shapes keys {sorted(unused)} match no input of components {list(components)}; the inputs are "
            f"{sorted({path for _, inputs in components.values() for path in _input_paths(inputs)})}",
            path=path, line=line,
        )
    return configs


def _export_one(exporter, name: str, module, inputs: dict, config):
    try:
        component = exporter.export(module, copy.deepcopy(inputs), config).components["model"]
    except Exception as err:
        raise RuntimeError(f"exporting component '{name}' failed: {type(err).__name__}: {err}{_hint(err, config)}") from err
    drop_trace_metadata(component, exporter.export_format)  # the exporting machine's paths are not published
    return component


def _tracing(model, target, full_windows: bool = False) -> contextlib.ExitStack:
    """How a target is traced beyond upstream's defaults: upstream's patches of model code resolved only for the
    modeling modules that are loaded (`upstream.patches_of_loaded_models`), a layout proven contiguous not asked again
    by upstream's reshape patch (`upstream.contiguity_known_once`), symbolic size arithmetic done once per shape
    environment and state (`upstream.symbolic_arithmetic_once`), Granite Speech's audio encoder in sizes that stay
    symbolic in transformers.js's layout (`upstream.granite_speech_frames_dynamic`), and an ExecuTorch target in the
    ops its runtime has: mixture-of-experts layers in standard ops (`upstream.experts_without_custom_ops`), a whole-input
    `Conv3d` as a matmul (`upstream.patch_convolutions_as_matmul`), the argsort of a permutation as a scatter
    (`upstream.argsort_of_permutations`), a negative pad as a slice (`upstream.negative_padding_as_slices`), a
    `new_empty` as `new_zeros` (`upstream.new_empty_as_zeros`: its size may stay symbolic); `full_windows`: an ONNX
    generation graph on a full-length cache counts its sliding windows in tokens (`upstream.windows_counted_in_tokens`:
    GenAI's right-padded rows)."""
    stack = contextlib.ExitStack()
    stack.enter_context(upstream.patches_of_loaded_models())
    stack.enter_context(upstream.contiguity_known_once())
    stack.enter_context(upstream.symbolic_arithmetic_once())
    stack.enter_context(upstream.named_dims_share_symbols())
    if full_windows:
        stack.enter_context(upstream.windows_counted_in_tokens())
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type == "granite_speech" and getattr(target, "layout", None) == TRANSFORMERS_JS:  # any audio length
        stack.enter_context(upstream.granite_speech_frames_dynamic())
    if target.export_format == "executorch":
        stack.enter_context(upstream.experts_without_custom_ops(model))
        stack.enter_context(upstream.patch_convolutions_as_matmul())
        stack.enter_context(upstream.argsort_of_permutations(model))
        stack.enter_context(upstream.negative_padding_as_slices())
        if getattr(target, "layout", None) != "runner":  # the runner program skips the dim-order pass
            stack.enter_context(upstream.new_empty_as_zeros())
    return stack


def _lowering(target, configs: dict[str, Any]) -> contextlib.ExitStack:
    """How ExecuTorch programs are lowered beyond upstream's defaults: PT2E-quantized linears with XNNPACK's
    dynamically quantized partitioner first (`exporters.upstream.xnnpack_dynamic_quant_partitioners`), the
    tanh-approximated GELU left to the portable kernels (XNNPACK computes the exact one: docs/upstream-gaps.md #24),
    the upsample fusion only where a graph has an upsample (`exporters.upstream.xnnpack_lowering`), an operator's list
    result validated as one result (`exporters.upstream.list_results_validated_whole`: a MoE's prompt stays dynamic).
    An ONNX graph's optimizer removes only an exact `+ 0` or `* 1` (`exporters.upstream.exact_no_op_rewrites`: a norm
    keeps an epsilon of 1e-8) and tries its two-output pattern only where it can match (`multi_output_patterns_anchored`:
    upstream's matcher is quadratic in the graph's size) and every rule only where its root's op type is the node's
    (`rules_tried_where_their_root_can_match`: upstream tries every rule at every node) and leaves a tied table's
    transpose to the runtime
    (`shared_tables_kept_once`: stored once) and writes a folded transpose a block at a time
    (`transposed_weights_written_in_blocks`: numpy's writer walks it element by element), and torch.onnx's second
    trace is skipped where it would
    change nothing the translation needs (`exporters.upstream.decompose_only_what_onnx_lacks`), and its
    type-promotion pass reads the values the trace recorded (`exporters.upstream.type_promotion_on_traced_values`),
    and its registry of torchlib's functions is a copy of the one built before the fork
    (`exporters.upstream.torchlib_registry_built_once`).
    `ort_fusions: "cpu"` fuses `GroupQueryAttention` at any batch
    (`exporters.upstream.group_query_attention_at_any_batch`)."""
    stack = contextlib.ExitStack()
    if target.export_format == "onnx":
        stack.enter_context(upstream.exact_no_op_rewrites())
        stack.enter_context(upstream.multi_output_patterns_anchored())
        stack.enter_context(upstream.rules_tried_where_their_root_can_match())
        stack.enter_context(upstream.shared_tables_kept_once())
        stack.enter_context(upstream.transposed_weights_written_in_blocks())
        stack.enter_context(upstream.decompose_only_what_onnx_lacks())
        stack.enter_context(upstream.type_promotion_on_traced_values())
        stack.enter_context(upstream.torchlib_registry_built_once())
        stack.enter_context(upstream.group_query_attention_at_any_batch())
    if target.export_format == "executorch":
        stack.enter_context(upstream.xnnpack_lowering())
        stack.enter_context(upstream.list_results_validated_whole())
        if any(getattr(c, "quantizer", None) is not None for c in configs.values()):
            stack.enter_context(upstream.xnnpack_dynamic_quant_partitioners())
    return stack


def export_components(model, target, components: Components, recipe: Recipe, notes: list[str],
                      quantizer_for: Callable[[str, dict[str, Any]], Any] | None = None):
    """Export each component with the target's settings, in memory: an upstream `ExportedModel` holding all of them
    (the library API; the pipeline writes each component as soon as it is exported, [`export_to`])."""
    exporter = upstream.exporter_class(target.export_format)()
    configs = component_configs(target, components, recipe, notes, quantizer_for)
    with _tracing(model, target), _lowering(target, configs):
        exported = {name: _export_one(exporter, name, module, inputs, configs[name])
                    for name, (module, inputs) in components.items()}
    return upstream.ExportedModel(exported, target.export_format, config=model.config,
                                  generation_config=artifact_generation_config(model, target, recipe))


def export_to(model, target, components: Components, recipe: Recipe, directory: Path, notes: list[str],
              quantizer_for: Callable[[str, dict[str, Any]], Any] | None = None,
              source_dir: Path | None = None) -> dict:
    """Export every component and write the target to `directory`, one exported program in memory at a time and
    the weights stored once: an ExecuTorch target with several components is one `.pte` with a method each, the
    components of an ONNX target share one external-data file, a transformers.js layout is rewritten in place.

    Every target folder then holds the model's tokenizer and processor files (`folder_files.complete_folder`, from
    `source_dir`, the model's folder; by default the one the model was loaded from).

    Returns `{"components", "export_only_s", "save_s", "written", "copied"}`: the last two, the files the export
    wrote and those `complete_folder` copied (what a runtime proof may read: `exporters.validate.folder_trust`)."""
    if getattr(target, "layout", None) == "runner" and not is_asr(components):  # exporters.export.llm_runner
        with _tracing(model, target), _lowering_memory(target, directory):
            outcome = export_runner(model, target, components, recipe, directory, notes, quantizer_for)
    elif getattr(target, "layout", None) == MULTIMODAL_RUNNER:  # exporters.export.multimodal_runner
        with _tracing(model, target), _lowering_memory(target, directory):
            outcome = export_multimodal_runner(model, target, components, recipe, directory, notes, quantizer_for)
    else:
        exporter = upstream.exporter_class(target.export_format)()
        configs = component_configs(target, components, recipe, notes, quantizer_for)
        full_windows = target.export_format == "onnx" and cache_setting_for(model, target, recipe).full_windows
        with _tracing(model, target, full_windows), _lowering(target, configs), _lowering_memory(target, directory):
            outcome = _export_and_save(exporter, configs, model, target, components, recipe, directory, notes)
        glue = write_glue(model, components, directory)
        if glue:
            notes.append(f"{GLUE_FILE} holds {glue}: weights the model's forward reads itself between its graphs "
                         "(a runtime's glue code needs them too); parity reads them from this file")
    if target.export_format == "executorch" and target.mode == "generation" \
            and getattr(target, "layout", None) not in ("runner", MULTIMODAL_RUNNER):
        notes.append(methods_note(target, components))
        manifest = upstream.read_manifest(directory)  # how `hf-export validate` finds the prompt it was exported with
        upstream.write_manifest(directory, {**manifest, DYNAMIC_PROMPT: bool(target.dynamic)})
    written = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()
                     and not p.is_symlink())
    copied = complete_folder(directory, source_dir or model_folder(model), notes)  # the folder loads alone
    return {**outcome, "written": written, "copied": copied}


@contextlib.contextmanager
def _lowering_memory(target, directory: Path):
    """An ExecuTorch lowering that does not copy the weights per partition, and whose serialized weights wait on
    disk in the (staging) target folder until the program is written, removed before it is complete (#19,
    docs/upstream-gaps.md #20)."""
    if target.export_format != "executorch":
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with upstream.constants_shared_by_lowering_copies(), upstream.named_data_on_disk(directory):
        yield


def _export_and_save(exporter, configs: dict[str, Any], model, target, components: Components, recipe: Recipe,
                     directory: Path, notes: list[str] | None = None) -> dict:
    generation_config = artifact_generation_config(model, target, recipe)
    timings = {"export_only_s": 0.0, "save_s": 0.0}
    weights_file = EXECUTORCH_WEIGHTS if target.export_format == "executorch" and tied_embeddings(model) else None
    if target.export_format == "executorch" and (len(components) > 1 or weights_file):
        methods = {name: name if len(components) > 1 else "forward" for name in components}
        started = time.time()
        runner = _speech_metadata(model, target, recipe) if getattr(target, "layout", None) == "runner" else None
        # a table torchao quantized is fused into ExecuTorch's quantized embedding kernel only without padding_idx
        passes = [llm_runner.drop_embedding_padding_idx] if getattr(target.quantize, "method", None) == \
            "torchao-xnnpack" else None
        program, metadata = upstream.export_executorch_methods(exporter, components, configs, methods, weights_file,
                                                               runner, fusing=passes)
        timings["export_only_s"] = time.time() - started
        started = time.time()
        _save_methods(program, metadata, methods, directory, model.config, generation_config, weights_file, runner)
        timings["save_s"] = time.time() - started
        return {"components": list(components), **{k: round(v, 3) for k, v in timings.items()}}
    started = time.time()
    if target.export_format == "onnx" and shared_graphs.copied_into(directory):  # a twin's graphs (run.twins)
        entries = upstream.read_manifest(directory)["components"]
        timings["save_s"] += time.time() - started
    else:
        entries = _export_each(exporter, configs, components, target, directory, timings,
                               (model.config, generation_config))
    started = time.time()
    manifest = upstream.read_manifest(directory)
    manifest["components"] = entries
    upstream.write_manifest(directory, manifest)
    if target.export_format == "onnx":
        shared_graphs.keep(directory)  # as upstream saved them, before any rewrite: for a twin target
        onnx_files.apply_onnx_file_options(target, directory)
        if len(entries) > 1 and target.external_data:
            onnx_files.share_external_data(directory)
        if getattr(target, "merged", False) and list(entries) == ["model"]:  # the runtimes' names, every layout
            unnamed = unnamed_inputs(rename_merged_graph(directory))
            if unnamed and notes is not None:  # the layouts' files (exporters.layouts) are then not written
                notes.append(f"the merged graph also takes {unnamed}, which optimum, ONNX Runtime GenAI and "
                             "transformers.js do not feed: no genai_config.json is written, and those runtimes "
                             "cannot run this folder")
        if target.mode == "generation" and is_encoder_decoder_export(list(entries)):  # optimum's files and names
            fixed = fixed_past(directory)
            if fixed is None:
                rename_encoder_decoder(directory, sliding_window_of(model.config))
                # one decoder graph (optimum's and transformers.js's), unless `merged: false` keeps the two
                unmerged = merge_encoder_decoder(directory) if target.merged is not False else None
                if unmerged and notes is not None:
                    notes.append(unmerged)
            elif target.layout == TRANSFORMERS_JS:
                raise TargetPlanError(f"`layout` 'transformers.js': {fixed}", option="layout")
            elif notes is not None:
                notes.append(fixed)
    timings["save_s"] += time.time() - started
    return {"components": list(components), **{k: round(v, 3) for k, v in timings.items()}}


def _export_each(exporter, configs: dict[str, Any], components: Components, target, directory: Path,
                 timings: dict[str, float], saved_with: tuple[Any, Any]) -> dict[str, Any]:
    """Export and save each component (its manifest entry returned), one in memory at a time; `saved_with`: the
    model's config and the target's generation config."""
    entries: dict[str, Any] = {}
    for name, (module, inputs) in components.items():
        started = time.time()
        component = _export_one(exporter, name, module, inputs, configs[name])
        timings["export_only_s"] += time.time() - started
        started = time.time()
        upstream.ExportedModel({name: component}, target.export_format, config=saved_with[0],
                               generation_config=saved_with[1]).save_pretrained(directory)
        entries.update(upstream.read_manifest(directory)["components"])
        del component  # released before the next component is exported
        gc.collect()
        timings["save_s"] += time.time() - started
    return entries


EXECUTORCH_PROGRAM = "model.pte"
# A model whose output projection is its embedding table keeps its weights beside the program, where ExecuTorch
# stores that table once (docs/upstream-gaps.md #13).
EXECUTORCH_WEIGHTS = "model"


def _speech_metadata(model, target, recipe: Recipe) -> dict[str, Any]:
    """The constant methods of a speech program in the ASR runner's layout (`exporters.capture.asr_runner`)."""
    setting = cache_setting_for(model, target, recipe)
    eos = special_token_ids(model.generation_config, model.config).eos
    return asr_metadata(model, setting.max_cache_len, eos, decoder_start_id(model))


def _save_methods(program, metadata: dict[str, Any], methods: dict[str, str], directory: Path, config,
                  generation_config, weights_file: str | None = None, runner: dict[str, Any] | None = None) -> None:
    """`model.pte` (and `model.ptd` with `weights_file`) and a manifest in upstream's format whose components name
    their method, and their data file, too; a program in a runner's layout records it (`runner`: its metadata)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / EXECUTORCH_PROGRAM, "wb") as handle:
        program.write_to_file(handle)
    data = {}
    if weights_file is not None:
        program.write_tensor_data_to_file(str(directory))
        data = {"data_file": f"{weights_file}.ptd"}
    components = {name: {"file": EXECUTORCH_PROGRAM, "method": methods[name], **data,
                         "metadata": upstream.metadata_dict(meta)}
                  for name, meta in metadata.items()}
    layout = {"layout": "runner", "runner_metadata": runner} if runner is not None else {}
    upstream.write_manifest(directory, {"schema_version": 1, "export_format": "executorch", **layout,
                                        "components": components})
    if config is not None:
        config.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)


def artifact_generation_config(model, target, recipe: Recipe):
    """What the target folder's `generation_config.json` holds: the repo's own, with the program's cache."""
    if target.mode != "generation":
        return None
    return cache_setting_for(model, target, recipe).for_artifact(model.generation_config)


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


def release_weights(model) -> None:
    """Free the eager model's weights, keeping their shapes and dtypes (the report still reads them): validation
    calls it between its eager references and the artifact, so a run holds one of the two at a time."""
    try:
        model.to("meta")
    except Exception:  # a model that cannot move keeps its weights: more memory, same results
        return
    gc.collect()


def methods_note(target, components: Components) -> str:
    """The report's word on which runtime loads an ExecuTorch generation program with a method per component."""
    names = list(components)
    hint = ("; for an encoder-decoder, optimum-executorch writes methods `encoder` and `text_decoder`, which "
            "`layout: \"runner\"` writes for a speech model on a spectrogram or a raw waveform (Whisper, Moonshine) "
            "at batch 1 with a static cache"
            if "encoder" in names else "; `layout: \"runner\"` writes that program for a decoder-only model with a "
            "key-value cache" if set(names) <= {"prefill", "decode", "model"} else "")
    return METHODS_NOTE.format(methods=", ".join(names), hint=hint)
