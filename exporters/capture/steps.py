"""Feeding one generation step: the call like a captured template for tokens at a position, with a cache.

The captured templates are what `generate()` itself passed to the model; a step keeps everything the family computes
(its position rules, its mask kinds) and moves the token, position and mask inputs to the step's position.

Example:
    >>> import torch
    >>> template = {"input_ids": torch.tensor([[1]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
    ...             "past_key_values": None}
    >>> step = step_inputs(template, torch.tensor([[5]]), 4, cache="the cache")
    >>> step["attention_mask"].shape, step["past_key_values"], cache_input_name(template)
    (torch.Size([1, 5]), 'the cache', 'past_key_values')
"""

from __future__ import annotations

import copy
from typing import Any

import torch

# The keyword a captured call passes its cache under: upstream's components take `cache`, models `past_key_values`,
# RWKV its recurrent `state` (a list of tensors, returned under the same name).
CACHE_INPUTS = ("cache", "past_key_values", "state")


def cache_input_name(template: dict[str, Any]) -> str | None:
    """The keyword `template` passes its cache under (None: it takes no cache)."""
    return next((key for key in CACHE_INPUTS if key in template), None)


def output_cache(output: Any) -> Any:
    """The cache a component's output returns (a `KeyError` when it returns none)."""
    for key in CACHE_INPUTS:
        if key in output:
            return output[key]
    raise KeyError("the component returns no cache")


def causal_mask(like: torch.Tensor, start: int, length: int, window: int | None = None) -> torch.Tensor:
    """A 4D mask shaped like the captured `like` (`[batch, heads, query, slots]`) for `length` queries at positions
    `start…`: each sees the slots up to its own position (and, with `window`, only the last `window` of them).
    Boolean (true: attend) or additive (0 / dtype minimum)."""
    batch, heads, _, slots = like.shape
    query = torch.arange(start, start + length).unsqueeze(-1)
    slot = torch.arange(slots).unsqueeze(0)
    allowed = slot <= query
    if window is not None:
        allowed &= query - slot < window
    allowed = allowed.expand(batch, heads, length, slots).contiguous()
    if like.dtype == torch.bool:
        return allowed
    blocked = torch.full_like(allowed, torch.finfo(like.dtype).min, dtype=like.dtype)
    return torch.where(allowed, torch.zeros_like(blocked), blocked)


def _layer_mask(kind: str, mask: Any, start: int, length: int, window: int | None) -> Any:
    """The static cache's 4D mask of one layer type for queries at `start…`. Full attention: causal over the cache's
    slots. Sliding window: causal over the last `window` positions, while every position has its slot (the layers
    are captured whole: `exporters.upstream.static_sliding_layers_kept_whole`); a rolling window layer of an older
    export, once full, runs a code path its graph fixed at trace time (docs/upstream-gaps.md #9): its mask is fed as
    captured, and generation parity shows whether the graph holds."""
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4):
        return mask
    if kind == "full_attention":
        return causal_mask(mask, start, length)
    if kind == "sliding_attention" and start + length <= mask.shape[-1]:
        return causal_mask(mask, start, length, window)
    return mask


def step_inputs(template: dict[str, Any], ids: torch.Tensor, start: int, cache: Any,
                sliding_window: int | None = None) -> dict[str, Any]:
    """A call like the captured `template`, for token `ids` at positions `start…`, with `cache`; `sliding_window`:
    the model's window, for the mask of its sliding-window layers ([`sliding_window_of`])."""
    inputs = copy.deepcopy({k: v for k, v in template.items() if k not in CACHE_INPUTS})
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
    elif isinstance(mask, torch.Tensor) and mask.dim() == 4:  # a static cache: causal over its fixed slots
        inputs[mask_key] = causal_mask(mask, start, length)
    elif isinstance(mask, dict):  # one mask per layer type, as `generate` prepares it for models that take a mapping
        inputs[mask_key] = {kind: _layer_mask(kind, value, start, length, sliding_window)
                            for kind, value in mask.items()}
    key = cache_input_name(template)
    if key is not None:
        inputs[key] = cache
    return inputs
