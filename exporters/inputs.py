"""Sample inputs: tokenized from the recipe's prompt when the repo has a tokenizer, else synthesized within the
config's limits (vocabulary, image size, mel bins)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from .recipe import InputsSpec

FAMILIES = ("text", "seq2seq", "speech-seq2seq", "vision", "audio", "vision-language")


@dataclass
class SampleInputs:
    """`forward`: kwargs for one `model(**forward)` call; `generate`: kwargs for `model.generate(**generate)`."""

    family: str
    forward: dict[str, Any]
    generate: dict[str, Any]


def detect_family(model) -> str:
    """The input family of a model, from its config and main input."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    if getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None:
        return "vision-language"
    if getattr(config, "is_encoder_decoder", False):
        return "speech-seq2seq" if main == "input_features" else "seq2seq"
    if main == "pixel_values":
        return "vision"
    if main in ("input_features", "input_values"):
        return "audio"
    return "text"


def _vocab_size(config) -> int:
    text = getattr(config, "text_config", None) or config
    return int(getattr(text, "vocab_size", None) or getattr(config, "vocab_size", 100))


def _special_ids(config) -> set[int]:
    ids = set()
    for source in (config, getattr(config, "text_config", None)):
        for name in ("image_token_id", "image_token_index", "video_token_id", "audio_token_id", "pad_token_id",
                     "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
    return ids


def random_token_ids(config, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Token ids drawn from the vocabulary, avoiding special and modality tokens."""
    vocab = _vocab_size(config)
    special = _special_ids(config)
    allowed = torch.tensor([i for i in range(min(vocab, 4096)) if i not in special] or [0])
    picks = torch.randint(0, len(allowed), shape, generator=generator)
    return allowed[picks]


def _text_ids(model, tokenizer, spec: InputsSpec, generator: torch.Generator) -> torch.Tensor:
    if tokenizer is not None and spec.prompt:
        ids = tokenizer(spec.prompt, return_tensors="pt")["input_ids"]
        ids = ids.clamp(max=_vocab_size(model.config) - 1)
        return ids.repeat(spec.batch_size, 1)
    return random_token_ids(model.config, (spec.batch_size, spec.sequence_length), generator)


def _decoder_start(model) -> int:
    config = model.config
    for name in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if value is None and getattr(model, "generation_config", None) is not None:
            value = getattr(model.generation_config, name, None)
        if isinstance(value, int):
            return value
    return 0


def _image_size(config, spec: InputsSpec) -> int:
    vision = getattr(config, "vision_config", None) or config
    return spec.image_size or int(getattr(vision, "image_size", 32))


def _num_channels(config) -> int:
    vision = getattr(config, "vision_config", None) or config
    return int(getattr(vision, "num_channels", 3))


def _image_tokens(config, image_size: int) -> int:
    if getattr(config, "image_seq_length", None):
        return int(config.image_seq_length)
    vision = config.vision_config
    patches = (image_size // int(vision.patch_size)) ** 2
    return patches + (1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0)


def make_sample_inputs(model, spec: InputsSpec, tokenizer=None, text_ids: torch.Tensor | None = None) -> SampleInputs:
    """Sample inputs for `model` following the recipe's `inputs` section.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> model = BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        ...                              intermediate_size=32, vocab_size=50))
        >>> sample = make_sample_inputs(model, InputsSpec(sequence_length=8))
        >>> sample.family, sample.forward["input_ids"].shape
        ('text', torch.Size([1, 8]))
    """
    generator = torch.Generator().manual_seed(spec.seed)
    family = detect_family(model)
    config = model.config
    batch = spec.batch_size
    if family == "vision":
        size = _image_size(config, spec)
        pixels = torch.randn(batch, _num_channels(config), size, size, generator=generator)
        return SampleInputs(family, {"pixel_values": pixels}, {"pixel_values": pixels})
    if family == "audio":
        length = spec.audio_length or 1600
        name = getattr(model, "main_input_name", "input_values")
        if name == "input_features":
            bins = int(getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 80))
            values = torch.randn(batch, length, bins, generator=generator)
        else:
            values = torch.randn(batch, length, generator=generator)
        return SampleInputs(family, {name: values}, {name: values})
    if family == "speech-seq2seq":
        bins = int(config.num_mel_bins)
        frames = spec.audio_length or 2 * int(config.max_source_positions)
        features = torch.randn(batch, bins, frames, generator=generator)
        decoder = torch.full((batch, spec.decoder_sequence_length), _decoder_start(model), dtype=torch.long)
        return SampleInputs(
            family, {"input_features": features, "decoder_input_ids": decoder}, {"input_features": features}
        )
    ids = text_ids if text_ids is not None else _text_ids(model, tokenizer, spec, generator)  # calibration sample
    mask = torch.ones_like(ids)
    if family == "seq2seq":
        decoder = torch.full((batch, spec.decoder_sequence_length), _decoder_start(model), dtype=torch.long)
        forward = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder}
        return SampleInputs(family, forward, {"input_ids": ids, "attention_mask": mask})
    if family == "vision-language":
        size = _image_size(config, spec)
        pixels = torch.randn(batch, _num_channels(config), size, size, generator=generator)
        image_token = getattr(config, "image_token_id", None)
        if image_token is None:
            image_token = config.image_token_index
        image = torch.full((batch, _image_tokens(config, size)), int(image_token), dtype=torch.long)
        ids = torch.cat([image, ids], dim=1)
        mask = torch.ones_like(ids)
        inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}
        return SampleInputs(family, dict(inputs), dict(inputs))
    forward = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in inspect.signature(model.forward).parameters and getattr(config, "type_vocab_size", 0):
        forward["token_type_ids"] = torch.zeros_like(ids)
    return SampleInputs(family, forward, {"input_ids": ids, "attention_mask": mask})


def default_mode(model) -> str:
    """`generation` for models that generate, `model` (one graph) otherwise."""
    can_generate = getattr(model, "can_generate", None)
    return "generation" if callable(can_generate) and can_generate() else "model"
