"""The ExecuTorch speech program (part of the adapter to upstream): Whisper-style encoder-decoders as the two methods
ExecuTorch's ASR runner (extension/asr/runner, `Seq2SeqRunner`) and optimum-executorch's
`ExecuTorchModelForSpeechSeq2Seq` load, built on transformers' static cache (`transformers.cache_utils`), reached
here only.

```
model ──► EncoderProgram      encoder(input_features [1, mels, frames]) -> {"last_hidden_state"}
      │   (a waveform model's WaveformEncoderProgram: encoder(input_values [1, 1, samples]), Moonshine, SpeechT5)
      └─► TextDecoderProgram  text_decoder(decoder_input_ids [1, 1], encoder_hidden_states, cache_position [1])
                               -> {"logits" [1, 1, vocab]}; the self-attention cache (static, max_cache_len) inside
```

optimum-executorch's `Seq2SeqLMExportableModule` writes the same two methods (and the constant `get_*` methods,
`decoder_start_token_id`): the runner runs `encoder` once, then `text_decoder` one token per call from
`decoder_start_token_id` at cache positions 0, 1, ... . Each call writes its token's keys and values at
`cache_position` (the write position is taken from it, so a call at 0 starts a new transcription); the cross-attention
keys and values are computed from `encoder_hidden_states` on every call into a static cache of the encoder's length
(as optimum-executorch's wrapper holds them; transformers' own keeps them in a `DynamicCache` built once, which a
second eager call reads stale and whose empty tensors the lowering cannot functionalize). A decoder's positions come
from the cache's length, which each call sets from `cache_position` (Moonshine's rotary positions, SpeechT5's
sinusoidal ones); SpeechT5's text decoder takes its tokens as `input_values` ([`token_input_name`]).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import EncoderDecoderCache, StaticCache
from transformers.configuration_utils import get_head_shapes

# The runner's method names (extension/asr/runner/seq2seq_runner.cpp: kEncoderMethodName, kDecoderMethodName)
ENCODER, TEXT_DECODER = "encoder", "text_decoder"
FLOAT_DTYPE_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}


class EncoderProgram(torch.nn.Module):
    """`encoder(input_features) -> {"last_hidden_state"}`: the model's encoder on a fixed-size spectrogram."""

    def __init__(self, model: Any):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"last_hidden_state": self.encoder(input_features=input_features).last_hidden_state}


class WaveformEncoderProgram(EncoderProgram):
    """`encoder(input_values [1, 1, samples]) -> {"last_hidden_state"}`: the encoder of a model on a raw waveform
    (Moonshine, SpeechT5), the waveform at the traced length as a three-dimensional tensor (one channel, as a
    spectrogram's bins: the runner's `transcribe()` reads its input's three sizes)."""

    def forward(self, input_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"last_hidden_state": self.encoder(input_values=input_values.flatten(1)).last_hidden_state}


def encoder_program(model: Any, source: str = "input_features") -> EncoderProgram:
    """The encoder method's module for the model's speech input `source` (`input_features` or `input_values`).

    Example:
        >>> model = type("M", (), {"get_encoder": lambda self: torch.nn.Identity()})()
        >>> type(encoder_program(model, "input_values")).__name__
        'WaveformEncoderProgram'
    """
    return (WaveformEncoderProgram if source == "input_values" else EncoderProgram)(model)


class TextDecoderProgram(torch.nn.Module):
    """`text_decoder(decoder_input_ids, encoder_hidden_states, cache_position) -> {"logits"}`: the decoder and its
    output projection, the self-attention cache a static one of `max_cache_len` positions held as buffers."""

    def __init__(self, model: Any, max_cache_len: int, encoder_length: int):
        super().__init__()
        self.decoder = model.get_decoder()
        self.token_input = token_input_name(self.decoder)
        self.proj_out = model.get_output_embeddings()
        self.config = model.config
        self.static_cache = self._cache("", max_cache_len, model.dtype)
        self.cross_cache = self._cache("cross_", encoder_length, model.dtype)
        self.cache = EncoderDecoderCache(self.static_cache, self.cross_cache)  # built while both are empty

    def _cache(self, prefix: str, length: int, dtype: torch.dtype) -> StaticCache:
        """A static cache of `length` positions whose tensors are this module's buffers (what the program keeps)."""
        cache = StaticCache(config=self.config, max_cache_len=length)
        heads, head_dim = decoder_head_shapes(self.config)
        cache.early_initialization(1, heads, head_dim, dtype, torch.device("cpu"))
        for i, layer in enumerate(cache.layers):
            self.register_buffer(f"{prefix}key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"{prefix}value_cache_{i}", layer.values, persistent=False)
            self.register_buffer(f"{prefix}cumulative_length_{i}", layer.cumulative_length, persistent=False)
        return cache

    def _bind(self, prefix: str, cache: StaticCache) -> None:
        """Point the cache's layers at this module's buffers as the call sees them (a non-strict trace swaps the
        buffers for its own tensors: a layer still holding the originals would be traced as constants)."""
        for i, layer in enumerate(cache.layers):
            layer.keys, layer.values = getattr(self, f"{prefix}key_cache_{i}"), getattr(self, f"{prefix}value_cache_{i}")
            layer.cumulative_length = getattr(self, f"{prefix}cumulative_length_{i}")

    def forward(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor,
                cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        self._bind("", self.static_cache)
        self._bind("cross_", self.cross_cache)
        for layer in self.static_cache.layers:  # the write position is the call's (0: a new transcription)
            layer.cumulative_length.copy_(cache_position[0])
        for layer in self.cross_cache.layers:  # the cross keys and values are written anew from position 0
            layer.cumulative_length.zero_()
        # every call computes the cross keys: the flags would otherwise keep the first call's
        self.cache.is_updated = {i: False for i in range(len(self.cross_cache.layers))}
        tokens = {self.token_input: decoder_input_ids}
        hidden = self.decoder(**tokens, encoder_hidden_states=encoder_hidden_states, cache=self.cache,
                              use_cache=True).last_hidden_state
        return {"logits": self.proj_out(hidden)}


def decoder_head_shapes(config: Any) -> tuple[Any, Any]:
    """`(heads, head_dim)` of the decoder's attention: an encoder-decoder config's `decoder_attention_heads` where it
    has them (Whisper's `num_attention_heads` is its encoder's), else transformers' `get_head_shapes`.

    Example:
        >>> from transformers import WhisperConfig
        >>> decoder_head_shapes(WhisperConfig(d_model=32, encoder_attention_heads=4, decoder_attention_heads=2))
        (2, 16)
    """
    heads = getattr(config, "decoder_attention_heads", None)
    if isinstance(heads, int):
        hidden = getattr(config, "d_model", None) or config.hidden_size
        return heads, getattr(config, "head_dim", None) or hidden // heads
    return get_head_shapes(config)


def asr_modules(model: Any, max_cache_len: int, encoder_length: int, source: str = "input_features"
                ) -> dict[str, torch.nn.Module]:
    """`{"encoder": EncoderProgram, "text_decoder": TextDecoderProgram}` of an encoder-decoder speech model (eval);
    `encoder_length`: the positions of the encoder's states (the spectrogram or waveform is fixed, so are they);
    `source`: the model's speech input ([`encoder_program`])."""
    return {ENCODER: encoder_program(model, source).eval(),
            TEXT_DECODER: TextDecoderProgram(model, max_cache_len, encoder_length).eval()}


def asr_metadata(model: Any, max_cache_len: int, eos_ids: list[int], decoder_start: int | None) -> dict[str, Any]:
    """The constant methods of the program: what optimum-executorch's `ExecuTorchModelForSpeechSeq2Seq` reads
    (`get_max_seq_len`, `decoder_start_token_id`, `get_eos_id`, ...) and the runner's `get_eos_ids` (one output per
    id). None values are left out.

    Example:
        >>> asr_metadata(type("M", (), {"config": None, "dtype": torch.float32})(), 64, [2], 1)["get_eos_ids"]
        [2]
    """
    config = model.config
    values = {
        "get_max_seq_len": max_cache_len,
        "get_max_context_len": max_cache_len,
        "get_max_batch_size": 1,
        "get_bos_id": getattr(config, "bos_token_id", None),
        "get_eos_id": eos_ids[0] if eos_ids else None,
        "get_eos_ids": list(eos_ids) or None,
        "get_vocab_size": getattr(config, "vocab_size", None),
        "get_n_layers": getattr(config, "decoder_layers", None),
        "get_dtype": FLOAT_DTYPE_CODES.get(model.dtype),
        "decoder_start_token_id": decoder_start,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": False,
    }
    return {name: value for name, value in values.items() if value is not None}


def token_input_name(decoder: torch.nn.Module) -> str:
    """The argument a decoder takes its token ids by: `input_ids`, or SpeechT5's text decoder's `input_values` (its
    text prenet embeds them).

    Example:
        >>> token_input_name(type("D", (torch.nn.Module,), {"forward": lambda self, input_values=None: None})())
        'input_values'
    """
    parameters = inspect.signature(decoder.forward).parameters
    return "input_ids" if "input_ids" in parameters or "input_values" not in parameters else "input_values"
