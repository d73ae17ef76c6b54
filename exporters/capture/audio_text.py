"""Sample inputs for audio-language models (Voxtral, Granite Speech): audio features and a prompt with the audio's
tokens.

The features are log-mel spectrograms made from a synthetic waveform, never a constant tensor:

- by the folder's feature extractor (its processor's, or `preprocessor_config.json` alone) when one loads;
- else by a Whisper-style extractor built from the model's audio config ([`extractor_from_config`]): as many mel
  bins as the encoder reads (`num_mel_bins`), as many frames as it takes (its source positions times its
  convolutions' strides), 16 kHz and 10 ms hops as Voxtral's and Qwen2-Audio's extractors;
- for a speech encoder that reads two log-mel frames stacked (Granite Speech: `input_dim` wide, no source positions),
  `input_dim / 2` bins, every two frames stacked into one `[batch, frames, input_dim]` row as its extractor does
  (whose own mel needs torchaudio); as many stacked frames as one block of its attention (`context_size`).

The prompt is laid out by one rule ([`audio_prompt`]): the text config's BOS, then as many audio tokens
(`audio_token_id`) as the model's own `get_audio_features` returns embeddings for those features (Voxtral), or as
its audio tower's own output length for them (`_get_feat_extract_output_lengths`: Qwen2-Audio, which also takes a
`feature_attention_mask`, all ones: nothing padded), then the prompt. A model with neither cannot be laid out
([`counts_audio_tokens`]), and is refused (`exporters.capture.modalities`).

Example:
    >>> from transformers import VoxtralConfig
    >>> config = VoxtralConfig(audio_config={"num_mel_bins": 16, "max_source_positions": 32})
    >>> extractor = extractor_from_config(config.audio_config, frames=64)
    >>> extractor.feature_size, extractor.nb_max_frames
    (16, 64)
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import WhisperFeatureExtractor

from exporters.capture.families import audio_config_of
from exporters.capture.multimodal import Preprocessor, synthetic_waveform, whole_counts
from exporters.errors import UnsupportedModelError, describe_error

SAMPLING_RATE, HOP_LENGTH, N_FFT = 16000, 160, 400  # Voxtral's and Qwen2-Audio's extractors (Whisper's)
AUDIO_ENCODER = "audio_encoder"  # upstream's name for an audio-language model's audio stage
STACKED = 2  # Granite Speech's extractor stacks two log-mel frames into one encoder frame


def fixed_audio_stage(name: str, components) -> bool:
    """Whether component `name` is an audio stage of an audio-language export (its `audio_encoder`, and the
    projector after it), traced at its features' size under `dynamic: true` unless the recipe gives it
    `dynamic_shapes`: the audio's length is not the prompt's, one clip of the traced length is what the runners take
    (a Voxtral program's `audio_encoder` takes any number of its chunks: `exporters.capture.multimodal_runner`), and `Dim.AUTO` on Granite Speech's frames keeps its Conformer's
    `math.ceil(frames / context_size)` symbolic, which a `.pt2` cannot serialize.

    Example:
        >>> fixed_audio_stage("multi_modal_projector", {"audio_encoder": None}), fixed_audio_stage("decode", {})
        (True, False)
    """
    return AUDIO_ENCODER in components and name in (AUDIO_ENCODER, "multi_modal_projector")


def stacks_frames(audio_config) -> bool:
    """Whether the speech encoder reads log-mel frames stacked in pairs, `[batch, frames, input_dim]` (Granite
    Speech: an `input_dim`, which its config also calls `num_mel_bins`, and no `max_source_positions`), rather than
    `[batch, bins, frames]` (Whisper-style).

    Example:
        >>> from types import SimpleNamespace
        >>> stacks_frames(SimpleNamespace(input_dim=160)), stacks_frames(SimpleNamespace(num_mel_bins=16))
        (True, False)
    """
    return isinstance(getattr(audio_config, "input_dim", None), int) and \
        getattr(audio_config, "max_source_positions", None) is None


def encoder_frames(model) -> int:
    """How many feature frames the audio encoder takes: its source positions times the strides of the
    convolutions before them (Whisper-style encoders: `conv1`, `conv2`), else twice its source positions.

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(audio_config=SimpleNamespace(max_source_positions=32))
        >>> encoder_frames(SimpleNamespace(config=config))
        64
    """
    audio = audio_config_of(model)
    if stacks_frames(audio):  # one block of its attention, each frame two log-mel frames (see the module)
        return STACKED * int(getattr(audio, "context_size", 100))
    positions = int(audio.max_source_positions)
    tower = audio_tower(model)
    strides = [getattr(getattr(tower, name, None), "stride", None) for name in ("conv1", "conv2")]
    if all(isinstance(stride, tuple) for stride in strides):
        return positions * int(strides[0][0]) * int(strides[1][0])
    return 2 * positions


def extractor_from_config(audio_config, frames: int) -> WhisperFeatureExtractor:
    """A log-mel feature extractor for `frames` frames of `audio_config.num_mel_bins` bins (see the module)."""
    bins = getattr(audio_config, "num_mel_bins", None)
    if stacks_frames(audio_config):
        bins = audio_config.input_dim // STACKED
    if not isinstance(bins, int):
        raise UnsupportedModelError(f"{type(audio_config).__name__} gives no num_mel_bins: add the model's feature "
                                    "extractor (preprocessor_config.json) to the folder, which makes its inputs")
    seconds = frames * HOP_LENGTH / SAMPLING_RATE
    extractor = WhisperFeatureExtractor(feature_size=bins, sampling_rate=SAMPLING_RATE, hop_length=HOP_LENGTH,
                                        n_fft=N_FFT, chunk_length=int(seconds) if seconds.is_integer() else seconds)
    return whole_counts(extractor)


def audio_features(model, spec, pre: Preprocessor | None) -> tuple[torch.Tensor, str]:
    """`input_features` (batch x mel bins x frames; batch x frames / 2 x 2 bins where the encoder stacks frames)
    from synthetic waveforms, and how they were made."""
    frames = encoder_frames(model)
    if spec.audio_length and spec.audio_length != frames:
        raise UnsupportedModelError(f"inputs.audio_length is {spec.audio_length} but {type(model).__name__}'s audio "
                                    f"encoder takes exactly {frames} frames: remove inputs.audio_length or set it to "
                                    f"{frames}")
    extractor = getattr(pre.obj, "feature_extractor", pre.obj) if pre is not None else None
    audio = audio_config_of(model)
    if extractor is None or not callable(extractor):
        extractor, made = extractor_from_config(audio, frames), "the audio config"
    else:
        extractor, made = whole_counts(extractor), f"the folder's {type(extractor).__name__}"
    rate = int(getattr(extractor, "sampling_rate", SAMPLING_RATE))
    seconds = frames * int(getattr(extractor, "hop_length", HOP_LENGTH)) / rate
    waves = [synthetic_waveform(rate, seconds, spec.seed + row) for row in range(spec.batch_size)]
    try:
        features = extractor(waves, sampling_rate=rate, return_tensors="pt")["input_features"]
    except Exception as err:  # an extractor that cannot make this model's features: say which, and what to do
        raise UnsupportedModelError(f"{made} cannot make audio features ({describe_error(err, 200)}): save the "
                                    "model's feature extractor into the folder") from err
    stacked = stacks_frames(audio) and features.shape[-1] == audio.input_dim  # the folder's own Granite extractor
    axis = 1 if stacked else -1
    length = frames // STACKED if stacked else frames
    features = features.narrow(axis, 0, min(length, features.shape[axis]))
    if features.shape[axis] < length:
        pad = [0, 0, 0, length - features.shape[axis]] if stacked else [0, length - features.shape[-1]]
        features = torch.nn.functional.pad(features, pad)
    if stacks_frames(audio) and not stacked:  # [batch, bins, frames] -> [batch, frames / 2, 2 x bins]
        features = features.transpose(1, 2).reshape(features.shape[0], -1, audio.input_dim)
    return features.contiguous(), f"sample inputs: log-mel features of a synthetic waveform made by {made}"


def audio_tower(model) -> Any:
    """The model's audio encoder module (`audio_tower`), or None."""
    return getattr(getattr(model, "model", model), "audio_tower", None) or getattr(model, "audio_tower", None)


def counts_audio_tokens(model) -> bool:
    """Whether the model's own code says how many audio tokens its features take: `get_audio_features` (Voxtral) or
    its audio tower's output lengths (Qwen2-Audio).

    Example:
        >>> from types import SimpleNamespace
        >>> counts_audio_tokens(SimpleNamespace(model=SimpleNamespace()))
        False
    """
    if callable(getattr(model, "get_audio_features", None)):
        return True
    return callable(getattr(audio_tower(model), "_get_feat_extract_output_lengths", None))


def _audio_token_count(model, features: torch.Tensor, mask: torch.Tensor | None) -> int:
    """How many audio tokens one row's features take, by the model's own rule (see [`counts_audio_tokens`])."""
    with torch.no_grad():
        if callable(getattr(model, "get_audio_features", None)):
            embeds = model.get_audio_features(features[:1])
            embeds = getattr(embeds, "pooler_output", embeds)
            return int(embeds.reshape(-1, embeds.shape[-1]).shape[0])
        frames = mask[:1].sum(-1) if mask is not None else torch.tensor([features.shape[-1]])
        _, lengths = audio_tower(model)._get_feat_extract_output_lengths(frames)
        return int(lengths[0])


def audio_prompt(model, features: torch.Tensor, text_ids: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """The prompt's ids: BOS, one audio token per embedding the model's audio takes for a row (see the module), the
    prompt."""
    config = model.config
    audio_token = getattr(config, "audio_token_id", None)
    if not isinstance(audio_token, int):
        raise UnsupportedModelError(f"{type(config).__name__} names no audio token (audio_token_id): cannot lay out "
                                    "the audio in the prompt; set it in config.json")
    count = _audio_token_count(model, features, mask)
    bos = getattr(config.get_text_config(), "bos_token_id", None)
    prefix = ([bos] if isinstance(bos, int) else []) + [audio_token] * count
    return torch.cat([torch.tensor([prefix] * text_ids.shape[0]), text_ids], dim=1)


def synthesize_audio_language(model, spec, text_ids: torch.Tensor,
                              pre: Preprocessor | None) -> tuple[dict[str, Any], str]:
    """The inputs of one `model(**inputs)` / `model.generate(**inputs)` call (see the module), and a note saying
    how the features were made."""
    features, note = audio_features(model, spec, pre)
    takes_mask = "feature_attention_mask" in inspect.signature(model.forward).parameters
    mask = torch.ones(features.shape[0], features.shape[-1], dtype=torch.long) if takes_mask else None
    ids = audio_prompt(model, features, text_ids, mask)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "input_features": features}
    if mask is not None:  # Qwen2-Audio: which frames are audio (all: nothing padded)
        inputs["feature_attention_mask"] = mask
    return inputs, note
