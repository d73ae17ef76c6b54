"""The ExecuTorch speech layout: which targets get it, and its two components.

A speech encoder-decoder's ExecuTorch generation target (Whisper: a spectrogram `input_features` in) is, by default
(`layout` unset or `"runner"`), one program in the contract of ExecuTorch's ASR runner (`Seq2SeqRunner`) and
optimum-executorch's `ExecuTorchModelForSpeechSeq2Seq`: a method `encoder` (the spectrogram, at the traced size) and
a method `text_decoder` (one token, the encoder's states, its cache position; the self-attention cache static,
inside the program), and the constant metadata methods they read (`exporters.upstream.asr_runner`). `layout:
"methods"` keeps the program with a method per generation component (encoder, prefill, decode taking and returning
the cache).

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> target = parse_recipe('{"export_format": "executorch", "mode": "generation"}').exports[0]
    >>> wants_asr(target, "speech-seq2seq", {"input_features": None}, "static", batch_size=1)
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
NOT_ASR = ("the ExecuTorch program has a method per component (layout 'methods'), not the ASR runner's layout "
           "(`encoder` + `text_decoder`): {why}")


def is_asr(components: Any) -> bool:
    """Whether captured or written `components` are the speech layout's two methods.

    Example:
        >>> is_asr({"encoder": None, "text_decoder": None}), is_asr(["encoder", "prefill", "decode"])
        (True, False)
    """
    return set(components) == set(COMPONENTS)


def wants_asr(target: Any, family: str, generate_inputs: dict[str, Any], cache_implementation: str,
              batch_size: int = 1) -> bool:
    """Whether an ExecuTorch target is exported in the speech layout: a generation target of a speech
    encoder-decoder on a spectrogram (`input_features`), at batch 1 with a static cache, no per-component settings
    of the methods layout, on XNNPACK, whose recipe leaves `layout` unset or asks for `"runner"`. Raises
    [`TargetPlanError`] when `"runner"` is asked for what the layout cannot hold, or a setting of the LLM runner's
    program (`custom_ops`, `external_weights`) is set for a speech model."""
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
    if "input_features" not in generate_inputs:
        reasons.append("the model's encoder takes no spectrogram `input_features` (the runner feeds one)")
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
    spectrogram; the decoder's start token at cache position 0 over the encoder's states of that spectrogram)."""
    features = generate_inputs["input_features"]
    if features.shape[0] != 1:
        raise TargetPlanError(f"the speech layout runs batch 1; the sample has batch {features.shape[0]}",
                              option="layout")
    encoder = asr_runner.EncoderProgram(model).eval()
    with torch.no_grad():
        encoded = encoder(features)["last_hidden_state"]
    modules = asr_runner.asr_modules(model, max_cache_len, encoded.shape[1])
    decoder_inputs = {"decoder_input_ids": torch.tensor([[decoder_start]], dtype=torch.long),
                      "encoder_hidden_states": encoded.detach().clone(),
                      "cache_position": torch.tensor([0], dtype=torch.long)}
    return {ENCODER: (modules[ENCODER], {"input_features": features.clone()}),
            TEXT_DECODER: (modules[TEXT_DECODER], decoder_inputs)}


def refused(target: Any, model: Any, generate_inputs: dict[str, Any], decoder_start: int) -> str | None:
    """Why the model cannot run as the speech program, as the report says it when the layout was the default (None
    when it can): both programs run once, eagerly, two decoder steps on a small cache. Raises
    [`TargetPlanError`] when the recipe asked for `layout: "runner"`."""
    try:
        components = capture(model, {"input_features": generate_inputs["input_features"][:1]}, 4, decoder_start)
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
