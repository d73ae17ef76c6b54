"""The prompt through the decode graph, one token at a time (#30): the generation layout of a state-space or hybrid
model whose prefill cannot keep a dynamic sequence axis.

Mamba's cache holds per-layer conv and recurrent states; a hybrid's (Falcon-H1, Bamba, Jamba, Zamba2, Granite-4
hybrids) holds those and its attention layers' keys and values. Without the CUDA kernels the scan over the sequence
is traced at the sample's length: Mamba's is a Python loop, Mamba2's chunked scan reshapes the padded sequence into
chunks, and torch.export fixes the number of chunks (docs/upstream-gaps.md #27). A `dynamic: true` prefill would be
fixed to the traced prompt length, and so would the merged graph, which runs the prompt through the same scan. The
single-token decode, though, takes one token, the states and the key-value cache and returns the next ones, and from
zeroed states and an empty key-value cache it computes exactly what the prefill does (the conv pads the sequence
with zeros on the left, the scan starts from zeros, attention sees the tokens fed so far). So when the recipe asks
for a dynamic prompt and the capture's decode carries recurrent states ([`exporters.capture.merged.scans`]), the
target exports only `decode` (a hybrid's with the key-value axis dynamic from 0: [`plan`]; an ExecuTorch target of
a conv-only cache too, LFM2's: [`can_step`]), and a prompt of any
length is fed to it one token at a time from [`zeroed_cache`]: chosen automatically, and said in the report
([`note`]). Generation parity runs it at the sample's prompt and at a shorter and a longer one
([`other_prompts`]), so a program that works at one prompt length only cannot pass.

Example:
    >>> import torch
    >>> zeroed_cache({"conv": torch.ones(1, 2)})["conv"].sum().item()
    0.0
"""

from __future__ import annotations

from typing import Any

import torch

from exporters.capture.merged import (cache_kinds, cache_leaves, contract, empty_cache, scans, state_leaves,
                                      with_contract)
from exporters.capture.steps import cache_input_name
from exporters.upstream import leaf_tensors

STEPPED = ["decode"]
STEPPED_NOTE = ("the prompt is fed to the decode graph one token at a time from zeroed states (what the prefill "
                "computes): this model's cache holds {kinds}, no key-value tensors, and its prefill cannot keep a "
                "dynamic sequence axis (docs/upstream-gaps.md #27), so only `decode` is exported")
HYBRID_NOTE = ("the prompt is fed to the decode graph one token at a time from zeroed states and an empty key-value "
               "cache (what the prefill computes): this model's cache holds {kinds} (a hybrid: state-space and "
               "attention layers), and the state-space scan of a prefill or merged graph cannot keep a dynamic "
               "sequence axis (docs/upstream-gaps.md #27), so only `decode` is exported, {kv}")
CONV_NOTE = ("the prompt is fed to the decode graph one token at a time from zeroed conv states and an empty key-value "
             "cache (what the prefill computes): this model's cache holds {kinds} (short convolutions and attention "
             "layers), and an ExecuTorch prefill keeps the prompt's last positions in its conv states with a size "
             "tied to the traced length ('Attempted to resize a static tensor' at any other), so only `decode` is "
             "exported, {kv}")
KV_DYNAMIC = "its key-value axis dynamic from 0"
# an ExecuTorch program's cache: every slot allocated up front (exporters.capture.merged.empty_cache)
KV_STATIC = "its static key-value cache filled from position 0"


def wants_stepped(target, family: str, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> bool:
    """Whether `target` exports the decode alone, the prompt stepped through it: a generation target of a decoder-only
    model that asks for a dynamic prompt (`dynamic: true`, or `dynamic_shapes` on the prefill) and [`can_step`]."""
    return bool(target.dynamic or target.shape_spec("prefill")) and can_step(target, family, components)


def can_step(target, family: str, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> bool:
    """Whether a dynamic prompt of `target` would be stepped through the decode alone: a generation target of a
    decoder-only model whose captured decode carries recurrent states (a scan over the sequence: [`scans`]) or, in
    ExecuTorch, conv states alone (LFM2: [`CONV_NOTE`]), and whose recipe names no `prefill` (in `components` or
    `expected_components`: then the prefill is exported as asked, and its contract checked)."""
    if target.mode != "generation" or family != "text" or not {"prefill", "decode"} <= set(components):
        return False
    if "prefill" in target.components or "prefill" in (target.expected_components or []):
        return False
    decode = components["decode"][1]
    key = cache_input_name(decode)
    states = key is not None and bool(leaf_tensors({key: decode[key]}))
    return states and (scans(components) or (target.export_format == "executorch" and bool(state_leaves(decode))))


def note(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> str:
    """What the report says of a stepped target: its cache, and why only `decode` is exported."""
    decode = components["decode"][1]
    hybrid = bool(cache_leaves(decode))
    key = cache_input_name(decode)
    static = any(getattr(layer, "max_cache_len", None) is not None
                 for layer in getattr(decode.get(key) if key else None, "layers", None) or [])
    text = (HYBRID_NOTE if scans(components) else CONV_NOTE) if hybrid else STEPPED_NOTE
    return text.format(kinds=cache_kinds(components), kv=KV_STATIC if static else KV_DYNAMIC)


def plan(target, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]):
    """The stepped component set: `{"decode": ...}`. A hybrid's decode, when the recipe gives it no contract, gets
    the merged graph's without the query axis (`exporters.capture.merged.contract`): the key-value axis dynamic from
    0 (the first prompt token runs on an empty cache) and the batch named on every input, states included."""
    stepped = {name: components[name] for name in STEPPED}
    inputs = stepped["decode"][1]
    override = target.components.get("decode")
    if cache_leaves(inputs) and (override is None or override.dynamic_shapes is None) and not target.dynamic_shapes:
        with_contract(target, "decode", contract(target, inputs, query_axis=False))
    return stepped


def zeroed_cache(cache: Any, batch: int | None = None) -> Any:
    """A copy of `cache` whose every state is where the model's own forward starts it and whose key-value tensors
    hold no position (what a prompt starts from), with `batch` rows when given: zero, but for RWKV's running
    maximum ([`RWKV_MAXIMUM`])."""
    if isinstance(cache, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in cache):  # RWKV's `state`
        rows = [(batch or t.shape[0], *t.shape[1:]) for t in cache]
        zeroed = [torch.zeros(shape, dtype=t.dtype, device=t.device) for shape, t in zip(rows, cache, strict=True)]
        if len(zeroed) == RWKV_MAXIMUM + 1:
            zeroed[RWKV_MAXIMUM].fill_(RWKV_MAXIMUM_START)
        return zeroed
    zeroed = empty_cache(cache, batch)
    for tensor in leaf_tensors(zeroed).values():
        tensor.zero_()
    return zeroed


def other_prompts(generate_inputs: dict[str, Any], steps: int, limit: int | None = None) -> list[dict[str, Any]]:
    """`generate_inputs` with a shorter prompt (the first half of the sample's) and a longer one (twice its length
    plus 3: the sample's tokens, reversed, then its first three again), each tensor that has the prompt's axis 1
    (`input_ids`, `attention_mask`) cut or extended alike: the prompt lengths a stepped target's generation parity
    checks besides the sample's. `limit`: a static cache's positions, which the prompt and `steps` new tokens must
    fit (the longer prompt is shortened to fit, and left out when it then is no longer than the sample's).

    Example:
        >>> ids = torch.arange(8)[None]
        >>> [p["input_ids"].shape[1] for p in other_prompts({"input_ids": ids}, steps=8)]
        [4, 19]
        >>> [p["input_ids"].shape[1] for p in other_prompts({"input_ids": ids}, steps=8, limit=16)]
        [4]
    """
    ids = generate_inputs["input_ids"]
    length = int(ids.shape[1])
    longer = length * 2 + 3 if limit is None else min(length * 2 + 3, limit - steps)
    lengths = [n for n in (length // 2,) if n > 0] + [n for n in (longer,) if n > length]

    def cut(tensor: torch.Tensor, n: int) -> torch.Tensor:
        extended = torch.cat([tensor, tensor.flip(1), tensor[:, :3]], dim=1) if n > length else tensor
        return extended[:, :n].clone()

    return [{key: cut(value, n) if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] ==
             ids.shape[:2] else value for key, value in generate_inputs.items()} for n in lengths]


# RWKV's state is five `[batch, hidden, layers]` tensors (token shifts of the feed-forward and of attention, the
# numerator, the denominator, the running maximum of the exponents); `RwkvModel.forward` starts the maximum at -1e30.
RWKV_MAXIMUM, RWKV_MAXIMUM_START = 4, -1e30
