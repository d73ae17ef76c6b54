"""Sample inputs: from the repo's own processor when the folder ships one (a synthetic image or waveform through
it, offline), else tokenized from the recipe's prompt when the repo has a tokenizer, else synthesized within the
config's limits (vocabulary, image size, mel bins) in the family's layout (`exporters.capture.multimodal`).

A model whose inputs cannot be made raises `UnsupportedModelError` naming what is missing; the pipeline turns it
into failed targets with that reason.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exporters.capture.audio_text import synthesize_audio_language
from exporters.capture.cross_attention import cross_attends, synthesize_cross_attention
from exporters.capture.families import AUDIO_INPUTS, FAMILIES, default_mode, detect_family, towers
from exporters.capture.modalities import refusal
from exporters.capture.multimodal import (
    Preprocessor,
    config_image_processor,
    image_processor_pixels,
    load_preprocessor,
    processor_inputs,
    synthesize_vlm,
)
from exporters.errors import UnsupportedModelError
from exporters.recipe.model import InputsSpec
from exporters.upstream.fixed_image import PIXTRAL_TOKENS
from exporters.upstream.pytree import move_to

# Moonshine's encoder downsamples a waveform's attention_mask by slicing it to its conv output length, which torch.export
# fixes at the traced length (`Guard failed: attention_mask.size()[1] >= 14977`); without the mask the waveform axis
# stays dynamic, and optimum's and transformers.js's Moonshine encoders take `input_values` alone.
WAVEFORM_MASK_NOTE = ("sample inputs: the {name}'s attention_mask is left out of the encoder's inputs (all ones: "
                      "nothing padded): a mask downsampled by slicing fixes the waveform length at export, the "
                      "waveform alone keeps it dynamic (batch one waveform at a time, or pad with zeros)")
WAVEFORM_SAMPLES = 16000  # one second at 16 kHz: a raw-waveform speech model's synthesized source
FILTER_BANK_FRAMES = 1000  # ten seconds of filter banks at 100 frames a second: a filter-bank speech model's source

__all__ = ["FAMILIES", "SampleInputs", "default_mode", "detect_family", "make_sample_inputs", "random_token_ids"]


@dataclass
class SampleInputs:
    """`forward`: kwargs for one `model(**forward)` call; `generate`: kwargs for `model.generate(**generate)`;
    `source`: how they were made (`synthesized`, `tokenizer`, or the processor's class); `notes`: findings for the
    report (a processor that could not be loaded, ...)."""

    family: str
    forward: dict[str, Any]
    generate: dict[str, Any]
    source: str = "synthesized"
    notes: list[str] = field(default_factory=list)


def vocab_size(config) -> int:
    """The (text) vocabulary size of a model config."""
    text = getattr(config, "text_config", None) or config
    return int(getattr(text, "vocab_size", None) or getattr(config, "vocab_size", 100))


def _special_ids(config) -> set[int]:
    ids = set()
    for source in (config, getattr(config, "text_config", None)):
        if source is None:
            continue
        for name in dir(source):
            if not (name.endswith("_token_id") or name.endswith("_token_index") or name.endswith("_token_ids")):
                continue
            try:
                value = getattr(source, name, None)
            except Exception:  # a deprecated alias that warns or raises
                continue
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(v for v in value if isinstance(v, int))
    return ids


def random_token_ids(config, shape: tuple[int, ...], generator: torch.Generator,
                     limit: int | None = None) -> torch.Tensor:
    """Token ids drawn from the vocabulary (below `limit` when given: the tokenizer's, where a config's vocabulary
    is padded past it with rows no token reaches), avoiding special and modality tokens."""
    vocab = min(vocab_size(config), limit) if limit else vocab_size(config)
    special = _special_ids(config)
    allowed = torch.tensor([i for i in range(min(vocab, 4096)) if i not in special] or [0])
    picks = torch.randint(0, len(allowed), shape, generator=generator)
    return allowed[picks]


def prompt_ids(model, tokenizer, spec: InputsSpec, generator: torch.Generator) -> torch.Tensor:
    if tokenizer is not None and spec.prompt:
        ids = tokenizer(spec.prompt, return_tensors="pt")["input_ids"]
        ids = ids.clamp(max=vocab_size(model.config) - 1)
        return ids.repeat(spec.batch_size, 1)
    limit = len(tokenizer) if tokenizer is not None else None  # ids a tokenizer can produce
    return random_token_ids(model.config, (spec.batch_size, spec.sequence_length), generator, limit)


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
    size = getattr(vision, "image_size", 32)
    return spec.image_size or int(size[0] if isinstance(size, (list, tuple)) else size)


def _num_channels(config) -> int:
    vision = getattr(config, "vision_config", None) or config
    return int(getattr(vision, "num_channels", 3))


def _pixels(config, spec: InputsSpec, generator: torch.Generator) -> torch.Tensor:
    size = _image_size(config, spec)
    return torch.randn(spec.batch_size, _num_channels(config), size, size, generator=generator)


def feature_width(config) -> int | None:
    """How wide each frame of an audio model's features is, read from the config (None: it does not say): its mel
    bins (AST, CLAP), or the width of its feature projection's input (Wav2Vec2-BERT, SeamlessM4T's speech encoder:
    `feature_projection_input_dim`, its feature extractor's `feature_size` times the `stride` frames it stacks, 80 x
    2 = 160), or a feature size it names itself.

    Example:
        >>> from transformers import Wav2Vec2BertConfig
        >>> feature_width(Wav2Vec2BertConfig())
        160
    """
    for name in ("num_mel_bins", "feature_projection_input_dim", "feature_size"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _audio(model, config, spec: InputsSpec, generator: torch.Generator) -> dict[str, torch.Tensor]:
    name = getattr(model, "main_input_name", "input_values")
    bins = getattr(config, "num_mel_bins", None)
    if name == "input_features" or bins:  # a spectrogram: frames x features (AST's input_values too)
        length = spec.audio_length or int(getattr(config, "max_length", None) or 1600)
        width = feature_width(config)
        if width is None:
            raise UnsupportedModelError(
                f"{type(config).__name__} gives no width for the model's {name!r} (num_mel_bins, "
                "feature_projection_input_dim or feature_size): add the model's feature extractor "
                "(preprocessor_config.json) to the folder, which makes its inputs")
        return {name: torch.randn(spec.batch_size, length, width, generator=generator)}
    return {name: torch.randn(spec.batch_size, spec.audio_length or 1600, generator=generator)}


def _speech_source(model, spec: InputsSpec, generator: torch.Generator) -> tuple[str, torch.Tensor]:
    """A speech encoder-decoder's source in its main input's layout, when the folder has no feature extractor: a
    spectrogram `input_features` (`batch x mel bins x frames`: Whisper, twice its source positions), filter banks
    `input_features` (`batch x frames x features`: Speech2Text, whose convolutions subsample the frames by 4 before
    its source positions; at most `FILTER_BANK_FRAMES`) or a raw waveform `input_values` (`batch x samples`:
    Moonshine, one second at 16 kHz, its feature extractor's rate)."""
    config = model.config
    name = getattr(model, "main_input_name", "input_features")
    if name == "input_values":
        return name, torch.randn(spec.batch_size, spec.audio_length or WAVEFORM_SAMPLES, generator=generator)
    if getattr(config, "num_mel_bins", None) is not None:
        frames = spec.audio_length or 2 * int(config.max_source_positions)
        return name, torch.randn(spec.batch_size, int(config.num_mel_bins), frames, generator=generator)
    per_channel = getattr(config, "input_feat_per_channel", None)
    if per_channel is not None:
        features = int(per_channel) * int(getattr(config, "input_channels", 1) or 1)
        frames = spec.audio_length or min(2 * int(config.max_source_positions), FILTER_BANK_FRAMES)
        return name, torch.randn(spec.batch_size, frames, features, generator=generator)
    raise ValueError(f"{type(config).__name__} gives neither num_mel_bins (a spectrogram) nor input_feat_per_channel "
                     f"(filter banks) for the model's {name!r}: add the model's feature extractor "
                     "(preprocessor_config.json) to the folder, which makes its inputs")


def _with_token_types(model, inputs: dict[str, Any]) -> dict[str, Any]:
    config = model.config
    if "token_type_ids" in inspect.signature(model.forward).parameters and getattr(config, "type_vocab_size", 0):
        inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    return inputs


def make_sample_inputs(model, spec: InputsSpec, tokenizer=None, folder: Path | None = None,
                       text_ids: torch.Tensor | None = None) -> SampleInputs:
    """Sample inputs for `model` following the recipe's `inputs` section (and the folder's processor, if any);
    `text_ids`, when given, is the prompt (a calibration sample) and the inputs are built around it.

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
    dropped = refusal(model, family)  # a modality no component would read: never a pass on the language model alone
    if dropped:
        raise UnsupportedModelError(dropped)
    text_only = family in ("text", "seq2seq") or text_ids is not None
    audio = family in ("audio", "speech-seq2seq", "audio-language")
    pre, notes = load_preprocessor(folder, audio=audio) if not text_only else (None, [])
    if pre is None and not text_only:  # inputs only the family's processor lays out (SigLIP2's NaFlex patches)
        pre = config_image_processor(model)
    if family == "audio-language":  # features from the folder's extractor or the audio config, tokens by the rule
        ids = text_ids if text_ids is not None else prompt_ids(model, tokenizer, spec, generator)
        inputs, note = synthesize_audio_language(model, spec, ids, pre)
        source = f"feature extractor ({pre.name})" if pre is not None else "synthesized"
        return SampleInputs(family, dict(inputs), dict(inputs), source, notes + [note])
    if pre is not None:
        sample = _from_preprocessor(model, pre, spec, family, tokenizer, generator)
        if sample is not None:
            sample.notes = notes + pre.notes + sample.notes
            return sample
        pixels = image_processor_pixels(model, pre, spec)  # a vision-language model's pixels, tokens by the rule
        notes.append(f"sample inputs: a synthetic image through the folder's own {pre.name}, which makes pixels but "
                     "does not lay out the image tokens: as many image tokens as the model's get_image_features "
                     "returns features for those pixels")
        sample = _synthesized(model, spec, family, tokenizer, generator, text_ids, pixels)
        sample.source = f"image processor ({pre.name})"
        sample.notes = notes + sample.notes
        return sample
    sample = _synthesized(model, spec, family, tokenizer, generator, text_ids)
    sample.notes = notes + sample.notes
    return sample


def in_model_dtype(sample: SampleInputs, model) -> SampleInputs:
    """`sample` with its floating tensors in a half model's dtype (a processor's or synthesized float32 spectrogram
    or pixels fed to bfloat16 convolutions: 'Input type (float) and bias type (c10::BFloat16)'); as is for float32."""
    if model.dtype != torch.float32:
        sample.forward = move_to(sample.forward, "cpu", model.dtype)
        sample.generate = move_to(sample.generate, "cpu", model.dtype)
    return sample


def _from_preprocessor(model, pre: Preprocessor, spec: InputsSpec, family: str, tokenizer,
                       generator: torch.Generator) -> SampleInputs | None:
    """Inputs through the folder's processor; None when it cannot make this family's inputs alone (then the
    caller synthesizes, noting why)."""
    if family == "vision-language" and pre.kind != "processor":
        return None  # pixels alone do not lay out the image tokens: synthesized in the family's layout
    made = processor_inputs(model, pre, spec, family)
    source = f"processor ({pre.name})" if not pre.origin else f"{pre.name}, built from the config"
    through = pre.origin or f"the folder's own {pre.name}"
    pre.notes.append(f"sample inputs: a synthetic {'waveform' if family in ('audio', 'speech-seq2seq') else 'image'} "
                     f"through {through}")
    if family == "dual-encoder" and "input_ids" not in made:
        ids = prompt_ids(model, tokenizer, spec, generator)
        made.update({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    if family == "speech-seq2seq":
        decoder = torch.full((spec.batch_size, spec.decoder_sequence_length), _decoder_start(model), dtype=torch.long)
        encoder = {k: v for k, v in made.items() if k in (*AUDIO_INPUTS, "attention_mask")}
        mask = encoder.get("attention_mask")
        if "input_values" in encoder and isinstance(mask, torch.Tensor) and bool((mask == 1).all()):
            del encoder["attention_mask"]  # nothing padded: the waveform alone says it all
            pre.notes.append(WAVEFORM_MASK_NOTE.format(name=pre.name))
        return SampleInputs(family, {**encoder, "decoder_input_ids": decoder}, encoder, source)
    return SampleInputs(family, dict(made), dict(made), source)


def _pixtral_tokens(tokenizer) -> tuple[int, int] | None:
    """The tokenizer's `[IMG_BREAK]` and `[IMG_END]` ids (a Pixtral processor's rows of image tokens), or None."""
    vocabulary = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else {}
    found = [vocabulary.get(token) for token in PIXTRAL_TOKENS]
    return (found[0], found[1]) if all(isinstance(value, int) for value in found) else None


def _synthesized(model, spec: InputsSpec, family: str, tokenizer, generator: torch.Generator,
                 text_ids: torch.Tensor | None = None, pixels: dict[str, Any] | None = None) -> SampleInputs:
    config = model.config
    batch = spec.batch_size
    source = "tokenizer" if tokenizer is not None and spec.prompt else "synthesized"
    if family == "vision":
        pixels = _pixels(config, spec, generator)
        return SampleInputs(family, {"pixel_values": pixels}, {"pixel_values": pixels})
    if family == "audio":
        values = _audio(model, config, spec, generator)
        return SampleInputs(family, values, dict(values))
    if family == "speech-seq2seq":
        name, features = _speech_source(model, spec, generator)
        decoder = torch.full((batch, spec.decoder_sequence_length), _decoder_start(model), dtype=torch.long)
        return SampleInputs(family, {name: features, "decoder_input_ids": decoder}, {name: features})
    ids = text_ids if text_ids is not None else prompt_ids(model, tokenizer, spec, generator)  # calibration sample
    mask = torch.ones_like(ids)
    if family == "seq2seq":
        decoder = torch.full((batch, spec.decoder_sequence_length), _decoder_start(model), dtype=torch.long)
        forward = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder}
        return SampleInputs(family, forward, {"input_ids": ids, "attention_mask": mask}, source)
    if family == "vision-language" and pixels is None and cross_attends(model):  # Mllama: what its processor makes
        inputs, note = synthesize_cross_attention(model, spec, ids)
        return SampleInputs(family, dict(inputs), dict(inputs), source, [note])
    if family == "vision-language":
        inputs = synthesize_vlm(model, spec, ids, generator, pixels, _pixtral_tokens(tokenizer))
        return SampleInputs(family, dict(inputs), dict(inputs), source)
    if family == "dual-encoder":
        forward = {"input_ids": ids, "attention_mask": mask}
        if "vision" in _tower_modalities(model):
            forward["pixel_values"] = _pixels(config, spec, generator)
        else:
            audio_config = getattr(config, "audio_config", config)
            forward.update(_audio(model, audio_config, spec, generator))
        return SampleInputs(family, forward, dict(forward), source)
    forward = _with_token_types(model, {"input_ids": ids, "attention_mask": mask})
    return SampleInputs(family, forward, {"input_ids": ids, "attention_mask": mask}, source)


def _tower_modalities(model) -> list[str]:
    return list(towers(model))
