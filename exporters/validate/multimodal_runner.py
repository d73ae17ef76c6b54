"""Generation parity of a program in ExecuTorch MultimodalRunner's layout (`exporters.capture.multimodal_runner`),
fed as the runner feeds it: the prompt's tokens through `token_embedding`, the image through `vision_encoder`, its
features in place of the image tokens, the whole at position 0 through `text_decoder` (the program keeps the cache);
then each selected token through `token_embedding` and `text_decoder` at its position.
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.multimodal_runner import TEXT_DECODER, TOKEN_EMBEDDING, VISION_ENCODER
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
    token = getattr(config, "image_token_id", None)
    return int(token if token is not None else config.image_token_index)


def multimodal_runner_driver(model, components, runners, generate_inputs: dict[str, Any], greedy: Greedy,
                             tokens: list) -> int:
    """Parity driver (see `exporters.validate.parity`): image + prompt → the runner's three methods → greedy tokens
    appended to `tokens`; returns the prompt length.

    Example:
        >>> _tensor((torch.ones(1),)).tolist()
        [1.0]
    """
    ids = generate_inputs["input_ids"]
    embeds = _tensor(run_component(runners[TOKEN_EMBEDDING], {"input_ids": ids})).clone()
    features = _tensor(run_component(runners[VISION_ENCODER], {"pixel_values": generate_inputs["pixel_values"]}))
    where = ids[0] == image_token_of(model.config)
    embeds[0, where] = features[0].to(embeds.dtype)

    def decoder(inputs_embeds: torch.Tensor, start: int) -> dict[str, Any]:
        positions = torch.arange(start, start + inputs_embeds.shape[1])
        logits = _tensor(run_component(runners[TEXT_DECODER], {"inputs_embeds": inputs_embeds,
                                                               "cache_position": positions}))
        return {"logits": logits, "cache": None}

    def stepper(token, position, cache, extra=None):
        return decoder(_tensor(run_component(runners[TOKEN_EMBEDDING], {"input_ids": token[:, None]})), position)

    decode_loop(decoder(embeds, 0)["logits"], None, ids, greedy, stepper, tokens)
    return int(ids.shape[1])
