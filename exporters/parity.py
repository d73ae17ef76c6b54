"""Generation parity: greedy decoding driven by the exported components only, from raw inputs, against eager
`generate(do_sample=False)`, token for token.

- decoder-only: prompt → `prefill` → `decode` × N;
- decoder-only, merged graph: prompt on an empty cache → `model` → `model` × N (one token each);
- encoder-decoder (T5, Whisper): source ids / audio features → `encoder` → `prefill` → `decode` × N;
- vision-language (LLaVA convention): image → `image_encoder` → feature selection → `multi_modal_projector`;
  prompt → `embed_tokens`; image features merged at the image tokens → `language_model` → `lm_head` → `decode` × N.

Between graphs only the glue the model's own forward does in Python runs here: feature-layer selection, the
token merge, argmax.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .errors import describe_error
from .results import GenerationReport
from .upstream import run_component

CACHE_KEYS = ("cache", "past_key_values")


@dataclass
class _Stepper:
    """Feeds the exported decode one token at a time, like the captured template."""

    runner: Any
    template: dict[str, Any]

    def __call__(self, token: torch.Tensor, position: int, cache: Any, extra: dict[str, Any] | None = None) -> Any:
        inputs = step_inputs(self.template, token[:, None], position, cache)
        inputs.update(extra or {})
        return run_component(self.runner, inputs)


def _cache_key(template: dict[str, Any]) -> str | None:
    return next((key for key in CACHE_KEYS if key in template), None)


def _output_cache(output: Any) -> Any:
    for key in CACHE_KEYS:
        if key in output:
            return output[key]
    raise KeyError("the component returns no cache")


def step_inputs(template: dict[str, Any], ids: torch.Tensor, start: int, cache: Any) -> dict[str, Any]:
    """A call like the captured `template`, for token `ids` at positions `start…`, with `cache`."""
    inputs = copy.deepcopy({k: v for k, v in template.items() if k not in CACHE_KEYS})
    batch, length = ids.shape
    positions = torch.arange(start, start + length).unsqueeze(0).expand(batch, -1)
    token_key = "decoder_input_ids" if "decoder_input_ids" in template else "input_ids"
    inputs[token_key] = ids
    for key in ("position_ids", "decoder_position_ids"):
        if key in inputs and isinstance(inputs[key], torch.Tensor) and inputs[key].dim() == 2:
            inputs[key] = positions.clone()
    if "cache_position" in inputs:
        inputs["cache_position"] = torch.arange(start, start + length)
    mask_key = "decoder_attention_mask" if token_key == "decoder_input_ids" else "attention_mask"
    mask = inputs.get(mask_key)
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        inputs[mask_key] = torch.ones(batch, start + length, dtype=mask.dtype)
    key = _cache_key(template)
    if key is not None:
        inputs[key] = cache
    return inputs


# Logits processors that change greedy choices: parity compares plain greedy decoding (argmax, stop at EOS), so the
# eager reference runs without them.
_PROCESSOR_SETTINGS = {
    "min_new_tokens": None, "min_length": 0, "repetition_penalty": None, "no_repeat_ngram_size": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "bad_words_ids": None, "encoder_repetition_penalty": None, "sequence_bias": None, "renormalize_logits": False,
}


@dataclass
class _Greedy:
    """Greedy decoding settings shared by the eager and the exported side."""

    steps: int
    eos: set[int]
    pad: int

    @classmethod
    def from_config(cls, generation_config, steps: int) -> _Greedy:
        eos = generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = generation_config.pad_token_id
        if pad is None:
            pad = min(eos_ids) if eos_ids else 0
        return cls(steps, eos_ids, int(pad))


def _eager_tokens(model, generate_inputs: dict[str, Any], generation_config, greedy: _Greedy,
                  prefix: torch.Tensor) -> torch.Tensor:
    """Eager `generate(do_sample=False)`: up to `steps` new tokens, stopping at EOS, without logits processors."""
    config = copy.deepcopy(generation_config)
    config.max_new_tokens = greedy.steps
    config.do_sample = False
    for name, value in _PROCESSOR_SETTINGS.items():
        if hasattr(config, name):
            setattr(config, name, value)
    with torch.no_grad():
        sequences = model.generate(**copy.deepcopy(generate_inputs), generation_config=config)
    # Decoder-only models return the prompt first; encoder-decoders the decoder's start tokens (Whisper strips them).
    start = prefix.shape[1]
    if sequences.shape[1] >= start and torch.equal(sequences[:, :start].cpu(), prefix.cpu()):
        return sequences[:, start:]
    return sequences


def _until_eos(row: list[int], greedy: _Greedy) -> list[int]:
    """A row's tokens before its first EOS: how models format the end (kept, stripped, padded) varies."""
    for index, token in enumerate(row):
        if token in greedy.eos:
            return row[:index]
    return row


def _compare(eager: torch.Tensor, tokens: list[torch.Tensor], greedy: _Greedy, prompt: int) -> GenerationReport:
    produced = torch.stack(tokens, dim=1).tolist()
    expected = eager.tolist()
    want = [_until_eos(row, greedy) for row in expected]
    got = [_until_eos(row, greedy) for row in produced]
    divergence = None
    for row, (a, b) in enumerate(zip(want, got)):
        for step in range(max(len(a), len(b))):
            left = a[step] if step < len(a) else "EOS"
            right = b[step] if step < len(b) else "EOS"
            if left != right:
                divergence = {"batch": row, "step": step, "eager": left, "exported": right}
                break
        if divergence:
            break
    return GenerationReport("passed" if divergence is None else "failed", greedy.steps, prompt, len(expected),
                            expected, produced, divergence)


def _decode_loop(first_logits: torch.Tensor, cache: Any, position: int, greedy: _Greedy, stepper: _Stepper,
                 tokens: list[torch.Tensor], extra: dict[str, Any] | None = None) -> None:
    """Argmax, feed back, until `steps` tokens or every row has emitted EOS (finished rows then emit padding)."""
    logits = first_logits
    finished = torch.zeros(first_logits.shape[0], dtype=torch.bool)
    for step in range(greedy.steps):
        next_token = logits[:, -1].argmax(-1)
        next_token = torch.where(finished, torch.full_like(next_token, greedy.pad), next_token)
        tokens.append(next_token)
        finished |= torch.isin(next_token, torch.tensor(sorted(greedy.eos), dtype=next_token.dtype))
        if step == greedy.steps - 1 or bool(finished.all()):
            return
        out = stepper(next_token, position, cache, extra)
        logits, cache = out["logits"], _output_cache(out)
        position += 1


def _prefix(components, generate_inputs: dict[str, Any], family: str) -> torch.Tensor:
    if family in ("seq2seq", "speech-seq2seq"):
        return components["prefill"][1]["decoder_input_ids"]
    return generate_inputs["input_ids"]


def eager_reference(model, components, generate_inputs: dict[str, Any], steps: int, generation_config,
                    family: str) -> torch.Tensor | None:
    """The eager tokens [`generation_parity`] compares with, computed ahead (so the eager model can be released
    before the artifact is loaded); None where parity does not run."""
    if getattr(generation_config, "cache_implementation", None) == "static" or family not in PARITY_FAMILIES:
        return None
    greedy = _Greedy.from_config(generation_config, steps)
    return _eager_tokens(model, generate_inputs, generation_config, greedy, _prefix(components, generate_inputs, family))


PARITY_FAMILIES = ("text", "seq2seq", "speech-seq2seq", "vision-language")


def generation_parity(model, components, exported, generate_inputs: dict[str, Any], steps: int,
                      generation_config, family: str, reference: torch.Tensor | None = None) -> GenerationReport:
    """Run the family's pipeline through the exported graphs and compare with eager `generate()` (`reference`: its
    tokens from [`eager_reference`], else computed here)."""
    names = set(exported.components)
    if getattr(generation_config, "cache_implementation", None) == "static":
        return GenerationReport("skipped", steps, reason="parity is not run for static-cache exports yet")
    drivers = {
        "text": (_decoder_only, {"prefill", "decode"}),
        "seq2seq": (_encoder_decoder, {"encoder", "prefill", "decode"}),
        "speech-seq2seq": (_encoder_decoder, {"encoder", "prefill", "decode"}),
        "vision-language": (_vision_language,
                            {"image_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head",
                             "decode"}),
    }
    if family not in drivers:
        return GenerationReport("skipped", steps, reason=f"parity from raw inputs is not implemented for {family} "
                                                          "models")
    driver, needed = drivers[family]
    if family == "text" and "model" in names:
        driver, needed = _merged_decoder, {"model"}
    missing = sorted(needed - names)
    if missing:
        return GenerationReport("failed", steps, reason=f"cannot generate from raw inputs: missing component(s) "
                                                        f"{missing}")
    greedy = _Greedy.from_config(generation_config, steps)
    eager = reference if reference is not None else _eager_tokens(
        model, generate_inputs, generation_config, greedy, _prefix(components, generate_inputs, family))
    tokens: list[torch.Tensor] = []
    try:
        prompt = driver(model, components, exported.runners, generate_inputs, greedy, tokens)
    except NotImplementedError as err:
        return GenerationReport("skipped", steps, reason=str(err))
    except Exception as err:  # an artifact that cannot generate is a failed check, with the reason
        return GenerationReport("failed", steps, None, int(eager.shape[0]), eager.tolist(),
                                torch.stack(tokens, 1).tolist() if tokens else [],
                                first_divergence={"step": len(tokens)}, reason=describe_error(err))
    return _compare(eager, tokens, greedy, prompt)


def _decoder_only(model, components, runners, generate_inputs, greedy: _Greedy, tokens) -> int:
    prefill_template = components["prefill"][1]
    key = _cache_key(prefill_template)
    ids = generate_inputs["input_ids"]
    empty = copy.deepcopy(prefill_template[key]) if key else None
    out = run_component(runners["prefill"], step_inputs(prefill_template, ids, 0, empty))
    stepper = _Stepper(runners["decode"], components["decode"][1])
    _decode_loop(out["logits"], _output_cache(out), ids.shape[1], greedy, stepper, tokens)
    return int(ids.shape[1])


def _merged_decoder(model, components, runners, generate_inputs, greedy: _Greedy, tokens) -> int:
    from .merged import MERGED, prompt_inputs

    template = components[MERGED][1]
    ids = generate_inputs["input_ids"]
    out = run_component(runners[MERGED], prompt_inputs(template, ids))
    stepper = _Stepper(runners[MERGED], template)
    _decode_loop(out["logits"], _output_cache(out), ids.shape[1], greedy, stepper, tokens)
    return int(ids.shape[1])


def _encoder_decoder(model, components, runners, generate_inputs, greedy: _Greedy, tokens) -> int:
    encoder_template = components["encoder"][1]
    encoder_inputs = {**encoder_template, **{k: v for k, v in generate_inputs.items() if k in encoder_template}}
    encoded = run_component(runners["encoder"], encoder_inputs)
    prefill_template = components["prefill"][1]
    encoder_outputs = copy.deepcopy(prefill_template["encoder_outputs"])
    encoder_outputs["last_hidden_state"] = encoded["last_hidden_state"]
    extra = {"encoder_outputs": encoder_outputs}
    if "attention_mask" in prefill_template and "attention_mask" in generate_inputs:
        extra["attention_mask"] = generate_inputs["attention_mask"]
    key = _cache_key(prefill_template)
    start = prefill_template["decoder_input_ids"]
    inputs = step_inputs(prefill_template, start, 0, copy.deepcopy(prefill_template[key]) if key else None)
    inputs.update(extra)
    out = run_component(runners["prefill"], inputs)
    stepper = _Stepper(runners["decode"], components["decode"][1])
    _decode_loop(out["logits"], _output_cache(out), start.shape[1], greedy, stepper, tokens, extra)
    source = next(iter(generate_inputs.values()))
    return int(source.shape[-1])


def select_image_features(vision_outputs: Any, config) -> torch.Tensor:
    """LLaVA's feature selection: the configured hidden layer(s), without the CLS token for the default strategy."""
    layer = getattr(config, "vision_feature_layer", None)
    strategy = getattr(config, "vision_feature_select_strategy", None)
    if layer is None or "hidden_states" not in vision_outputs:
        raise NotImplementedError(
            f"feature selection for {type(config).__name__} is not implemented (LLaVA-style configs only)"
        )
    hidden = vision_outputs["hidden_states"]
    layers = [layer] if isinstance(layer, int) else list(layer)
    pool = [hidden[i] for i in layers]
    if strategy == "default":
        pool = [h[:, 1:] for h in pool]
    return pool[0] if len(pool) == 1 else torch.cat(pool, dim=-1)


def _vision_language(model, components, runners, generate_inputs, greedy: _Greedy, tokens) -> int:
    config = model.config
    vision_template = components["image_encoder"][1]
    vision_inputs = dict(vision_template)
    vision_inputs["pixel_values"] = generate_inputs["pixel_values"]
    vision = run_component(runners["image_encoder"], vision_inputs)
    selected = select_image_features(vision, config)
    projector_template = components["multi_modal_projector"][1]
    feature_key = next(iter(projector_template))
    projected = run_component(runners["multi_modal_projector"], {**projector_template, feature_key: selected})
    projected = projected if isinstance(projected, torch.Tensor) else next(iter(projected.values()))
    ids = generate_inputs["input_ids"]
    embeds = run_component(runners["embed_tokens"], {"input": ids})
    embeds = embeds if isinstance(embeds, torch.Tensor) else next(iter(embeds.values()))
    image_token = getattr(config, "image_token_id", None)
    if image_token is None:
        image_token = config.image_token_index
    mask = (ids == image_token).unsqueeze(-1).expand_as(embeds)
    merged = embeds.masked_scatter(mask, projected.reshape(-1, projected.shape[-1]).to(embeds.dtype))
    lm_template = components["language_model"][1]
    key = _cache_key(lm_template)
    lm_inputs = copy.deepcopy({k: v for k, v in lm_template.items() if k not in CACHE_KEYS})
    lm_inputs["inputs_embeds"] = merged
    if isinstance(lm_inputs.get("position_ids"), torch.Tensor):
        lm_inputs["position_ids"] = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    if key:
        lm_inputs[key] = copy.deepcopy(lm_template[key])
    hidden = run_component(runners["language_model"], lm_inputs)
    head_template = components["lm_head"][1]
    head_key = next(iter(head_template))
    logits = run_component(runners["lm_head"], {head_key: hidden["last_hidden_state"][:, -1:]})
    logits = logits if isinstance(logits, torch.Tensor) else next(iter(logits.values()))
    stepper = _Stepper(runners["decode"], components["decode"][1])
    _decode_loop(logits, _output_cache(hidden), ids.shape[1], greedy, stepper, tokens)
    return int(ids.shape[1])
