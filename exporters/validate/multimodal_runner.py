"""Generation parity of a program in ExecuTorch MultimodalRunner's layout (`exporters.capture.multimodal_runner`),
fed as the runner feeds it: the prompt's tokens through `token_embedding`, the image through `vision_encoder`, its
features in place of the image tokens, the whole at position 0 through `text_decoder` (the program keeps the cache;
where a call takes fewer positions than the prompt, a ring-buffer layer's window, in the runner's calls: each image
one, the text in chunks of the window, [`runner_calls`]);
then each selected token through `token_embedding` and `text_decoder` at its position. transformers.js's
vision-language graphs are fed likewise, with the cache they return ([`image_text_driver`]).
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.image_text import (AUDIO_ENCODER as AUDIO_GRAPH, DECODER, EMBED_TOKENS,
                                         VISION_ENCODER as IMAGE_ENCODER, audio_inputs, embeds_inputs, image_inputs)
from exporters.capture.merged import empty_cache
from exporters.capture.qwen_vl import is_mrope, rope_positions, step_positions
from exporters.capture.multimodal_runner import (AUDIO_ENCODER, TEXT_DECODER, TOKEN_EMBEDDING, VISION_ENCODER,
                                               runner_image_inputs, runner_prompt)
from exporters.capture.steps import output_cache
from exporters.capture.token_ids import features_in_place, image_token_id
from exporters.upstream import run_component
from exporters.validate.greedy import Greedy, decode_loop


def _tensor(output: Any) -> torch.Tensor:
    """A method's one output (a program hands back a tuple or a mapping of one tensor)."""
    if isinstance(output, dict):
        output = next(iter(output.values()))
    if isinstance(output, (list, tuple)):
        output = output[0]
    return output


def image_token_of(config: Any) -> int:
    """The model's image token id (`image_token_id`, else LLaVA's older `image_token_index`)."""
    token = image_token_id(config)
    return int(token if token is not None else config.image_token_index)  # neither: AttributeError, as before


def _placed(embeds: torch.Tensor, ids: torch.Tensor, features: torch.Tensor, token: int) -> None:
    """The encoder's `features` in place of the prompt's `token` rows (`features_in_place`), or why they cannot be."""
    if not features_in_place(embeds, ids, features, token):
        raise ValueError(f"the encoder gave {features.reshape(-1, features.shape[-1]).shape[0]} feature rows for the "
                         f"prompt's {int((ids[0] == token).sum())} tokens of id {token}: they must match one for one")


def multimodal_runner_driver(model, components, runners, generate_inputs: dict[str, Any], greedy: Greedy,
                             tokens: list) -> int:
    """Parity driver (see `exporters.validate.parity`): image (or audio) + prompt → the runner's three methods →
    greedy tokens appended to `tokens`; returns the prompt length.

    Example:
        >>> _tensor((torch.ones(1),)).tolist()
        [1.0]
    """
    ids = generate_inputs["input_ids"]
    embeds = _tensor(run_component(runners[TOKEN_EMBEDDING], {"input_ids": ids})).clone()
    if AUDIO_ENCODER in runners:  # Voxtral: the audio's embeddings in place of its audio tokens
        features = _tensor(run_component(runners[AUDIO_ENCODER], {"input_features": generate_inputs["input_features"]}))
        placeholder = int(model.config.audio_token_id)
    else:
        images = runner_image_inputs(generate_inputs)  # Idefics3's tiles: one call each, in order (LLaVA-NeXT's one)
        features = torch.cat([_tensor(run_component(runners[VISION_ENCODER], {"pixel_values": images[i:i + 1]}))
                              for i in range(images.shape[0])], dim=1)
        placeholder = image_token_of(model.config)
    placed = ids if AUDIO_ENCODER in runners else runner_prompt(model, generate_inputs)  # Pixtral's span: one run
    _placed(embeds, placed, features, placeholder)
    where = placed[0] == placeholder

    def decoder(inputs_embeds: torch.Tensor, start: int) -> dict[str, Any]:
        positions = torch.arange(start, start + inputs_embeds.shape[1])
        logits = _tensor(run_component(runners[TEXT_DECODER], {"inputs_embeds": inputs_embeds,
                                                               "cache_position": positions}))
        return {"logits": logits, "cache": None}

    def stepper(token, position, cache, extra=None):
        return decoder(_tensor(run_component(runners[TOKEN_EMBEDDING], {"input_ids": token[:, None]})), position)

    chunk = getattr(components[TEXT_DECODER][0], "max_seq_len", None)
    calls = runner_calls(where.tolist(), chunk if chunk is not None and chunk < ids.shape[1] else None)
    logits = [decoder(embeds[:, start:end], start)["logits"] for start, end in calls][-1]
    decode_loop(logits, None, ids, greedy, stepper, tokens)
    return int(ids.shape[1])


def runner_calls(media: list[bool], chunk: int | None) -> list[tuple[int, int]]:
    """The `(start, end)` of each `text_decoder` call the runner makes on a prompt whose `media` positions hold an
    image's (an audio's) embeddings, where one call takes at most `chunk` positions (a ring-buffer layer's window):
    each run of media one call, the text between in calls of at most `chunk` (as the card's snippet splits it:
    `exporters.layouts.executorch_multimodal.IMAGE_INPUTS`); None: the whole prompt in one call.

    Example:
        >>> runner_calls([False] * 3 + [True] * 2 + [False] * 5, 2)
        [(0, 2), (2, 3), (3, 5), (5, 7), (7, 9), (9, 10)]
        >>> runner_calls([False, True], None)
        [(0, 2)]
    """
    if chunk is None:
        return [(0, len(media))]
    calls: list[tuple[int, int]] = []
    start = 0
    for end in range(1, len(media) + 1):
        if end == len(media) or media[end] != media[start]:  # a run of text or of media ends
            step = end - start if media[start] else chunk
            calls += [(i, min(i + step, end)) for i in range(start, end, step)]
            start = end
    return calls


def image_text_driver(model, components, runners, generate_inputs: dict[str, Any], greedy: Greedy,
                      tokens: list) -> int:
    """Parity driver of transformers.js's vision-language graphs (`exporters.capture.image_text`), fed as
    transformers.js feeds them: the prompt through `embed_tokens`, the image through `vision_encoder` (an audio-language
    model's audio through `audio_encoder`), its features in place of the image (audio) tokens, the whole through
    `decoder_model_merged` on an empty cache; then each selected token through `embed_tokens` and the decoder with the
    cache it returned (a Qwen-VL's positions as transformers.js computes them: the prompt's by `get_rope_index`, each
    new token's its position plus the prompt's `rope_deltas`)."""
    ids = generate_inputs["input_ids"][:1]
    embeds = _tensor(run_component(runners[EMBED_TOKENS], {"input_ids": ids})).clone()
    if AUDIO_GRAPH in runners:
        features = _tensor(run_component(runners[AUDIO_GRAPH], audio_inputs(generate_inputs)))
        placeholder = int(model.config.audio_token_id)
    else:
        features = _tensor(run_component(runners[IMAGE_ENCODER], image_inputs(generate_inputs)))
        placeholder = image_token_of(model.config)
    _placed(embeds, ids, features, placeholder)
    empty = empty_cache(components[DECODER][1]["past_key_values"], 1)
    positions, deltas = rope_positions(model, ids, generate_inputs["image_grid_thw"]) if is_mrope(model.config) \
        else (None, None)
    out = run_component(runners[DECODER], embeds_inputs(embeds, 0, empty, positions))

    def stepper(token, position, cache, extra=None):
        step = _tensor(run_component(runners[EMBED_TOKENS], {"input_ids": token[:, None]}))
        at = None if deltas is None else step_positions(position, deltas)
        return run_component(runners[DECODER], embeds_inputs(step, position, cache, at))

    decode_loop(out["logits"], output_cache(out), ids, greedy, stepper, tokens)
    return int(ids.shape[1])
