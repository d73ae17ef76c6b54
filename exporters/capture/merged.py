"""The merged generation graph: one graph (`model`) that runs the prompt on an empty cache and every decode step.

Upstream's multi-token decode (`decompose_for_generation(..., multi_token_decode=True)`) has a dynamic query axis
and a dynamic cache axis; exported with both axes dynamic it runs a whole prompt with a cache of length 0, so it
replaces the separate `prefill` and `decode` graphs (optimum's "with past" design, and what transformers.js and
ONNX Runtime GenAI run). Only that graph is traced and converted.

Example:
    >>> from exporters.recipe.load import parse_recipe
    >>> target = parse_recipe('{"export_format": "onnx", "mode": "generation", "dynamic": true}').exports[0]
    >>> wants_merged(target, "text", "dynamic")
    True
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from exporters.capture.probes import sync_cache_lengths
from exporters.capture.steps import cache_input_name, step_inputs
from exporters.capture.families import a_model_of
from exporters.errors import TargetPlanError
from exporters.recipe.layout import TRANSFORMERS_JS
from exporters.recipe.model import ComponentOverride
from exporters.upstream import leaf_tensors

MERGED = "model"
# Families whose generation export is an encoder and two decoders (optimum's and transformers.js's Seq2Seq layout)
ENCODER_DECODER_FAMILIES = ("seq2seq", "speech-seq2seq")
QUERY_DIM, PAST_DIM, BATCH_DIM = "sequence_length", "past_sequence_length", "batch_size"
CACHE_KEYS = ("cache", "past_key_values")
# Inputs that run along the query tokens (one entry per new token).
QUERY_INPUTS = ("input_ids", "position_ids", "token_type_ids", "inputs_embeds")


def mixes_window_layers(config: Any) -> bool:
    """Whether the model's layers mix sliding-window and full attention (Gemma 2 and 3, ...): their caches then hold
    different lengths past the window, which one `past_sequence_length` dim cannot describe (unless the capture keeps
    every position in every layer, as an ONNX target's does: [`_merged_by_default`]). A window longer than every
position the model holds never fills (its layers keep every token, as the full ones do).

    Example:
        >>> from types import SimpleNamespace
        >>> mixes_window_layers(SimpleNamespace(layer_types=["sliding_attention", "full_attention"]))
        True
        >>> mixes_window_layers(SimpleNamespace(layer_types=None, sliding_window=4096))
        False
        >>> mixes_window_layers(SimpleNamespace(layer_types=["sliding_attention", "full_attention"],
        ...                                     sliding_window=512, max_position_embeddings=256))
        False
    """
    config = getattr(config, "text_config", None) or config
    kinds = set(getattr(config, "layer_types", None) or [])
    window, positions = getattr(config, "sliding_window", None), getattr(config, "max_position_embeddings", None)
    if window and positions and window > positions:  # a window cache keeps `window - 1` tokens: never full here
        return False
    return "sliding_attention" in kinds and len(kinds) > 1


def wants_merged(target, family: str, cache_implementation: str, config: Any = None) -> bool:
    """Whether `target` exports the merged graph: its `merged` setting, else the default. The default is on for
    generation targets of decoder-only models with a dynamic cache, whose layers all keep the same cache length (an
    ONNX target's capture keeps every position in every layer, sliding-window layers too) and whose recipe names no
    `prefill`/`decode` component: every dynamo target (one `.pt2` holds the weights once, where
    `prefill.pt2` + `decode.pt2` hold them twice; a separate decode without a dynamic cache axis could not run a
    second step anyway) and ONNX targets with dynamic shapes; and every transformers.js layout.

    Raises [`TargetPlanError`] when the recipe asks for a merged graph this model or cache cannot have."""
    if target.mode != "generation":
        return False
    tjs = getattr(target, "layout", "upstream") == TRANSFORMERS_JS
    if target.merged is None and not tjs:
        return _merged_by_default(target, family, cache_implementation, config)
    if target.merged is False:
        return False
    if tjs and target.merged is None and family in ENCODER_DECODER_FAMILIES:
        return False  # encoder + two decoders, merged into one decoder file after the export (export.seq2seq_merged)
    if tjs and target.merged is None and family in ("vision-language", "audio-language"):
        return False  # three graphs of its own (capture.image_text), else its components, the layout declined
    option = "layout" if tjs and target.merged is None else "merged"
    asked = "`layout` 'transformers.js'" if option == "layout" else "`merged`: true"
    if family != "text":
        raise TargetPlanError(
            f"{asked} needs a decoder-only text model; this is {a_model_of(family)}, whose generation export has several "
            f"graphs (encoder, vision tower, ...): drop `{option}`", option=option)
    if cache_implementation != "dynamic":
        raise TargetPlanError(
            f"{asked} needs a dynamic cache (the merged graph runs the prompt on a cache of length 0); the recipe's "
            "generation.cache_implementation is 'static': use 'dynamic', or drop "
            f"`{option}`", option=option)
    return True


def planned_merged(target, family: str, cache_implementation: str, config: Any = None) -> bool | None:
    """`target.merged` once planned: [`wants_merged`], except an encoder-decoder target's, which stays as the recipe
    gave it (unset or false). Its merged graph is not upstream's multi-token decode: its two traced decoders are
    merged into `decoder_model_merged.onnx` after the export (`exporters.export.seq2seq_merged`) unless `merged` is
    false, which keeps optimum's `decoder_model.onnx` + `decoder_with_past_model.onnx`.

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> unset = parse_recipe('{"export_format": "onnx", "mode": "generation", "dynamic": true}').exports[0]
        >>> planned_merged(unset, "seq2seq", "dynamic"), planned_merged(unset, "text", "dynamic")
        (None, True)
    """
    wanted = wants_merged(target, family, cache_implementation, config)
    return target.merged if family in ENCODER_DECODER_FAMILIES and not wanted else wanted


def takes_cache(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> bool:
    """Whether the capture's decode takes a key-value cache, which the merged graph runs on. When the default chose
    the merged graph (the recipe left `merged` unset) and it does not (Mamba's conv and recurrent states, #30), the
    target keeps its separate `prefill` and `decode` with no error ([`DEFAULT_DROPPED`]); a recipe that asks for
    `merged: true` gets [`contract`]'s error."""
    decode = components.get("decode")
    return decode is not None and bool(cache_leaves(decode[1]))


DEFAULT_DROPPED = ("prefill and decode are exported as separate graphs: the merged graph (the default) needs a "
                   "key-value cache, and this model's decode carries none (its cache is {kinds})")


def default_dropped(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> str:
    """Why the merged default does not apply to this capture, in words: its decode carries no key-value cache
    ([`DEFAULT_DROPPED`]), or a hybrid's state-space scan ([`SCANS`])."""
    kinds = cache_kinds(components)
    if takes_cache(components):
        return "prefill and decode are exported as separate graphs: " + SCANS.format(kinds=kinds)
    return DEFAULT_DROPPED.format(kinds=kinds)


def cache_kinds(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> str:
    """What the decode's cache holds, in words (`conv and recurrent states`, ...), for [`DEFAULT_DROPPED`]."""
    decode = components.get("decode")
    key = cache_input_name(decode[1]) if decode is not None else None
    if key is None:
        return "absent"
    kinds = sorted({next(part for part in reversed(path.split(".")) if not part.isdigit())
                    for path in leaf_tensors({key: decode[1][key]})})
    return ", ".join(kinds) or "empty"


def _merged_by_default(target, family: str, cache_implementation: str, config: Any) -> bool:
    """The default of `wants_merged` for a target whose recipe leaves `merged` unset. A model that mixes window and
    full layers ([`mixes_window_layers`]) keeps it for ONNX: its ONNX generation capture keeps every position in every
    layer (`exporters.capture.cache_settings.full_length_windows`), so one past length describes the whole cache."""
    separate = bool(set(target.components) & {"prefill", "decode"})
    if (family != "text" or cache_implementation != "dynamic" or separate
            or target.expected_components not in (None, [MERGED]) or windows_keep_apart(target.export_format, config)):
        return False
    if target.export_format == "dynamo":
        return True
    dynamic = target.dynamic or bool(target.dynamic_shapes) or MERGED in target.components
    return target.export_format == "onnx" and dynamic


def windows_keep_apart(export_format: str, config: Any) -> bool:
    """Whether the model's layers keep the merged default off for `export_format`: a mix of window and full layers
    ([`mixes_window_layers`]) anywhere but ONNX, whose generation capture keeps every position in every layer
    (`exporters.capture.cache_settings.full_length_windows`); dynamo keeps the model's own cache, whose layers differ
    in length past the window. `hf-export init` proposes each format's default graph by the same rule.

    Example:
        >>> from types import SimpleNamespace
        >>> gemma = SimpleNamespace(layer_types=["sliding_attention", "full_attention"], sliding_window=6,
        ...                         max_position_embeddings=64)
        >>> windows_keep_apart("dynamo", gemma), windows_keep_apart("onnx", gemma), windows_keep_apart("dynamo", None)
        (True, False, False)
    """
    return config is not None and export_format != "onnx" and mixes_window_layers(config)


KV_LEAVES = ("keys", "values")


def cache_leaves(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The key/value tensors of the template's cache, by upstream leaf path (`cache.layers.0.keys`, ...): the ones
    whose sequence axis grows. A hybrid's conv and recurrent states (`cache.layers.0.recurrent_states.0`, 4-D in
    Mamba2-style mixers) are not among them: see [`state_leaves`]."""
    key = cache_input_name(inputs)
    if key is None:
        return {}
    return {path: tensor for path, tensor in leaf_tensors({key: inputs[key]}).items()
            if tensor.dim() == 4 and path.split(".")[-1] in KV_LEAVES}


def state_leaves(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The template cache's fixed-size tensors: a state-space or hybrid layer's conv and recurrent states
    (`cache.layers.0.conv_states.0`, ...), whose shape does not change from step to step (only the batch); not a
    layer's bookkeeping scalars (Mistral's `_sliding_window_tensor`, `cumulative_length`), which have no batch."""
    key = cache_input_name(inputs)
    if key is None:
        return {}
    kv = cache_leaves(inputs)
    return {path: tensor for path, tensor in leaf_tensors({key: inputs[key]}).items()
            if path not in kv and tensor.dim() >= 2}


def contract(target, inputs: dict[str, Any], query_axis: bool = True) -> ComponentOverride:
    """The dynamic-shape contract of the merged graph when the recipe gives none: the query axis of the token inputs
    (from 1) and the sequence axis of every cache tensor (from 0: the prompt runs on an empty cache), without an
    upper bound (the graph takes any length; a bound would be probed, and probing the model's whole context is
    gigabytes of logits). A recipe that wants bounds declares them in `components.model.dynamic_shapes`.

    ONNX and dynamo get named dims (the graph's input dims carry no spurious symbols, so runtimes can size an empty
    cache from them), the batch too but where the target is written for unpadded calls (`unpadded`: one sequence);
    ExecuTorch gets `"auto"` on the same axes, because named cache dims fail its edge verifier (docs/upstream-gaps.md
    #4). `query_axis=False`: the single-token decode's contract (the query axis stays 1;
    `exporters.capture.stepped` feeds a hybrid's prompt through it from a cache of length 0)."""
    leaves = cache_leaves(inputs)
    if not leaves:
        raise TargetPlanError(
            "the merged graph needs a decode step that takes a key-value cache; this model's decode inputs have none "
            f"(inputs: {sorted(inputs)}): set `merged` to false", option="merged")
    batch: dict[str, Any] = {}
    if target.export_format == "executorch":
        query: Any = "auto"
        past: Any = "auto"
        deferred = False
    else:
        query = {"name": QUERY_DIM, "min": 1}
        past = {"name": PAST_DIM, "min": 0}
        # traced at 2 (`fit_to_contract`): a batch of 1 specializes; a graph for unpadded calls has one sequence
        batch = {} if getattr(target, "unpadded", False) else {"0": {"name": BATCH_DIM, "min": 1}}
        deferred = True
    token_axes = {**batch, "1": query} if query_axis else dict(batch)
    spec: dict[str, Any] = {name: dict(token_axes) for name in QUERY_INPUTS
                            if token_axes and _is_query_input(inputs.get(name))}
    if isinstance(inputs.get("attention_mask"), torch.Tensor):
        spec["attention_mask"] = {**batch, "1": "auto"}  # past + query: not expressible as one named dim
    for path in leaves:
        spec[path] = {**batch, "2": past}
    for path in state_leaves(inputs) if batch else []:  # a hybrid's states: fixed, but batched like the rest
        spec[path] = dict(batch)
    return ComponentOverride.model_validate(
        {"dynamic_shapes": spec, "prefer_deferred_runtime_asserts_over_guards": deferred})


def scans(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]) -> bool:
    """Whether the capture's decode carries recurrent states (`cache.layers.0.recurrent_states.0`): a state-space
    scan over the sequence (Mamba, Mamba2-style mixers of Falcon-H1, Bamba, Jamba, ..., RWKV's and xLSTM's
    recurrences: [`RECURRENT_STATES`]), which torch.export traces
    at the sample's length (docs/upstream-gaps.md #27), so no graph that runs a whole prompt keeps that axis dynamic.
    A conv-only cache (LFM2's short convolutions) does not count: a convolution keeps it."""
    decode = components.get("decode")
    return decode is not None and any(set(path.split(".")) & RECURRENT_STATES for path in state_leaves(decode[1]))


# The leaves of a recurrent state carried from token to token: Mamba-style mixers' `recurrent_states`, xLSTM's
# `rnn_state`, RWKV's whole `state` (its token-shift, numerator, denominator and running-maximum tensors).
RECURRENT_STATES = {"recurrent_states", "rnn_state", "state"}


SCANS = ("the merged graph runs the prompt through the decode's state-space scan, which torch.export fixes at the "
         "traced length (this model's cache holds {kinds}; docs/upstream-gaps.md #27)")


def with_contract(target, name: str, derived: ComponentOverride) -> None:
    """`target.components[name]` set to the `derived` contract, keeping the recipe's tolerances and flags for it."""
    override = target.components.get(name)
    if override is not None:
        derived.validation = override.validation
        derived.strict = override.strict
        if override.prefer_deferred_runtime_asserts_over_guards is not None:
            derived.prefer_deferred_runtime_asserts_over_guards = override.prefer_deferred_runtime_asserts_over_guards
    target.components[name] = derived


def _is_query_input(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 2


def plan(target, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]]):
    """The merged component set (`{"model": upstream's multi-token decode}`), and `target` completed with its
    contract (`components.model`) when the recipe gives none."""
    if "decode" not in components:
        raise TargetPlanError(f"the merged graph is upstream's multi-token decode, but the capture has "
                              f"{list(components)}: set `merged` to false", option="merged")
    if takes_cache(components) and scans(components):  # a hybrid (a cache of states alone has its own error)
        raise TargetPlanError(SCANS.format(kinds=cache_kinds(components)) + ": set `merged` to false (a dynamic "
                              "prompt is then stepped through the decode graph)", option="merged")
    module, inputs = components["decode"]
    if target.export_format == "onnx":  # what ONNX runtimes feed (a dynamo guard on its length fails past=0)
        inputs = with_padding_mask(inputs)
    override = target.components.get(MERGED)
    if (override is None or override.dynamic_shapes is None) and not target.dynamic_shapes:
        with_contract(target, MERGED, contract(target, inputs))
    return {MERGED: (module, inputs)}


def with_padding_mask(inputs: dict[str, Any]) -> dict[str, Any]:
    """The multi-token decode's call with a 2-D padding mask over the cache and the query (`[batch, past + query]`)
    when the capture has none (transformers 5.24's `generate` drops a mask of all ones): the graph then takes the
    `attention_mask` that optimum, ONNX Runtime GenAI and transformers.js feed, so a padded batch runs right.

    Example:
        >>> from transformers import DynamicCache
        >>> cache = DynamicCache()
        >>> _ = cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
        >>> with_padding_mask({"input_ids": torch.ones(1, 2, dtype=torch.long), "cache": cache})["attention_mask"].shape
        torch.Size([1, 5])
    """
    leaves = cache_leaves(inputs)
    query = next((inputs[k] for k in QUERY_INPUTS if _is_query_input(inputs.get(k))), None)
    if inputs.get("attention_mask") is not None or not leaves or query is None:
        return inputs
    past = next(iter(leaves.values())).shape[2]
    mask = torch.ones(query.shape[0], past + query.shape[1], dtype=torch.long)
    ordered: dict[str, Any] = {}
    for key, value in inputs.items():  # right after the token ids, where runtimes list it
        ordered[key] = value
        if key in ("input_ids", "inputs_embeds"):
            ordered["attention_mask"] = mask
    ordered.setdefault("attention_mask", mask)
    return ordered


def with_counted_positions(probe: dict[str, Any]) -> dict[str, Any]:
    """A merged-graph probe whose `position_ids` count up from the cache's length (past, past + 1, ...), the calls a
    graph written for GenAI's unpadded sequences takes (`"unpadded": true`): the probe builder keeps positions
    counting from the traced sample's, whatever the past it sizes."""
    positions, leaves = probe.get("position_ids"), cache_leaves(probe)
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or not leaves:
        return probe
    past = next(iter(leaves.values())).shape[2]
    counted = torch.arange(past, past + positions.shape[1], dtype=positions.dtype).expand(positions.shape[0], -1)
    return {**probe, "position_ids": counted.clone()}


def with_consistent_mask(probe: dict[str, Any]) -> dict[str, Any]:
    """A merged-graph probe whose 2-D attention mask covers the cache and the query (past + query), as a runtime sends
    it: the probe builder resizes named dims only, and the mask's length is the sum of two (models with a sliding
    window check it; others ignore a mask of the wrong length)."""
    mask, leaves = probe.get("attention_mask"), cache_leaves(probe)
    query = next((probe[k] for k in QUERY_INPUTS if _is_query_input(probe.get(k))), None)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or not leaves or query is None:
        return probe
    past = next(iter(leaves.values())).shape[2]
    return {**probe, "attention_mask": torch.ones(mask.shape[0], past + query.shape[1], dtype=mask.dtype)}


def empty_cache(cache: Any, batch: int | None = None) -> Any:
    """A copy of `cache` whose key/value tensors have length 0 on the sequence axis (and `batch` rows, when given):
    freshly allocated and contiguous (a zero-length slice keeps its parent's strides, which ExecuTorch rejects with
    an abort). A static layer (an ExecuTorch program's cache: `max_cache_len` slots allocated up front) keeps its
    slots, zeroed, and counts no token: its program cannot resize them."""
    empty = copy.deepcopy(cache)
    for layer in getattr(empty, "layers", []):
        _zero_states(layer, batch)
        static = getattr(layer, "max_cache_len", None) is not None
        if static and isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
            layer.cumulative_length = torch.zeros_like(layer.cumulative_length)
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
                shape = list(tensor.shape)
                if static:
                    shape[0] = batch if batch is not None else shape[0]
                    setattr(layer, name, torch.zeros(shape, dtype=tensor.dtype, device=tensor.device))
                    continue
                shape[2] = 0
                if batch is not None:
                    shape[0] = batch
                setattr(layer, name, torch.empty(shape, dtype=tensor.dtype, device=tensor.device))
    sync_cache_lengths({"cache": empty})  # a layer that counts its tokens now holds none
    return empty


def _zero_states(layer: Any, batch: int | None) -> None:
    """A hybrid layer's conv and recurrent states zeroed (what a prompt starts from: the causal conv pads with zeros,
    the scan starts from zeros), with `batch` rows when given."""
    for name in ("conv_states", "recurrent_states"):
        states = getattr(layer, name, None)
        for index, tensor in (states.items() if isinstance(states, dict) else []):
            if isinstance(tensor, torch.Tensor):
                shape = list(tensor.shape)
                if batch is not None:
                    shape[0] = batch
                states[index] = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)


def prompt_inputs(template: dict[str, Any], ids: torch.Tensor) -> dict[str, Any]:
    """The merged graph's call for a whole prompt `ids` on an empty cache (what a prefill does)."""
    key = cache_input_name(template)
    return step_inputs(template, ids, 0, empty_cache(template[key], ids.shape[0]) if key else None)
