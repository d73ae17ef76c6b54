"""A `GroupQueryAttention` graph that ONNX Runtime GenAI runs on one buffer shared by the past and the present.

GenAI's `past_present_share_buffer: true` (what its own model builder writes) feeds every step a past as long as
`max_length` and lets `GroupQueryAttention` write the new keys into it in place, instead of copying the whole cache
into a longer present each step: at a 256-token context that is the difference between 0.84x and 0.93x of the
builder's decode (benchmarks/RESULTS.md). The attention learns how many slots hold tokens from `seqlens_k` and
`total_sequence_length`; the model builder computes them from the attention mask, while upstream's fusion
(`ort_fusions: "cpu"` with the batch fixed at 1, docs/upstream-gaps.md #33) computes them from the past's shape,
which a shared buffer makes `max_length`. [`share_past_present`] rewrites that one read: the past's length becomes
the attention mask's length less the query's (what it is whenever the mask covers past + query, as every runtime
sends it), and the graph may then share its buffer when nothing else reads the past.

Example:
    >>> import onnx
    >>> from onnx import TensorProto, helper
    >>> past = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, 2, "past", 4])
    >>> ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])
    >>> mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total"])
    >>> out = helper.make_tensor_value_info("length", TensorProto.INT64, [1])
    >>> read = helper.make_node("Shape", ["past_key_values.0.key"], ["length"], start=2, end=3)
    >>> gqa = helper.make_node("GroupQueryAttention", ["q", "", "", "past_key_values.0.key"], ["o"],
    ...                        domain="com.microsoft")
    >>> graph = helper.make_graph([read, gqa], "g", [ids, mask, past], [out])
    >>> proto = helper.make_model(graph)
    >>> share_past_present(proto), [n.op_type for n in proto.graph.node]
    (True, ['Shape', 'Shape', 'Sub', 'GroupQueryAttention'])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.upstream import GQA_GUARD_NAME

__all__ = ["SHARED_BUFFER_NOTE", "share_past_present", "share_past_present_in_file"]

ATTENTION = "GroupQueryAttention"
PAST_PREFIX = "past_key_values."
SEQUENCE_AXIS = 2  # [batch, heads, past, head size]
SHARED_BUFFER_NOTE = ("the GroupQueryAttention graph takes the past's length from the attention mask (attention mask "
                      "length less the query's), so ONNX Runtime GenAI runs it on one past/present buffer "
                      "(genai_config.json: past_present_share_buffer true), as its model builder's graph; feed a mask "
                      "that covers the past and the new tokens")


def share_past_present(proto: Any) -> bool:
    """Rewrite `proto` (an `onnx.ModelProto`, in place) so that every read of the past's length
    (`Shape(past_key_values.*)` of axis 2 alone) reads `attention_mask`'s length less `input_ids`'s instead, and say
    whether GenAI may then share the past and present buffer: the graph has `GroupQueryAttention` and nothing but it
    and those reads takes a past. A graph it cannot share (no such attention, another reader of the past, no mask
    or token ids to take the lengths from) is left unchanged and the answer is `False`."""
    from onnx import helper  # heavy runtime, deferred

    graph = proto.graph
    inputs = {value.name for value in graph.input}
    past = {name for name in inputs if name.startswith(PAST_PREFIX)}
    if not past or not {"attention_mask", "input_ids"} <= inputs:
        return False
    if not any(node.op_type == ATTENTION or _guarded_attention(node) for node in graph.node):
        return False
    reads = []
    for node in graph.node:
        if node.op_type == ATTENTION or _guarded_attention(node) or not _reads(node, past):
            continue
        if node.op_type != "Shape" or _axes(node) != (SEQUENCE_AXIS, SEQUENCE_AXIS + 1):
            return False
        reads.append(node)
    for read in reads:
        index = list(graph.node).index(read)
        total, query = f"{read.name}_mask_length", f"{read.name}_query_length"
        replacement = [
            helper.make_node("Shape", ["attention_mask"], [total], start=1, end=2, name=f"{read.name}_mask_shape"),
            helper.make_node("Shape", ["input_ids"], [query], start=1, end=2, name=f"{read.name}_ids_shape"),
            helper.make_node("Sub", [total, query], [read.output[0]], name=f"{read.name}_past_from_mask"),
        ]
        graph.node.remove(read)
        for offset, node in enumerate(replacement):
            graph.node.insert(index + offset, node)
    return True


def share_past_present_in_file(path: Path) -> bool:
    """[`share_past_present`] on the saved graph at `path`, rewritten in place when it can share (its weights,
    embedded or in the sidecar, untouched)."""
    import onnx  # heavy runtime, deferred

    proto = onnx.load(str(path), load_external_data=False)
    if not share_past_present(proto):
        return False
    onnx.save_model(proto, str(path))
    return True


def _guarded_attention(node: Any) -> bool:
    """Whether `node` is the `If` around a `GroupQueryAttention` that `ort_fusions: "cpu"` writes at a dynamic batch
    (`exporters.upstream.group_query_attention_at_any_batch`): the fused op, or, for several tokens after a past at a
    batch over 1, the past read up to the length the mask gives."""
    return node.op_type == "If" and node.name.startswith(GQA_GUARD_NAME)


def _reads(node: Any, names: set[str]) -> bool:
    """Whether `node`, or a node of a graph it holds (an `If`'s branches read the outer graph's values), reads any of
    `names`."""
    if any(name in names for name in node.input):
        return True
    graphs = [graph for attribute in node.attribute for graph in [attribute.g, *attribute.graphs] if graph.node]
    return any(_reads(inner, names) for graph in graphs for inner in graph.node)


def _axes(node: Any) -> tuple[int | None, int | None]:
    """A `Shape` node's `start` and `end` attributes (None where absent)."""
    values = {attribute.name: attribute.i for attribute in node.attribute}
    return values.get("start"), values.get("end")
