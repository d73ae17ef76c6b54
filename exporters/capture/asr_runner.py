"""The ExecuTorch speech layout: which targets get it, and its two components.

A speech encoder-decoder's ExecuTorch generation target (Whisper, Speech2Text: a spectrogram `input_features` in;
Moonshine, SpeechT5: a raw waveform `input_values`) is, by default (`layout` unset or `"runner"`), one program in the
contract of ExecuTorch's ASR runner (`Seq2SeqRunner`) and optimum-executorch's `ExecuTorchModelForSpeechSeq2Seq`: a
method `encoder` (the spectrogram, or the waveform as `[1, 1, samples]`, at the traced size: the runner passes the
tensor its caller preprocessed and reads its three sizes) and
a method `text_decoder` (one token, the encoder's states, its cache position; the self-attention cache static,
inside the program), and the constant metadata methods they read (`exporters.upstream.asr_runner`). `layout:
"methods"` keeps the program with a method per generation component (encoder, prefill, decode taking and returning
the cache).

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> target = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
    >>> wants_asr(target, "speech-seq2seq", {"input_features": None}, "static", batch_size=1)
    True
    >>> wants_asr(target, "speech-seq2seq", {"input_values": None}, "static", batch_size=1)
    True
    >>> wants_asr(target, "text", {"input_ids": None}, "static", batch_size=1)
    False
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.llm_runner import RUNNER, program_reasons
from exporters.errors import TargetPlanError
from exporters.upstream import asr_runner

ENCODER, TEXT_DECODER = asr_runner.ENCODER, asr_runner.TEXT_DECODER
COMPONENTS = (ENCODER, TEXT_DECODER)
# the speech inputs the encoder method takes: a spectrogram, or a raw waveform (fed as [1, 1, samples])
SOURCES = ("input_features", "input_values")
NOT_ASR = ("the ExecuTorch program has a method per component (layout 'methods'), not the ASR runner's layout "
           "(`encoder` + `text_decoder`): {why}")


def is_asr(components: Any) -> bool:
    """Whether captured or written `components` are the speech layout's two methods.

    Example:
        >>> is_asr({"encoder": None, "text_decoder": None}), is_asr(["encoder", "prefill", "decode"])
        (True, False)
    """
    return set(components) == set(COMPONENTS)


def speech_source(generate_inputs: dict[str, Any]) -> str | None:
    """The model's speech input among `generate_inputs` (`input_features` or `input_values`), None without one.

    Example:
        >>> speech_source({"input_values": None, "attention_mask": None}), speech_source({"input_ids": None})
        ('input_values', None)
    """
    return next((name for name in SOURCES if name in generate_inputs), None)


def program_input(generate_inputs: dict[str, Any]) -> torch.Tensor:
    """The tensor the `encoder` method takes, from the sample's speech input: the spectrogram as it is, a waveform
    `[batch, samples]` as `[batch, 1, samples]` (three sizes, as the runner reads them).

    Example:
        >>> tuple(program_input({"input_values": torch.zeros(1, 8)}).shape)
        (1, 1, 8)
    """
    source = speech_source(generate_inputs)
    tensor = generate_inputs[source]
    return tensor[:, None, :] if source == "input_values" else tensor


def wants_asr(target: Any, family: str, generate_inputs: dict[str, Any], cache_implementation: str,
              batch_size: int = 1) -> bool:
    """Whether an ExecuTorch target is exported in the speech layout: a generation target of a speech
    encoder-decoder on a spectrogram (`input_features`) or a raw waveform (`input_values`), at batch 1 with a static
    cache, no per-component settings of the methods layout, on XNNPACK, whose recipe leaves `layout` unset or asks
    for `"runner"`. Raises [`TargetPlanError`] when `"runner"` is asked for what the layout cannot hold, or a setting
    of the LLM runner's program (`custom_ops`, `external_weights`) is set for a speech model."""
    if target.export_format != "executorch" or target.mode != "generation" or family != "speech-seq2seq":
        return False
    layout = getattr(target, "layout", None)
    if layout not in (None, RUNNER):
        return False
    kept = [key for key in ("custom_ops", "external_weights") if getattr(target, key, None) is not None]
    if kept:  # a setting of the LLM runner's program: never silently dropped
        raise TargetPlanError(f"{kept[0]} applies to the ExecuTorch LLM runner's program (a decoder-only model); "
                              f"this speech model's program has no such setting: remove {kept[0]}", option=kept[0])
    reasons = []
    if speech_source(generate_inputs) is None:
        reasons.append("the model's encoder takes no spectrogram `input_features` nor waveform `input_values` (the "
                       "runner feeds one)")
    reasons += program_reasons(target, cache_implementation, batch_size)
    if target.components or target.dynamic_shapes or target.dynamic:
        reasons.append("the target sets per-component settings, dynamic or dynamic_shapes of the methods layout")
    if not reasons:
        return True
    if layout == RUNNER:
        raise TargetPlanError(f"layout 'runner' cannot be exported for this speech model: {'; '.join(reasons)}; use "
                              "layout 'methods'", option="layout")
    return False


def capture(model: Any, generate_inputs: dict[str, Any], max_cache_len: int, decoder_start: int
            ) -> dict[str, tuple[Any, dict]]:
    """`{"encoder": ..., "text_decoder": ...}`: each program with the inputs it is traced with (the sample's
    spectrogram or waveform, [`program_input`]; the decoder's start token at cache position 0 over the encoder's
    states of that input)."""
    source = speech_source(generate_inputs)
    features = program_input(generate_inputs)
    if features.shape[0] != 1:
        raise TargetPlanError(f"the speech layout runs batch 1; the sample has batch {features.shape[0]}",
                              option="layout")
    encoder = asr_runner.encoder_program(model, source).eval()
    with torch.no_grad():
        encoded = encoder(features)["last_hidden_state"]
    modules = asr_runner.asr_modules(model, max_cache_len, encoded.shape[1], source)
    decoder_inputs = {"decoder_input_ids": torch.tensor([[decoder_start]], dtype=torch.long),
                      "encoder_hidden_states": encoded.detach().clone(),
                      "cache_position": torch.tensor([0], dtype=torch.long)}
    return {ENCODER: (modules[ENCODER], {source: features.clone()}),
            TEXT_DECODER: (modules[TEXT_DECODER], decoder_inputs)}


def refused(target: Any, model: Any, generate_inputs: dict[str, Any], decoder_start: int) -> str | None:
    """Why the model cannot run as the speech program, as the report says it when the layout was the default (None
    when it can): both programs run once, eagerly, two decoder steps on a small cache. Raises
    [`TargetPlanError`] when the recipe asked for `layout: "runner"`."""
    try:
        source = speech_source(generate_inputs)
        components = capture(model, {source: generate_inputs[source][:1]}, 4, decoder_start)
        module, inputs = components[TEXT_DECODER]
        with torch.no_grad():
            module(**inputs)
            module(**{**inputs, "cache_position": torch.tensor([1], dtype=torch.long)})
        return None
    except Exception as err:  # the model's own code refused the wrappers: the methods layout holds it
        problem = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    if getattr(target, "layout", None) == RUNNER:
        raise TargetPlanError(f"layout 'runner' cannot be exported: {type(model).__name__} does not run as the speech "
                              f"program ({problem}); use layout 'methods'", option="layout")
    return NOT_ASR.format(why=f"{type(model).__name__} does not run as the speech program ({problem})")
