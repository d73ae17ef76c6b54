"""Generation parity: greedy decoding driven by the exported components only, from raw inputs, against eager
`generate(do_sample=False)`, token for token.

- decoder-only: prompt → `prefill` → `decode` × N;
- decoder-only, merged graph: prompt on an empty cache → `model` → `model` × N (one token each); the ExecuTorch
  runner's program holds its cache itself: prompt at position 0 → `model` → `model` × N at each position;
- encoder-decoder (T5, Whisper): source ids / audio features → `encoder` → `prefill` → `decode` × N;
- vision-language (LLaVA, Idefics3 / SmolVLM, PaliGemma, Gemma 3, Qwen2-VL, ...): image + prompt → the model's own
  forward with its encoder(s), projector, `embed_tokens`, `language_model` and `lm_head` replaced by their graphs
  (`exporters.validate.vision_language`) → `decode` × N.

Between graphs only the glue the model's own forward does in Python runs here: feature selection, the token
merge, masks and position ids, and token selection by the rules of `exporters.validate.greedy` (eager's own logits
processors, then argmax).

Each step is fed as a runtime would: the cache the previous graph returned, the next `position_ids` (and
`cache_position` when the graph takes one), and the attention mask in the captured layout. A static cache
(`cache_implementation: "static"`) is the fixed-size `StaticCache` the graph writes into: its keys/values keep
`max_cache_len` slots, its `cumulative_length` leaf is the write position, and the mask is the 4D causal mask over
those slots (`[batch, 1, query, max_cache_len]`, true up to the current position); a model that takes one mask
per layer type (`{"full_attention": ..., "sliding_attention": ...}`) gets that mapping, each mask of the step's
position.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import torch

from exporters.capture.asr_runner import ENCODER, TEXT_DECODER, is_asr, program_input, speech_source
from exporters.capture.cache_settings import sliding_window_of
from exporters.capture.families import MULTIMODAL_GENERATORS
from exporters.capture.image_text import DECODER as IMAGE_TEXT_DECODER, components_for as image_text_components
from exporters.capture.merged import MERGED, prompt_inputs
from exporters.capture.multimodal_runner import TEXT_DECODER, components_of
from exporters.capture.stepped import STEPPED, other_prompts, zeroed_cache
from exporters.capture.steps import cache_input_name, output_cache, step_inputs
from exporters.errors import describe_error, recoverable
from exporters.report.results import GenerationReport
from exporters.upstream import run_component
from exporters.validate.greedy import DecodeStepper, Greedy, Tolerances, decode_loop, eager_reference
from exporters.validate.subject import EagerModel
from exporters.validate.native_log import native_messages
from exporters.validate.multimodal_runner import image_text_driver, multimodal_runner_driver
from exporters.validate.vision_language import vision_language


def _report(greedy: Greedy, tokens: list[torch.Tensor], prompt: int | None, cache: dict[str, Any] | None,
            reason: str | None = None, failed: bool = False) -> GenerationReport:
    produced = torch.stack(tokens, dim=1).tolist() if tokens else []
    eager = greedy.reference.tokens.tolist()
    divergence = greedy.divergence
    status = "failed" if failed or divergence is not None else "passed"
    if failed and divergence is None:
        divergence = {"step": len(tokens)}
    if status == "passed" and len(tokens) < 2:
        # Only the prefill's first token was compared: the decode graph never ran, so it was not checked.
        status, reason = "skipped", (f"generation stopped at EOS after {len(tokens)} token(s), so the decode graph "
                                     "was never run; use a prompt or generation settings that produce at least two "
                                     "tokens")
    return GenerationReport(status, greedy.steps, prompt, len(eager), eager, produced, divergence, reason,
                            near_ties=greedy.near_ties, logits_processors=greedy.reference.processor_names,
                            cache=cache)


def _cache_summary(generation_config) -> dict[str, Any]:
    if getattr(generation_config, "cache_implementation", None) == "static":
        return {"implementation": "static", "max_cache_len": getattr(generation_config, "max_cache_len", None)}
    return {"implementation": "dynamic"}


def generation_parity(subject: EagerModel, components, exported, steps: int, tolerances: Tolerances,
                      reference: Any = None, glue: dict[str, torch.Tensor] | None = None,
                      others: list[tuple[dict[str, Any], Any]] | None = None) -> GenerationReport:
    """Run the family's pipeline through the exported graphs and compare with eager `generate()` (`subject`: the
    eager model, its family, sample inputs and generation config), both selecting tokens by the processors eager
    builds (see `exporters.validate.greedy`). `reference`: eager's run, made ahead by
    [`reference_for`] (so the eager weights can be freed before the artifact loads); else it is made here. `glue`:
    the weights a vision-language forward reads itself, as the target folder holds them
    (`exporters.capture.components.read_glue`). A stepped prompt (`exporters.capture.stepped`) is run at a shorter
    and a longer prompt too: `others`, each `(generate_inputs, eager's reference)` ([`other_references`]), else made
    here."""
    model, family, generate_inputs = subject.model, subject.family, subject.generate_inputs
    generation_config = subject.generation_config
    names = set(exported.components)
    cache = _cache_summary(generation_config)
    if family not in DRIVERS:
        return GenerationReport("skipped", steps, reason=f"parity from raw inputs is not implemented for {family} "
                                                          "models", cache=cache)
    driver, needed = DRIVERS[family]
    needed = needed or set(components)
    if family in MULTIMODAL_GENERATORS:
        driver = functools.partial(vision_language, glue=glue or {})
    if family in MULTIMODAL_GENERATORS and TEXT_DECODER in names:  # ExecuTorch MultimodalRunner's program
        driver, needed = multimodal_runner_driver, set(components_of(family))
    if family in MULTIMODAL_GENERATORS and IMAGE_TEXT_DECODER in names:  # transformers.js's three graphs
        driver, needed = image_text_driver, set(image_text_components(family))
    if family == "text" and "model" in names:
        driver, needed = _merged_decoder, {"model"}
    elif family == "speech-seq2seq" and is_asr(components):  # the ASR runner's program: its cache inside
        driver, needed = _speech_program, set(components)
    elif family == "text" and set(components) == set(STEPPED):  # a state-space model's stepped prompt
        driver, needed = _stepped_prompt, set(STEPPED)
    missing = sorted(needed - names)
    if missing:
        return GenerationReport("failed", steps, reason=f"cannot generate from raw inputs: missing component(s) "
                                                        f"{missing}", cache=cache)
    prefix = _prefix(components, generate_inputs, family)
    limit = cache.get("max_cache_len")
    if limit is not None and prefix.shape[1] + steps > limit:
        return GenerationReport("failed", steps, reason=(
            f"the static cache holds {limit} positions, fewer than the prompt ({prefix.shape[1]}) plus max_new_tokens "
            f"({steps}): raise generation.max_cache_len or shorten the prompt"), cache=cache)
    if reference is None:
        reference = reference_for(model, generate_inputs, generation_config, steps)
    if isinstance(reference, BaseException):  # the reference could not run: the check did not run, it did not fail
        return GenerationReport("skipped", steps, reason=f"eager generate() failed: {describe_error(reference)}",
                                cache=cache)
    eos, pad = Greedy.special_tokens(generation_config)
    greedy = Greedy(steps, eos, pad, reference, tolerances)
    tokens: list[torch.Tensor] = []
    try:
        with native_messages():
            prompt = driver(model, components, exported.runners, generate_inputs, greedy, tokens)
    except NotImplementedError as err:
        report = _report(greedy, tokens, None, cache, reason=str(err))
        report.status = "skipped"
        return report
    except BaseException as err:  # an artifact that cannot generate is a failed check, with the reason
        if not recoverable(err):
            raise
        return _report(greedy, tokens, None, cache, reason=describe_error(err), failed=True)
    report = _report(greedy, tokens, prompt, cache)
    if driver is _stepped_prompt and report.status != "skipped":
        if others is None:
            others = other_references(model, generate_inputs, generation_config, steps)
        _at_other_prompts(report, components, exported.runners, others, Greedy(steps, eos, pad, reference,
                                                                                  tolerances))
    return report


def other_references(model, generate_inputs: dict[str, Any], generation_config, steps: int) -> list[tuple[dict, Any]]:
    """The shorter and the longer prompt a stepped target is checked at besides the sample's
    (`exporters.capture.stepped.other_prompts`, within a static cache), each with eager's run ([`reference_for`])."""
    limit = _cache_summary(generation_config).get("max_cache_len")
    return [(inputs, reference_for(model, inputs, generation_config, steps))
            for inputs in other_prompts(generate_inputs, steps, limit)]


def _at_other_prompts(report: GenerationReport, components, runners, others, template: Greedy) -> None:
    """The stepped prompt's parity at each of `others` (`(generate_inputs, reference)`), recorded in
    `report.other_prompts`: a divergence there fails the report (first_divergence names the prompt's length), one
    that could not run leaves it unverified."""
    for inputs, reference in others:
        length = int(inputs["input_ids"].shape[1])
        if isinstance(reference, BaseException):
            report.other_prompts.append({"prompt_length": length, "status": "skipped",
                                         "reason": f"eager generate() failed: {describe_error(reference)}"})
            continue
        greedy = dataclasses.replace(template, reference=reference, near_ties=[], divergence=None)
        tokens: list[torch.Tensor] = []
        error = None
        try:
            with native_messages():
                _stepped_prompt(None, components, runners, inputs, greedy, tokens)
        except BaseException as err:
            if not recoverable(err):
                raise
            error = describe_error(err)
        failed = error is not None or greedy.divergence is not None
        report.other_prompts.append({
            "prompt_length": length, "status": "failed" if failed else "passed",
            "eager_tokens": reference.tokens.tolist(),
            "exported_tokens": torch.stack(tokens, dim=1).tolist() if tokens else [],
            "first_divergence": greedy.divergence, "near_ties": greedy.near_ties, "reason": error})
    failed = next((other for other in report.other_prompts if other["status"] == "failed"), None)
    skipped = next((other for other in report.other_prompts if other["status"] == "skipped"), None)
    if failed is not None:
        report.status = "failed"
        if failed["reason"]:
            report.reason = f"at a prompt of {failed['prompt_length']} tokens: {failed['reason']}"
        elif report.first_divergence is None:
            report.first_divergence = {**failed["first_divergence"], "prompt_length": failed["prompt_length"]}
    elif skipped is not None and report.status == "passed":
        report.status, report.reason = "skipped", (f"not run at a prompt of {skipped['prompt_length']} tokens "
                                                   f"(besides the sample's): {skipped['reason']}")


def reference_for(model, generate_inputs: dict[str, Any], generation_config, steps: int) -> Any:
    """Eager's greedy run parity compares with (`exporters.validate.greedy.eager_reference`), or the exception it raised."""
    try:
        return eager_reference(model, generate_inputs, generation_config, steps)
    except BaseException as err:
        if not recoverable(err):
            raise
        return err


def _prefix(components, generate_inputs: dict[str, Any], family: str) -> torch.Tensor:
    """The tokens the decoder has seen before the first generated one."""
    if family in ("seq2seq", "speech-seq2seq"):
        return _decoder_start(components, generate_inputs)
    return generate_inputs["input_ids"]


def _decoder_start(components, generate_inputs: dict[str, Any], reference: Any = None) -> torch.Tensor:
    """The decoder prompt of each row of `generate_inputs`' batch: eager's own (`reference.prompt`: Whisper's start,
    language, task and no-timestamps tokens), else the captured prefill's first token (every row and position of its
    `decoder_input_ids` holds it; `dynamic: true` traces it at a larger batch and a longer prompt:
    `exporters.capture.probes.fit_encoder_decoder`)."""
    batch = int(next(iter(generate_inputs.values())).shape[0])
    prompt = getattr(reference, "prompt", None)
    if isinstance(prompt, torch.Tensor) and prompt.dim() == 2 and prompt.shape[0] == batch and prompt.shape[1] >= 1:
        return prompt.clone()
    first = components["prefill" if "prefill" in components else TEXT_DECODER][1]["decoder_input_ids"]
    return first[:1, :1].expand(batch, 1).clone()


def _decoder_only(model, components, runners, generate_inputs, greedy: Greedy, tokens) -> int:
    prefill_template = components["prefill"][1]
    key = cache_input_name(prefill_template)
    ids = generate_inputs["input_ids"]
    empty = copy.deepcopy(prefill_template[key]) if key else None  # a static cache: allocated by the graph
    window = sliding_window_of(model.config)
    out = run_component(runners["prefill"], step_inputs(prefill_template, ids, 0, empty, window))
    stepper = DecodeStepper(runners["decode"], components["decode"][1], window)
    decode_loop(out["logits"], output_cache(out), ids, greedy, stepper, tokens)
    return int(ids.shape[1])


def _stepped_prompt(model, components, runners, generate_inputs, greedy: Greedy, tokens) -> int:
    """The prompt fed to the exported decode one token at a time from zeroed states and an empty key-value cache
    (`exporters.capture.stepped`), then every generated token."""
    template = components["decode"][1]
    key = cache_input_name(template)
    ids = generate_inputs["input_ids"]
    stepper = DecodeStepper(runners["decode"], template)
    cache = zeroed_cache(template[key], ids.shape[0])
    out: dict[str, Any] = {}
    for position in range(ids.shape[1]):
        out = stepper(ids[:, position], position, cache)
        cache = output_cache(out)
    decode_loop(out["logits"], cache, ids, greedy, stepper, tokens)
    return int(ids.shape[1])


def _merged_decoder(model, components, runners, generate_inputs, greedy: Greedy, tokens) -> int:
    template = components[MERGED][1]
    ids = generate_inputs["input_ids"]
    if cache_input_name(template) is None:  # the runner layout: the cache is inside the program
        chunk = getattr(components[MERGED][0], "max_seq_len", None)
        return _stateful_decoder(runners[MERGED], template, ids, greedy, tokens, chunk)
    out = run_component(runners[MERGED], prompt_inputs(template, ids))
    stepper = DecodeStepper(runners[MERGED], template)
    decode_loop(out["logits"], output_cache(out), ids, greedy, stepper, tokens)
    return int(ids.shape[1])


def _stateful_decoder(runner, template, ids, greedy: Greedy, tokens, chunk: int | None = None) -> int:
    """The ExecuTorch LLM runner's program (`exporters.capture.llm_runner`): the prompt at position 0 in one call
    (in calls of `chunk` tokens, the program's `get_max_seq_len`, when it is longer: a ring-buffer layer's window),
    then one token per call at its position, as the runner feeds it; the program keeps the cache."""

    def call(step_ids: torch.Tensor, start: int) -> dict[str, Any]:
        return {"logits": run_component(runner, step_inputs(template, step_ids, start, None))["logits"], "cache": None}

    def stepper(token, position, cache, extra=None):
        return call(token[:, None], position)

    chunk = chunk or int(ids.shape[1])
    logits = [call(ids[:, start:start + chunk], start)["logits"] for start in range(0, ids.shape[1], chunk)][-1]
    decode_loop(logits, None, ids, greedy, stepper, tokens)
    return int(ids.shape[1])


def _speech_program(model, components, runners, generate_inputs, greedy: Greedy, tokens) -> int:
    """The ASR runner's program (`exporters.capture.asr_runner`) as the runner feeds it: `encoder` once, then
    `text_decoder` one token per call at its cache position (the decoder prompt eager starts from, then each
    selected token); the program keeps the self-attention cache."""
    source = speech_source(generate_inputs)  # a spectrogram, or a waveform the runner takes as [1, 1, samples]
    encoded = run_component(runners[ENCODER], {source: program_input(generate_inputs)})
    states = encoded["last_hidden_state"]

    def stepper(token, position, cache, extra=None):
        inputs = {"decoder_input_ids": token[:, None], "encoder_hidden_states": states,
                  "cache_position": torch.tensor([position], dtype=torch.long)}
        return {"logits": run_component(runners[TEXT_DECODER], inputs)["logits"], "cache": None}

    start = _decoder_start(components, generate_inputs, greedy.reference)
    out: dict[str, Any] = {}
    for position in range(start.shape[1]):
        out = stepper(start[:, position], position, None)
    decode_loop(out["logits"], None, start, greedy, stepper, tokens)
    return int(generate_inputs[source].shape[-1])


def _encoder_decoder(model, components, runners, generate_inputs, greedy: Greedy, tokens) -> int:
    encoder_template = components["encoder"][1]
    encoder_inputs = {**encoder_template, **{k: v for k, v in generate_inputs.items() if k in encoder_template}}
    encoded = run_component(runners["encoder"], encoder_inputs)
    prefill_template = components["prefill"][1]
    encoder_outputs = copy.deepcopy(prefill_template["encoder_outputs"])
    encoder_outputs["last_hidden_state"] = encoded["last_hidden_state"]
    extra = {"encoder_outputs": encoder_outputs}
    if "attention_mask" in prefill_template and "attention_mask" in generate_inputs:
        extra["attention_mask"] = generate_inputs["attention_mask"]
    key = cache_input_name(prefill_template)
    start = _decoder_start(components, generate_inputs, greedy.reference)
    inputs = step_inputs(prefill_template, start, 0, copy.deepcopy(prefill_template[key]) if key else None)
    inputs.update(extra)
    out = run_component(runners["prefill"], inputs)
    stepper = DecodeStepper(runners["decode"], components["decode"][1])
    decode_loop(out["logits"], output_cache(out), start, greedy, stepper, tokens, extra)
    source = next(iter(generate_inputs.values()))
    return int(source.shape[-1])


DRIVERS = {
    "text": (_decoder_only, {"prefill", "decode"}),
    "seq2seq": (_encoder_decoder, {"encoder", "prefill", "decode"}),
    "speech-seq2seq": (_encoder_decoder, {"encoder", "prefill", "decode"}),
    "vision-language": (vision_language, set()),  # every stage its model has (exporters.capture.components)
    "audio-language": (vision_language, set()),  # the same driver: the model's forward, its stages as graphs
}
