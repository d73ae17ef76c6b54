"""The prompt through the decode graph, one token at a time (#30): the generation layout of a state-space model
whose prefill cannot keep a dynamic sequence axis.

Mamba's cache holds per-layer conv and recurrent states, no key-value tensors, and its scan is a Python loop over the
sequence that torch.export traces at the sample's length (docs/upstream-gaps.md #27): a `dynamic: true` prefill
would be fixed to the traced prompt length. Its decode, though, takes one token and the states and returns the next
states, and from zeroed states it computes exactly what the prefill does (the conv pads the sequence with zeros on
the left, and the scan starts from zeros). So when the recipe asks for a dynamic prompt and the capture shows a cache
of states only, the target exports only `decode`, and a prompt of any length is fed to it one token at a time from
[`zeroed_cache`]: chosen automatically, and said in the report ([`STEPPED_NOTE`]).

Example:
    >>> import torch
    >>> zeroed_cache({"conv": torch.ones(1, 2)})["conv"].sum().item()
    0.0
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from exporters.capture.merged import takes_cache
from exporters.capture.steps import cache_input_name
from exporters.upstream import leaf_tensors

STEPPED = ["decode"]
STEPPED_NOTE = ("the prompt is fed to the decode graph one token at a time from zeroed states (what the prefill "
                "computes): this model's cache holds {kinds}, no key-value tensors, and its prefill cannot keep a "
                "dynamic sequence axis (docs/upstream-gaps.md #27), so only `decode` is exported")


def wants_stepped(target, family: str, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> bool:
    """Whether `target` exports the decode alone, the prompt stepped through it: a generation target of a decoder-only
    model that asks for a dynamic prompt (`dynamic: true`, or `dynamic_shapes` on the prefill), whose captured decode
    carries a cache of states and no key-value tensors, and whose recipe names no `prefill` (in `components` or
    `expected_components`: then the prefill is exported as asked, and its contract checked)."""
    if target.mode != "generation" or family != "text" or not {"prefill", "decode"} <= set(components):
        return False
    if "prefill" in target.components or "prefill" in (target.expected_components or []):
        return False
    dynamic_prompt = target.dynamic or bool(target.shape_spec("prefill"))
    decode = components["decode"][1]
    key = cache_input_name(decode)
    states = key is not None and bool(leaf_tensors({key: decode[key]}))
    return dynamic_prompt and states and not takes_cache(components)


def plan(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]):
    """The stepped component set: `{"decode": ...}`."""
    return {name: components[name] for name in STEPPED}


def zeroed_cache(cache: Any) -> Any:
    """A copy of `cache` whose every tensor is zero (the state a prompt starts from)."""
    zeroed = copy.deepcopy(cache)
    for tensor in leaf_tensors(zeroed).values():
        tensor.zero_()
    return zeroed
