"""Every input modality a model takes has a component that reads it, or no target of it is exported.

A model's modalities are read from what it takes, never from the family it was sorted into: its forward's inputs
(`input_features`, `pixel_values`, ...) and its config's modality sub-configs (`audio_config`, `vision_config`).
A family covers the modalities its components read (a vision-language export has an image encoder, a speech
encoder-decoder an audio encoder, an audio-language one its audio encoder and projector where the model's own code
says how many audio tokens its features take: Voxtral's `get_audio_features`, Qwen2-Audio's audio tower output
lengths); a model that takes one its family does not cover (Granite Speech sorted as a text generator;
a vision-language one that also hears) is refused, naming the modality and the modules that would be dropped:
exporting its language model alone would pass a folder that cannot read its audio.

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                                      num_attention_heads=2, vocab_size=64))
    >>> input_modalities(model), uncovered(model, "text")
    ({}, {})
"""

from __future__ import annotations

import inspect

import torch

from exporters.capture.audio_text import counts_audio_tokens
from exporters.capture.families import towers

# The forward inputs that carry each non-text modality (a video's frames go through the image encoder).
MODALITY_INPUTS: dict[str, tuple[str, ...]] = {
    "audio": ("input_features", "input_values", "audio_input_features", "audio_values", "input_audio_embeds"),
    "image": ("pixel_values", "image_pixel_values", "pixel_values_videos", "pixel_values_images"),
}
MODALITY_CONFIGS: dict[str, tuple[str, ...]] = {
    "audio": ("audio_config", "speech_config"),
    "image": ("vision_config",),
}
# What each input family exports a component for (dual encoders: their towers, decided from the model).
FAMILY_COVERS: dict[str, tuple[str, ...]] = {
    "text": (), "seq2seq": (), "speech-seq2seq": ("audio",), "vision": ("image",), "audio": ("audio",),
    "vision-language": ("image",), "audio-language": ("audio",),
}
# The module names that hold a modality's encoder and its projector into the language model, to name in a refusal.
_MODULE_WORDS = {"audio": ("audio", "speech", "encoder", "projector", "whisper", "conformer"),
                 "image": ("vision", "visual", "image", "projector", "connector", "resampler")}


def input_modalities(model) -> dict[str, str]:
    """`{modality: evidence}` for each non-text modality `model` takes: the first forward input or config entry
    that says so."""
    try:
        parameters = set(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        parameters = set()
    config = model.config
    found: dict[str, str] = {}
    for modality, names in MODALITY_INPUTS.items():
        inputs = [name for name in names if name in parameters]
        if inputs:
            found[modality] = f"its forward takes `{inputs[0]}`"
            continue
        configs = [name for name in MODALITY_CONFIGS[modality] if getattr(config, name, None) is not None]
        if configs:
            found[modality] = f"its config has `{configs[0]}`"
    return found


def covered(model, family: str) -> set[str]:
    """The modalities the components of `family`'s exports read."""
    if family == "dual-encoder":
        return {"image" if modality == "vision" else modality for modality in towers(model)} - {"text"}
    if family == "audio-language" and not counts_audio_tokens(model):
        return set()  # its audio tokens cannot be laid out in a prompt (exporters.capture.audio_text)
    return set(FAMILY_COVERS.get(family, ()))


def uncovered(model, family: str) -> dict[str, str]:
    """`{modality: evidence}` for each modality `model` takes that no component of its `family`'s exports reads."""
    have = covered(model, family)
    return {modality: why for modality, why in input_modalities(model).items() if modality not in have}


def dropped_modules(model, modality: str) -> list[str]:
    """The dotted names of the modules that read `modality` (its encoder, its projector), at most two levels deep,
    to name in a refusal."""
    words = _MODULE_WORDS[modality]
    names: list[str] = []
    for name, module in model.named_modules():
        depth = name.count(".")
        if not name or depth > 1 or not isinstance(module, torch.nn.Module) or "language_model" in name:
            continue
        leaf = name.rsplit(".", 1)[-1].lower()
        if any(word in leaf for word in words) and not any(name.startswith(parent + ".") for parent in names):
            names.append(name)
    return names


def refusal(model, family: str) -> str | None:
    """Why `model` cannot be exported as a `family` model without dropping a modality it takes; None when every
    modality it takes has a component.

    Example:
        >>> from transformers import CLIPConfig, CLIPModel
        >>> tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
        >>> clip = CLIPModel(CLIPConfig(text_config=tiny, vision_config={**tiny, "image_size": 16, "patch_size": 8},
        ...                             projection_dim=16))
        >>> refusal(clip, "dual-encoder") is None, refusal(clip, "text")[:56]
        (True, 'CLIPModel reads image (its forward takes `pixel_values`)')
    """
    gaps = uncovered(model, family)
    if not gaps:
        return None
    parts = []
    for modality, why in gaps.items():
        modules = dropped_modules(model, modality)
        named = f" (the {modality} encoder and its projector: {', '.join(f'`{m}`' for m in modules)})" if modules else ""
        parts.append(f"{modality} ({why}){named}")
    how = (" (an audio-language model's audio stages are exported where its own code counts its audio tokens: "
           "`get_audio_features`, or its audio tower's `_get_feat_extract_output_lengths`; this model has neither)"
           if family == "audio-language" else "")
    return (f"{type(model).__name__} reads {'; '.join(parts)}, and this tool exports no component for "
            f"{' or '.join(gaps)} in {'an' if family[0] in 'aeiou' else 'a'} {family!r} model{how}: exporting its "
            "language model alone would drop "
            f"{'them' if len(gaps) > 1 else 'it'} and pass a folder that cannot read its "
            f"{' or '.join(gaps)}. Not supported yet: nothing is exported for this model")
