"""Complete component sets for generation exports: the graphs upstream leaves out (part of the adapter to upstream).

Upstream `decompose_for_generation` (transformers 5.24) misses stages that inference needs
(docs/upstream-gaps.md):

- vision-language models: `generate()` computes image features before the first forward call, so
  `decompose_multimodal` never sees the vision tower or the projector run and drops them. They are captured here by
  upstream's `decompose_multimodal` on a plain forward pass with the pixel inputs; the token embedding table is
  exported too (`embed_tokens`), so a prompt reaches the language model through exported graphs only;
- encoder-decoder models: there is no encoder graph (prefill takes `encoder_outputs`), and the decode is captured
  with a self-attention cache of length 1, which `Dim.AUTO` specializes: it is captured here at the third generation
  step instead (cache length 2), and the encoder's own call is captured as an `encoder` component.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any

import torch

Components = dict[str, tuple[torch.nn.Module, dict[str, Any]]]

# The minimum complete set per family, for generation mode: a missing stage fails validation, never passes.
MINIMUM_COMPONENTS: dict[str, list[str]] = {
    "text": ["prefill", "decode"],
    "seq2seq": ["encoder", "prefill", "decode"],
    "speech-seq2seq": ["encoder", "prefill", "decode"],
    "vision-language": ["image_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head",
                        "decode"],
}


def minimum_components(family: str, mode: str, captured: list[str], merged: bool = False) -> list[str]:
    """The components a complete export of this family must have (the captured set for unknown families); a merged
    generation export is one graph, `model`."""
    if mode == "model" or merged:
        return ["model"]
    return MINIMUM_COMPONENTS.get(family, captured)


@contextmanager
def capture_calls(module: torch.nn.Module):
    """Record a deep copy of the kwargs of every call to `module` (positional args bound to their names)."""
    import inspect

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
    from contextlib import ExitStack

    with ExitStack() as stack, torch.no_grad():
        recorders = [stack.enter_context(capture_calls(m)) for m in modules]
        model.generate(**copy.deepcopy(generate_inputs), generation_config=config)
    for calls in recorders:
        for call in calls:
            call.pop("logits_to_keep", None)
    return recorders


def complete_components(model, components: Components, generate_inputs: dict[str, Any], family: str,
                        generation_config, multi_token_decode: bool = False) -> Components:
    """Add the stages upstream's decomposition leaves out, keeping upstream's names and order."""
    if family == "vision-language":
        return _complete_vision_language(model, components, generate_inputs)
    if family in ("seq2seq", "speech-seq2seq"):
        return _complete_encoder_decoder(model, components, generate_inputs, generation_config, multi_token_decode)
    return components


def _complete_vision_language(model, components: Components, generate_inputs: dict[str, Any]) -> Components:
    from .upstream import decompose_multimodal

    missing = [n for n in ("image_encoder", "multi_modal_projector") if n not in components]
    complete: Components = {}
    if missing:
        with torch.no_grad():
            forward = decompose_multimodal(model, copy.deepcopy(generate_inputs))
        for name in ("image_encoder", "audio_encoder", "multi_modal_projector"):
            if name in forward and name not in components:
                complete[name] = forward[name]
    embeddings = model.get_input_embeddings()
    complete["embed_tokens"] = (embeddings, {"input": generate_inputs["input_ids"].clone()})
    complete.update(components)
    return complete


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
