"""A fused batch-1 decoder graph written for the calls ONNX Runtime GenAI makes: one unpadded sequence whose
positions count up from 0 (recipe: `"unpadded": true`, issue #51).

The graph `ort_fusions: "cpu"` writes computes what eager computes for every call a batch of 1 can make, a
left-padded prompt included: each `GroupQueryAttention` takes the padding-and-causal mask as its bias, a left pad's
empty rows are zeroed after it, and each token is rotated at its own `position_ids` (its cos / sin computed every
step and padded to the total length). GenAI's own model builder writes none of that: GenAI never pads a single
sequence, and its positions are the cache's. Those ~64 small kernels a step are what kept our graph's GenAI decode at
0.957x the builder's; without them the graph has the builder's 89 kernels at 58M and decodes at 1.011x
(benchmarks/RESULTS.md, "What each call the batch-1 int4 graph takes costs"). [`write_for_unpadded_calls`] drops
the bias and the zeroed rows (the kernel's own causal mask remains), reads `seqlens_k` without expanding it over
the batch (of 1), and gives every attention eager's own cos / sin
at positions 0 .. `max_position_embeddings` - 1 as constants, rotated at the positions the kernel reads off
`seqlens_k` (the past's length plus the token's index), without `position_ids`.

On an unpadded call it computes what the graph computed before (the tables' float32 rounding aside); a padded one
is not computed right, and `position_ids` is no longer read (the graph keeps the input, which GenAI feeds). Refused,
with the reason, where that would change an unpadded call too: a dynamic batch, an attention rotated outside the
fused op, a window or chunk in the mask (a sliding-window or chunked layer), a rope whose tables are not constant.

Example:
    >>> UNPADDED_NOTE.startswith("written for ONNX Runtime GenAI's calls (unpadded: true)")
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from exporters.errors import TargetPlanError

__all__ = ["UNPADDED_NOTE", "rotary_tables", "write_for_unpadded_calls", "write_for_unpadded_calls_in_file"]

ATTENTION, ROTATES = "GroupQueryAttention", "do_rotary"
SEQLENS, COS, SIN, POSITIONS, BIAS = 5, 7, 8, 9, 10  # the fused op's inputs
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # tables that do not depend on the sequence's length
UNPADDED_NOTE = ("written for ONNX Runtime GenAI's calls (unpadded: true): one unpadded sequence whose positions "
                 "count up from 0; the attention mask's zeros and position_ids are not read, so a padded call is not "
                 "computed right (GenAI, and optimum's and transformers.js's generate() for one prompt, never pad "
                 "one); the attention applies its own causal mask and eager's rotary tables as constants")


def rotary_tables(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """Eager's own cos and sin (their first halves, as the fused op takes them) at positions 0 ..
    `max_position_embeddings` - 1, from the model's one rotary module; refused (`TargetPlanError`) where the model's
    mask or rope would make them, or a graph without padding, compute something else."""
    config = getattr(model.config, "text_config", None) or model.config
    refusal = _refusal(config)
    rotary = [module for name, module in model.named_modules() if name.endswith("rotary_emb")
              and hasattr(module, "inv_freq")]
    if refusal is None and len({id(module) for module in rotary}) != 1:
        refusal = f"the model has {len(rotary)} rotary modules, not one"
    if refusal is not None:
        raise TargetPlanError(f"unpadded: {refusal}; leave `unpadded` out (the graph then takes padded calls)",
                              option="unpadded")
    positions = torch.arange(int(config.max_position_embeddings)).unsqueeze(0)
    probe = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = rotary[0](probe, positions)  # float32, as the probe: eager's own computation
    half = cos.shape[-1] // 2
    return (cos[0, :, :half].float().numpy(), sin[0, :, :half].float().numpy())


def _refusal(config: Any) -> str | None:
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"its layers are {sorted(layer_types)}: a window or chunk lives in the mask this drops"
    for name in ("sliding_window", "attention_chunk_size"):
        if getattr(config, name, None):
            return f"its config sets {name}: a window or chunk lives in the mask this drops"
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind not in STATIC_ROPE_TYPES:
        return f"its rope type {kind!r} computes tables that depend on the sequence's length"
    if getattr(config, "max_position_embeddings", None) is None:
        return "its config has no max_position_embeddings (the tables' length)"
    return None


def write_for_unpadded_calls(proto: Any, cos: np.ndarray, sin: np.ndarray) -> None:
    """Rewrite `proto` (an `onnx.ModelProto`, in place; see the module); `TargetPlanError` where it cannot."""
    from onnx import numpy_helper  # heavy runtime, deferred

    graph = proto.graph
    ids = next((value for value in graph.input if value.name == "input_ids"), None)
    if ids is None or ids.type.tensor_type.shape.dim[0].dim_value != 1:
        raise TargetPlanError("unpadded: the graph's batch is not fixed at 1 (a batch pads its shorter sequences): "
                              "fix it in the merged contract (`components.model.dynamic_shapes` naming only "
                              "sequence_length and past_sequence_length), or leave `unpadded` out", option="unpadded")
    attentions = [node for node in graph.node if node.op_type == ATTENTION]
    if not attentions or any(node.op_type == "If" for node in graph.node) or not all(
            _rotates_inside(node) for node in attentions):
        raise TargetPlanError("unpadded: the graph's attentions are not all GroupQueryAttention rotating inside "
                              "(`ort_fusions: \"cpu\"`, head sizes in multiples of 16)", option="unpadded")
    dtype = {1: np.float32, 10: np.float16}[_past_type(graph)]
    tables = []
    for name, table in (("unpadded_cos_cache", cos), ("unpadded_sin_cache", sin)):
        graph.initializer.append(numpy_helper.from_array(table.astype(dtype), name))
        tables.append(name)
    produced = {output: node for node in graph.node for output in node.output}
    outputs = {attention.output[0] for attention in attentions}
    renamed = {}
    for node in list(graph.node):  # the empty rows zeroed after each attention: the attention's output itself
        if node.op_type == "Where" and len(node.input) == 3 and node.input[2] in outputs \
                and _constant_zero(produced.get(node.input[1]), graph, node.input[1]):
            renamed[node.output[0]] = node.input[2]
            graph.node.remove(node)
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        if node.op_type == ATTENTION:
            while len(node.input) <= BIAS:
                node.input.append("")
            node.input[COS], node.input[SIN], node.input[POSITIONS], node.input[BIAS] = *tables, "", ""
            expand = produced.get(node.input[SEQLENS])
            if expand is not None and expand.op_type == "Expand":  # `seqlens_k` ([1]) over a batch that is 1
                node.input[SEQLENS] = expand.input[0]
    _remove_unused(graph)


def write_for_unpadded_calls_in_file(path: Path, model: Any) -> None:
    """[`write_for_unpadded_calls`] on the saved graph at `path` with `model`'s tables (embedded in the graph file:
    two `max_position_embeddings` x head size / 2 tables), its weights' sidecar untouched."""
    import onnx  # heavy runtime, deferred

    proto = onnx.load(str(path), load_external_data=False)
    write_for_unpadded_calls(proto, *rotary_tables(model))
    onnx.save_model(proto, str(path))


def _rotates_inside(node: Any) -> bool:
    rotary = next((attribute.i for attribute in node.attribute if attribute.name == ROTATES), 0)
    return bool(rotary) and len(node.input) > SIN and bool(node.input[COS])


def _past_type(graph: Any) -> int:
    past = next((value for value in graph.input if value.name.startswith("past_key_values.")), None)
    element = past.type.tensor_type.elem_type if past is not None else 0
    if element not in (1, 10):
        raise TargetPlanError("unpadded: the graph's cache is neither float32 nor float16", option="unpadded")
    return element


def _constant_zero(producer: Any, graph: Any, name: str) -> bool:
    """Whether `name` is a zero: an initializer or a `Constant` node's value."""
    from onnx import numpy_helper  # heavy runtime, deferred

    tensor = next((t for t in graph.initializer if t.name == name), None)
    if tensor is None and producer is not None and producer.op_type == "Constant":
        tensor = next((a.t for a in producer.attribute if a.name == "value"), None)
    return tensor is not None and not numpy_helper.to_array(tensor).any()


def _remove_unused(graph: Any) -> None:
    """Drop the nodes and initializers nothing reads any more (the mask, bias and per-token rotary computation)."""
    needed = {output.name for output in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
            needed.update(name for attribute in node.attribute for sub in [attribute.g, *attribute.graphs]
                          for inner in sub.node for name in inner.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    initializers = [tensor for tensor in graph.initializer if tensor.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
