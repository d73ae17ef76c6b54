"""Complete component sets: the graphs upstream's decomposition leaves out (part of the adapter to upstream).

Upstream `decompose_for_generation` (transformers 5.24) misses stages that inference needs
(docs/upstream-gaps.md):

- vision-language models (and audio-language ones, Voxtral: audio encoder, projector, ...): `generate()` computes
  image features before the first forward call, so
  `decompose_multimodal` never sees the vision tower or the projector run and drops them. Here every stage before
  the decode (modality encoders, projector or connector, the token embedding table `embed_tokens`, the language
  model and `lm_head`) is captured from one plain forward of the model on the image + prompt inputs, with a cache,
  exactly the call the parity check later replays through the exported graphs (`exporters.validate.vision_language`); the
  decode is upstream's. The set is decided from the model's structure (upstream's own submodule finder), so a stage
  that was not captured is missing and fails validation, never passes. Qwen2-VL's merger is part of its vision
  encoder (`model.visual`), so its set has no separate projector;
- encoder-decoder models: there is no encoder graph (prefill takes `encoder_outputs`), and the decode is captured
  with a self-attention cache of length 1, which `Dim.AUTO` specializes: it is captured here at the third generation
  step instead (cache length 2), and the encoder's own call is captured as an `encoder` component;
- dual encoders (CLIP, SigLIP): in model mode each tower (and projection head) is its own component, captured from
  one forward of the whole model, so each can be deployed and is validated on its own.

Some vision-language forwards also read a weight of their own outside every stage: LLaVA-NeXT and LLaVA-OneVision
append `image_newline` after each row of image features in Python. Those glue parameters ([`glue_parameters`]) are
saved beside the graphs ([`GLUE_FILE`]), and the parity check reads them from there.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import StaticCache

from exporters import upstream
from exporters.capture.cache_settings import cache_setting, full_length_windows, max_positions
from exporters.capture.families import MULTIMODAL_GENERATORS, detect_family
from exporters.errors import UnsupportedModelError
from exporters.recipe.model import Recipe
from exporters.upstream import multimodal_submodules, register_cache_pytrees

Components = dict[str, tuple[torch.nn.Module, dict[str, Any]]]

# The minimum complete set per family, for generation mode: a missing stage fails validation, never passes.
MINIMUM_COMPONENTS: dict[str, list[str]] = {
    "text": ["prefill", "decode"],
    "seq2seq": ["encoder", "prefill", "decode"],
    "speech-seq2seq": ["encoder", "prefill", "decode"],
}
# Upstream's names for the module between a modality encoder and the language model.
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "embed_vision", "embed_audio")
VLM_TEXT_STAGES = ["embed_tokens", "language_model", "lm_head", "decode"]
# The weights a vision-language forward reads itself, outside its stages, in each target folder.
GLUE_FILE = "glue_parameters.safetensors"


def minimum_components(family: str, mode: str, captured: list[str], model=None, merged: bool = False) -> list[str]:
    """The components a complete export of this family must have, decided from the model's structure where it
    varies (vision-language stages, dual-encoder towers); the captured set for other families. A merged generation
    export is one graph, `model`.

    Example:
        >>> minimum_components("seq2seq", "generation", ["prefill", "decode"])
        ['encoder', 'prefill', 'decode']
        >>> minimum_components("text", "generation", ["model"], merged=True)
        ['model']
    """
    if mode == "model" and family == "dual-encoder" and model is not None:
        return list(tower_modules(model))
    if mode == "model" or merged:
        return ["model"]
    if family in MULTIMODAL_GENERATORS and model is not None:
        return vision_language_stages(model)
    return MINIMUM_COMPONENTS.get(family, captured)


def vision_language_stages(model) -> list[str]:
    """Every stage a vision-language generation export needs, in inference order: modality encoder(s), projector
    (when the model has one apart from its encoder), `embed_tokens`, `language_model`, `lm_head`, `decode`."""

    found = multimodal_submodules(model)
    encoders = [name for name in found if name.endswith("_encoder")]
    projectors = [name for name in PROJECTOR_NAMES if name in found]
    return encoders + projectors + VLM_TEXT_STAGES


def tower_modules(model) -> dict[str, torch.nn.Module]:
    """A dual encoder's direct children that hold weights (towers, projection heads), by attribute name."""
    return {name: child for name, child in model.named_children() if any(True for _ in child.parameters())}


def model_components(model, forward_inputs: dict[str, Any], family: str) -> Components:
    """Model mode: one `model` graph, or for a dual encoder one graph per tower and projection head, each with the
    inputs the model's own forward gives it."""
    if family != "dual-encoder":
        return {"model": (model, copy.deepcopy(forward_inputs))}
    modules = tower_modules(model)
    calls = _forward_calls(model, forward_inputs, modules)
    return {name: (modules[name], calls[name][0]) for name in modules if calls[name]}


def _forward_calls(model, inputs: dict[str, Any], modules: dict[str, torch.nn.Module],
                   **extra: Any) -> dict[str, list[dict[str, Any]]]:
    """The kwargs of every call to each of `modules` during one `model(**inputs, **extra)`."""
    with ExitStack() as stack, torch.no_grad():
        recorders = {name: stack.enter_context(capture_calls(module)) for name, module in modules.items()}
        model(**copy.deepcopy(inputs), **extra)
    return recorders


@contextmanager
def capture_calls(module: torch.nn.Module):
    """Record a deep copy of the kwargs of every call to `module` (positional args bound to their names)."""
    calls: list[dict[str, Any]] = []
    signature = inspect.signature(module.forward)

    def hook(_module, args, kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        captured: dict[str, Any] = {}
        for name, value in bound.items():
            kind = signature.parameters[name].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                captured.update(copy.deepcopy(value))
            elif kind != inspect.Parameter.VAR_POSITIONAL:
                captured[name] = copy.deepcopy(value)
        calls.append(captured)

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def _generate_calls(model, generate_inputs: dict[str, Any], generation_config, steps: int, *modules):
    config = copy.deepcopy(generation_config)
    config.max_new_tokens = config.min_new_tokens = steps
    config.do_sample = False
    with ExitStack() as stack, torch.no_grad():
        recorders = [stack.enter_context(capture_calls(m)) for m in modules]
        model.generate(**copy.deepcopy(generate_inputs), generation_config=config)
    for calls in recorders:
        for call in calls:
            call.pop("logits_to_keep", None)
    return recorders


def complete_components(model, components: Components, generate_inputs: dict[str, Any], family: str,
                        generation_config, multi_token_decode: bool = False) -> Components:
    """Add the stages upstream's decomposition leaves out, keeping upstream's names and order; every captured
    tensor made contiguous (`contiguous_inputs`)."""
    if family in MULTIMODAL_GENERATORS:  # an audio-language model's stages are captured the same way
        components = _complete_vision_language(model, components, generate_inputs)
    elif family in ("seq2seq", "speech-seq2seq"):
        components = _complete_encoder_decoder(model, components, generate_inputs, generation_config,
                                               multi_token_decode)
    if family == "text":
        components = {name: (module, without_unread_mask(module, inputs)) for name, (module, inputs) in
                      components.items()}
    return {name: (module, contiguous_inputs(inputs)) for name, (module, inputs) in components.items()}


def without_unread_mask(module, inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` without the `attention_mask` `generate()` passes to a model whose forward never names one (xLSTM:
    it lands in `**kwargs`, unread): kept, it would be a graph input that grows with every step, which a program
    with static shapes refuses. A forward that names it keeps it."""
    if "attention_mask" not in inputs:
        return inputs
    try:
        names = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return inputs
    return inputs if "attention_mask" in names else {k: v for k, v in inputs.items() if k != "attention_mask"}


def contiguous_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` with every tensor (cache tensors included) contiguous.

    A sliding-window cache captured from `generate()` past its window holds strided views (the window is a slice of
    a longer tensor); torch.export then guards on those strides, and the exported decode refuses the contiguous cache
    a runtime, or the previous graph, gives it (docs/upstream-gaps.md). Traced on contiguous tensors, it takes both.
    """

    register_cache_pytrees()
    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.contiguous(), inputs)


def _complete_vision_language(model, components: Components, generate_inputs: dict[str, Any]) -> Components:
    found = multimodal_submodules(model)
    if not found:
        raise UnsupportedModelError(
            f"{type(model).__name__} has a modality config but upstream finds no modality encoder beside a language "
            "model on it (transformers.exporters.utils.decompose_multimodal): its stages cannot be exported apart")
    watched = {name: module for name, module in found.items() if name in vision_language_stages(model)}
    watched["embed_tokens"] = model.get_input_embeddings()
    calls = _forward_calls(model, generate_inputs, watched, **prefill_cache_kwargs(components.get("decode")))
    complete: Components = {}
    for name in vision_language_stages(model):
        if name == "decode":
            if "decode" in components:
                complete["decode"] = components["decode"]
        elif calls.get(name):
            complete[name] = (watched[name], calls[name][0])
    return complete


def glue_parameters(model, components: Components) -> dict[str, torch.Tensor]:
    """The parameters the model's forward reads itself: held directly by a module that holds a stage (the model,
    `model.model`), by their names in `model` (LLaVA-NeXT: `{"model.image_newline": ...}`); empty for most families.
    The decode (a copy of the whole model) is not a stage here."""
    stage_ids = {id(module) for name, (module, _) in components.items() if name != "decode"}
    stage_names = [name for name, module in model.named_modules() if id(module) in stage_ids]
    glue: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        holds_stage = name == "" or any(stage.startswith(f"{name}.") for stage in stage_names)
        if id(module) in stage_ids or not holds_stage:
            continue
        for key, parameter in module.named_parameters(recurse=False):
            glue[f"{name}.{key}" if name else key] = parameter.detach().contiguous().clone()
    return glue


def write_glue(model, components: Components, directory) -> list[str]:
    """Save a vision-language export's [`glue_parameters`] into `directory` as [`GLUE_FILE`] (nothing when there
    are none); their names."""
    glue = glue_parameters(model, components) if "language_model" in components else {}
    if glue:
        save_file(glue, str(directory / GLUE_FILE))
    return sorted(glue)


def read_glue(directory) -> dict[str, torch.Tensor]:
    """The glue parameters a target folder holds ([`GLUE_FILE`]), empty when it has none."""
    path = directory / GLUE_FILE
    return load_file(str(path)) if path.is_file() else {}


def prefill_cache_kwargs(decode: tuple[torch.nn.Module, dict[str, Any]] | None) -> dict[str, Any]:
    """How the forward that the stages are captured from (and replayed through) gets its cache: made by the model
    (dynamic), or, when the decode was captured on a static cache, an empty copy of that cache, so the language
    model's graph returns the cache the decode takes."""

    cache = None
    if decode is not None:
        cache = next((decode[1][key] for key in ("cache", "past_key_values") if decode[1].get(key) is not None), None)
    if not isinstance(cache, StaticCache):
        return {"use_cache": True}
    empty = copy.deepcopy(cache)
    empty.reset()
    return {"use_cache": True, "cache": empty}


def _complete_encoder_decoder(model, components: Components, generate_inputs, generation_config,
                              multi_token_decode: bool) -> Components:
    encoder = model.get_encoder()
    encoder_calls, model_calls = _generate_calls(model, generate_inputs, generation_config, 3, encoder, model)
    if not encoder_calls or len(model_calls) < 3:
        return components
    complete: Components = {"encoder": (encoder, encoder_calls[0])}
    for name, pair in components.items():
        complete[name] = pair
    if not multi_token_decode:  # upstream's merged multi-token decode already has a dynamic query axis
        # The third call decodes with a self-attention cache of length 2: Dim.AUTO keeps that axis dynamic.
        complete["decode"] = (copy.copy(model), model_calls[2])
    return complete


def cache_setting_for(model, target, recipe: Recipe):
    """The cache `target` is captured, exported and checked with (`exporters.capture.cache_settings`)."""
    setting = cache_setting(target, recipe, max_positions(model.config))
    if full_length_windows(target, detect_family(model), setting.implementation, model.config):
        return dataclasses.replace(setting, full_windows=True)
    return setting


def generation_config_for(model, setting):
    """The generation config the capture runs with: the model's own, greedy, with the target's cache setting."""
    return setting.apply(model.generation_config)


def decompose(model, mode: str, forward_inputs: dict, generate_inputs: dict, *, setting,
              multi_token_decode: bool, family: str | None = None) -> Components:
    """`{component: (module, forward kwargs)}`: one `model` graph, or the complete set of generation components
    (upstream's, plus the stages it leaves out: see `exporters.capture.components`). A merged target takes upstream's
    multi-token decode from it (`exporters.capture.merged.plan`)."""
    if mode == "model":
        return model_components(model, forward_inputs, family or detect_family(model))

    generation_config = generation_config_for(model, setting)
    with torch.no_grad(), upstream.static_sliding_layers_kept_whole():
        components = upstream.decompose_for_generation(
            model,
            copy.deepcopy(setting.capture_inputs(generate_inputs)),
            generation_config=generation_config,
            multi_token_decode=multi_token_decode,
        )
        return complete_components(model, components, generate_inputs, family or detect_family(model),
                                   generation_config, multi_token_decode)
