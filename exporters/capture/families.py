"""Which kind of model this is, decided from the model's structure (what it can do, which towers it has), never
guessed from config keys alone.

A config with both `text_config` and `vision_config` is a generator that reads images (LLaVA, Idefics3, Qwen2-VL:
`vision-language`) only when the model can generate; one with `text_config` and `audio_config` that can generate
reads audio (Voxtral, Qwen2-Audio: `audio-language`), as does one with `text_config` whose forward takes
`input_features` (Granite Speech: its speech encoder's config is `encoder_config`, [`audio_config_of`]); a model that cannot, and has a text tower beside a vision or
audio tower (CLIP, SigLIP, CLAP), is a `dual-encoder`, whose towers are exported and validated one by one.

Example:
    >>> from transformers import CLIPConfig, CLIPModel
    >>> tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    >>> model = CLIPModel(CLIPConfig(text_config=tiny, vision_config={**tiny, "image_size": 16, "patch_size": 8},
    ...                              projection_dim=16))
    >>> detect_family(model), sorted(towers(model))
    ('dual-encoder', ['text', 'vision'])
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, get_args

import torch

Family = Literal["text", "seq2seq", "speech-seq2seq", "vision", "audio", "vision-language", "audio-language",
                 "dual-encoder"]
FAMILIES: tuple[str, ...] = get_args(Family)
# Generators whose modality encoder and projector feed the language model's embeddings: exported as stages
# (encoder, projector, embed_tokens, language_model, lm_head, decode) and validated through the model's own forward.
MULTIMODAL_GENERATORS: tuple[str, ...] = ("vision-language", "audio-language")
# The main inputs of audio models: a spectrogram (`input_features`: Whisper) or a raw waveform (`input_values`:
# Wav2Vec2, Moonshine).
AUDIO_INPUTS = ("input_features", "input_values")


def a_model_of(family: str) -> str:
    """The family with its article, for messages.

    Example:
        >>> a_model_of("audio-language"), a_model_of("vision-language")
        ('an audio-language model', 'a vision-language model')
    """
    return f"{'an' if family[:1] in 'aeiou' else 'a'} {family} model"


# The attribute names transformers gives the towers of a dual encoder, by modality.
TOWER_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "text": ("text_model", "text_encoder"),
    "vision": ("vision_model", "vision_encoder", "image_encoder"),
    "audio": ("audio_model", "audio_encoder"),
}


def audio_config_of(model) -> Any:
    """The config of the model's audio encoder: `audio_config` (Voxtral, Qwen2-Audio), else `encoder_config` where the
    model's forward takes `input_features` beside a `text_config` (Granite Speech); None for other models.

    Example:
        >>> from types import SimpleNamespace
        >>> audio_config_of(SimpleNamespace(config=SimpleNamespace(audio_config="a")))
        'a'
    """
    config = model.config
    if getattr(config, "audio_config", None) is not None:
        return config.audio_config
    if getattr(config, "text_config", None) is None or getattr(config, "encoder_config", None) is None:
        return None
    try:
        takes_features = "input_features" in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        takes_features = False
    return config.encoder_config if takes_features else None


def can_generate(model) -> bool:
    """Whether `model.generate()` works for this class (transformers' own answer)."""
    method = getattr(model, "can_generate", None)
    return bool(callable(method) and method())


def towers(model) -> dict[str, torch.nn.Module]:
    """`{modality: tower module}` for the towers found as direct children of `model` (empty for other models)."""
    found: dict[str, torch.nn.Module] = {}
    for modality, names in TOWER_ATTRIBUTES.items():
        for name in names:
            module = getattr(model, name, None)
            if isinstance(module, torch.nn.Module):
                found[modality] = module
                break
    return found


def is_dual_encoder(model) -> bool:
    """A model that cannot generate and holds a text tower beside a vision or audio tower."""
    found = towers(model)
    return not can_generate(model) and "text" in found and ("vision" in found or "audio" in found)


def detect_family(model) -> Family:
    """The input family of a model, from what it can do and what it is made of."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    if is_dual_encoder(model):
        return "dual-encoder"
    has_vision = getattr(config, "vision_config", None) is not None
    if has_vision and getattr(config, "text_config", None) is not None and can_generate(model):
        return "vision-language"
    has_audio = audio_config_of(model) is not None
    if has_audio and getattr(config, "text_config", None) is not None and can_generate(model):
        return "audio-language"
    if getattr(config, "is_encoder_decoder", False):
        return "speech-seq2seq" if main in AUDIO_INPUTS else "seq2seq"  # Whisper's spectrogram, Moonshine's waveform
    if main == "pixel_values":
        return "vision"
    if main in AUDIO_INPUTS:
        return "audio"
    return "text"


def default_mode(model) -> str:
    """`generation` for models that generate, `model` (one graph, or one per tower) otherwise."""
    return "generation" if can_generate(model) else "model"
