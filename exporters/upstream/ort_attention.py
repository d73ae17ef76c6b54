"""ONNX Runtime's `GroupQueryAttention` in a merged decoder with a dynamic batch (docs/upstream-gaps.md #33): part of
the one adapter (`exporters.upstream`).

`OnnxConfig(ort_fusions="cpu")` fuses an attention over a key-value cache update into `GroupQueryAttention`, the op
ONNX Runtime GenAI's model builder writes, but only where the graph's batch is fixed at 1: ONNX Runtime's kernel
refuses one call of the merged graph, several new tokens after a past for more than one sequence (`batch_size must
be 1 when sequence_length > 1 and past context is given`), and the merged graph takes every call. The other calls
(a prompt on an empty past, one token after a past, anything for one sequence) are the ones generation makes, in
GenAI and optimum alike, and the kernel runs them at any batch.

[`group_query_attention_at_any_batch`] fuses a merged graph with a dynamic batch as upstream fuses one with a batch of
1, then puts each such attention in an `If`: the fused op for the calls its kernel takes, and for the one it refuses
the same attention in standard ops, computed from the fused op's own inputs (the past, up to its length, and the new
keys and values; rotated as the fused op rotates; the causal mask and the attention's bias). A prompt of several
sequences takes the standard ops too where the fused op rotates it: the kernel rotates every sequence at the first
one's positions (docs/upstream-gaps.md #43). The graph computes what it computed before for every call; every
decode step runs the fused kernel.

After the guards, three rewrites cut a decode step's work and change no output (`DECODE_STEP_PASSES`, #51): the
`If`s test the query's batch and length, the same in every layer, so one condition serves them all
([`_one_condition_for_all_guards`]: five kernels a layer less); the attention output's fully masked rows are
zeroed on its own `[batch, length, hidden]` output ([`_masked_rows_zeroed_unreshaped`]: two `Reshape`s a layer less,
in the batch-1 graph too); and a fused norm's statistics that nothing reads are not asked for
([`_unread_norm_statistics_dropped`]: two outputs fewer to allocate and write per norm, as the GenAI builder writes
them).

Example:
    >>> with group_query_attention_at_any_batch():  # doctest: +SKIP
    ...     onnx_program = exporter.export(model, config)  # OnnxConfig(optimize=True, ort_fusions="cpu")
"""

from __future__ import annotations

import contextlib
import math
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from exporters.upstream.patches import patched

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["GQA_GUARD_NAME", "group_query_attention_at_any_batch"]

ATTENTION, DOMAIN = "GroupQueryAttention", "com.microsoft"
GQA_GUARD_NAME = "group_query_attention_guard"  # the `If` nodes' name prefix: a reader of the graph can tell them
# the attributes upstream's CPU fusion writes; another one (a softcap, a window, query-key norms) has no standard-op
# equivalent here, and its graph is refused rather than guarded wrongly
KNOWN_ATTRIBUTES = frozenset({"num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved"})
CONDITION = "group_query_attention_guard_condition"  # a guard's `meta` key: the sizes its condition tests
ATTENTION_INPUTS = 11  # query, key, value, past key, past value, seqlens_k, total length, cos, sin, positions, bias


def _stack() -> tuple[ModuleType, ModuleType]:
    """onnx_ir and upstream's fusions module, which loads onnxscript: imported when an ONNX graph is fused."""
    import onnx_ir  # the ONNX stack, loaded only by an ONNX export
    import transformers.exporters.onnxruntime_fusions as onnxruntime_fusions  # loads onnxscript

    return onnx_ir, onnxruntime_fusions


@contextlib.contextmanager
def group_query_attention_at_any_batch() -> Iterator[None]:
    """While active, `ort_fusions: "cpu"` fuses `GroupQueryAttention` into a merged decoder whatever its batch, each
    attention that takes several tokens after a past for any batch guarded by an `If` (see the module's text). A
    graph upstream fuses already (a batch fixed at 1, a prefill, a decode of one token) comes out as before."""
    _, fusions = _stack()
    steps, fuse = fusions._STEPS, fusions._fuse_group_query_attention
    if not any(step is fuse and providers == ("cpu",) for step, providers in steps):
        yield  # upstream's steps changed: its own fusion, unchanged
        return
    ours = tuple((partial(_fused_as_for_one_sequence, fuse) if step is fuse and providers == ("cpu",) else step,
                  providers) for step, providers in steps) + ((_guard_all, ("cpu",)),)
    ours += tuple((step, ("cpu",)) for step in DECODE_STEP_PASSES)
    with patched(fusions, "_STEPS", ours):
        yield


def _fused_as_for_one_sequence(fuse: Callable[..., None], model: ir.Model, *args: Any, **kwargs: Any) -> None:
    """Upstream's fusion deciding about a dynamic batch as about a batch of 1: the only size it reads at axis 0 is
    the query's, to refuse several tokens after a past for more than one sequence (which [`_guard_all`] then
    routes to standard ops)."""
    _, fusions = _stack()
    static_dim = fusions._static_dim

    def batch_as_one(value: ir.Value, axis: int) -> int | None:
        size = static_dim(value, axis)
        return 1 if axis == 0 and size is None else size

    with patched(fusions, "_static_dim", batch_as_one):
        fuse(model, *args, **kwargs)


def _guard_all(model: ir.Model) -> None:
    """Put every `GroupQueryAttention` of the main graph that may get several tokens after a past for more than one
    sequence in an `If` (after the fusions: they see the attention as upstream left it), each with a condition of
    its own ([`_one_condition_for_all_guards`] then shares one)."""
    for node in list(model.graph):
        if node.op_type != ATTENTION or node.domain != DOMAIN or node.inputs[3] is None:
            continue
        if _fixed(node.inputs[0], 0, 1) or _fixed(node.inputs[0], 1, 1):
            continue  # one sequence, or one new token: the kernel takes every call
        _guard(model.graph, node)


def _fixed(value: ir.Value, axis: int, size: int) -> bool:
    _, fusions = _stack()
    return fusions._static_dim(value, axis) == size


def _guard(graph: ir.Graph, node: ir.Node) -> None:
    ir, fusions = _stack()
    unknown = set(node.attributes) - KNOWN_ATTRIBUTES
    extra = [value for value in node.inputs[ATTENTION_INPUTS:] if value is not None]
    if unknown or extra or len(node.outputs) != 3 or any(output.uses() for output in node.outputs[3:]):
        raise NotImplementedError(
            f"{node.name}: a GroupQueryAttention with {sorted(unknown) or 'inputs or outputs past the bias'} has no "
            "standard-op form here for several tokens after a past at a batch over 1; export with the batch fixed at "
            "1 (docs/recipe.md, 'ONNX Runtime GenAI on CPU') or without ort_fusions")
    tape = ir.tape.Tape()
    takes, sizes = _condition(tape, node)
    fused = ir.Node(DOMAIN, ATTENTION, node.inputs,
                    attributes=[ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()], num_outputs=3,
                    name=f"{node.name}_fused")
    for new, old in zip(fused.outputs, node.outputs):
        new.dtype, new.shape, new.name = old.dtype, old.shape, f"{old.name}_fused"
    then_branch = ir.Graph([], list(fused.outputs), nodes=[fused], name=f"{node.name}_then")
    unfused = ir.tape.Tape()
    outputs = _standard_attention(unfused, node)
    for new, old in zip(outputs, node.outputs):
        new.dtype, new.shape = old.dtype, None
    else_branch = ir.Graph([], outputs, nodes=unfused.nodes, name=f"{node.name}_else")
    guard = ir.Node("", "If", [takes], attributes=[ir.AttrGraph("then_branch", then_branch),
                                                     ir.AttrGraph("else_branch", else_branch)],
                    num_outputs=3, name=f"{GQA_GUARD_NAME}_{node.name}")
    for new, old in zip(guard.outputs, node.outputs):
        new.dtype, new.shape = old.dtype, old.shape
    guard.meta[CONDITION] = (sizes, list(tape.nodes))  # what the condition tests and the nodes computing it
    for index, value in enumerate(v for n in [*tape.nodes, *unfused.nodes] for v in n.outputs):
        value.name = f"{GQA_GUARD_NAME}_{node.name}_{index}"  # unique across the graph and its branches (SSA)
    graph.insert_before(node, [*tape.nodes, guard])
    for new, old in zip(guard.outputs, node.outputs):
        fusions._replace(old, new)
    graph.remove(node, safe=True)


def _condition(tape: ir.tape.Tape, node: ir.Node) -> tuple[ir.Value, tuple[Any, ...] | None]:
    """Whether `node`'s kernel takes the call (one new token, one sequence, or, where it does not rotate at the
    positions it is given, a prompt: as many tokens as the total), and the sizes that decides it: the query's named
    batch and length and the total value it compares with, or `None` where the query's sizes have no names."""
    ir, _ = _stack()
    query = node.inputs[0]
    tests_total = not (node.attributes.get_int("do_rotary", 0) and node.inputs[9] is not None)
    dims = list(query.shape or [])[:2]
    named = len(dims) == 2 and all(isinstance(dim, ir.SymbolicDim) and dim.value for dim in dims)
    sizes = (*(dim.value for dim in dims), node.inputs[6] if tests_total else None) if named else None
    batch = tape.op("Shape", [query], attributes={"start": 0, "end": 1})
    length = tape.op("Shape", [query], attributes={"start": 1, "end": 2})
    one = _ints(tape, [1])
    takes = tape.op("Or", [tape.op("Equal", [length, one]), tape.op("Equal", [batch, one])])
    if tests_total:
        # rotated inside, the kernel rotates every sequence of a prompt at the first one's positions (#43)
        total = tape.op("Cast", [tape.op("Reshape", [node.inputs[6], _ints(tape, [-1])])],
                        attributes={"to": ir.DataType.INT64})
        takes = tape.op("Or", [takes, tape.op("Equal", [length, total])])
    return takes, sizes


def _one_condition_for_all_guards(model: ir.Model) -> None:
    """One condition for every guard that tests the same sizes: a decoder's layers all read the query's batch and
    length (named alike: ONNX's symbolic dimensions of one name are one size) and the same total, so the first
    guard's condition serves the others and theirs go (five kernels a layer less per step; benchmarks/RESULTS.md,
    #51). A guard whose query's sizes have no names keeps its own."""
    first: dict[tuple[Any, ...], ir.Value] = {}
    for node in list(model.graph):
        sizes, nodes = node.meta.get(CONDITION, (None, []))
        if sizes is None:
            continue
        if sizes not in first:
            first[sizes] = node.inputs[0]
            continue
        node.replace_input_with(0, first[sizes])
        model.graph.remove(nodes, safe=True)


def _standard_attention(tape: ir.tape.Tape, node: ir.Node) -> list[ir.Value]:
    """`GroupQueryAttention`'s output, present key and present value for `node`'s inputs in standard ops (and ONNX
    Runtime's `RotaryEmbedding`, as the fused op rotates), as its kernel computes them: the new keys and values
    written after the past's tokens (`seqlens_k + 1` less the new tokens: upstream's fusion gives every sequence the
    same), into the past's buffer where it is longer (a static cache, GenAI's buffer shared with the present); the
    attention over as many slots as its bias spans (the past and the new tokens without one), each query row causal
    after the past."""
    ir, fusions = _stack()
    query, key, value, past_key, past_value, seqlens_k, _, cos, sin, positions, bias = (
        [*node.inputs] + [None] * ATTENTION_INPUTS)[:ATTENTION_INPUTS]
    heads, kv_heads = node.attributes.get_int("num_heads"), node.attributes.get_int("kv_num_heads")
    head_size = fusions._static_dim(past_key, 3)
    dtype = node.outputs[0].dtype.numpy()
    if key is None:  # packed: one projection, the query's heads then the key's and the value's
        sizes = _ints(tape, [heads * head_size, kv_heads * head_size, kv_heads * head_size])
        query, key, value = (tape.op_multi_out("Split", [query, sizes], attributes={"axis": -1}, num_outputs=3))

    def split_heads(x: ir.Value, count: int) -> ir.Value:
        """[batch, length, count * head] -> [batch, count, length, head]"""
        return tape.op("Transpose", [tape.op("Reshape", [x, _ints(tape, [0, 0, count, head_size])])],
                       attributes={"perm": [0, 2, 1, 3]})

    query, key, value = split_heads(query, heads), split_heads(key, kv_heads), split_heads(value, kv_heads)
    if node.attributes.get_int("do_rotary", 0):
        interleaved = node.attributes.get_int("rotary_interleaved", 0)
        query, key = (tape.op("RotaryEmbedding", [x, positions, cos, sin], attributes={"interleaved": interleaved},
                              domain=DOMAIN) for x in (query, key))
    zero, axis = _ints(tape, [0]), _ints(tape, [2])
    length = tape.op("Shape", [query], attributes={"start": 2, "end": 3})
    written = tape.op("Cast", [tape.op("Gather", [seqlens_k, zero])], attributes={"to": ir.DataType.INT64})
    past = tape.op("Sub", [tape.op("Add", [written, _ints(tape, [1])]), length])
    after, end = tape.op("Add", [past, length]), _ints(tape, [np.iinfo(np.int64).max])

    def update(cache: ir.Value, new: ir.Value) -> ir.Value:
        """The present: the past's tokens, the new ones, then the buffer's slots after them (none for a past as long
        as what it holds)."""
        return tape.op("Concat", [tape.op("Slice", [cache, zero, past, axis]), new,
                                  tape.op("Slice", [cache, after, end, axis])], attributes={"axis": 2})

    present_key, present_value = update(past_key, key), update(past_value, value)
    span = tape.op("Shape", [bias], attributes={"start": 3, "end": 4}) if bias is not None else after
    keys, values = (tape.op("Slice", [x, zero, span, axis]) for x in (present_key, present_value))
    if heads != kv_heads:  # each key-value head repeated for its group of query heads
        repeat = _ints(tape, [1, 1, heads // kv_heads, 1, 1])
        keys, values = (tape.op("Reshape", [tape.op("Expand", [tape.op("Unsqueeze", [x, axis]), repeat]),
                                            _ints(tape, [0, heads, -1, head_size])]) for x in (keys, values))
    scale = node.attributes.get_float("scale", 0.0) or 1.0 / math.sqrt(head_size)
    transposed = tape.op("Transpose", [keys], attributes={"perm": [0, 1, 3, 2]})
    scores = tape.op("Mul", [tape.op("MatMul", [query, transposed]), _constant(tape, np.array(scale, dtype=dtype))])
    if bias is not None:
        scores = tape.op("Add", [scores, bias])
    # query row i, at position past + i, sees the keys up to it
    rows = tape.op("Add", [_range(tape, length), past])
    columns = _range(tape, span)
    visible = tape.op("LessOrEqual", [tape.op("Unsqueeze", [columns, zero]),
                                      tape.op("Unsqueeze", [rows, _ints(tape, [1])])])
    scores = tape.op("Where", [visible, scores, _constant(tape, np.array(np.finfo(dtype).min, dtype=dtype))])
    attended = tape.op("MatMul", [tape.op("Softmax", [scores], attributes={"axis": -1}), values])
    return [fusions._merge_heads(tape, attended, False, _ints(tape, [0, 0, -1])), present_key, present_value]


def _masked_rows_zeroed_unreshaped(model: ir.Model) -> None:
    """Zero an attention's fully masked query rows on its own `[batch, length, hidden]` output. Eager's SDPA path
    zeroes a row that attends to nothing (a left pad); exported, that is per layer a `Reshape` to heads, a `Where`
    with a `[batch, length, 1, 1]` mask and a `Reshape` back, two of its three kernels moving nothing. Rewritten as
    one `Where` with the mask squeezed once to `[batch, length, 1]` for every layer: the same elements, zeroed the
    same (sixteen kernels less per step at eight layers; benchmarks/RESULTS.md, #51). Only where the shapes prove it:
    a one-element fill, a mask of ones past its first two axes, the reshaped output's first two axes the
    attention's, and the result's shape the attention output's."""
    ir, fusions = _stack()
    squeezed: dict[ir.Value, ir.Value] = {}
    for where in list(model.graph):
        merge = _unreshaped_where(where)
        if merge is None:
            continue
        mask, fill, heads = where.inputs
        split = heads.producer()
        attended = split.inputs[0]
        if mask not in squeezed:
            tape = ir.tape.Tape()
            squeezed[mask] = tape.op("Squeeze", [mask, _ints(tape, [3])])
            squeezed[mask].shape, squeezed[mask].dtype = ir.Shape(list(mask.shape)[:3]), mask.dtype
            squeezed[mask].name = f"{mask.name}_rows"
            model.graph.insert_before(where, tape.nodes)
        flat = ir.node("Where", [squeezed[mask], fill, attended], name=f"{where.name}_unreshaped")
        flat.outputs[0].shape, flat.outputs[0].dtype = attended.shape, attended.dtype
        flat.outputs[0].name = f"{where.outputs[0].name}_unreshaped"
        model.graph.insert_before(merge, flat)
        fusions._replace(merge.outputs[0], flat.outputs[0])
        model.graph.remove([merge, where, split], safe=True)


def _unreshaped_where(where: ir.Node) -> ir.Node | None:
    """The `Reshape` after `where` when `where` zeroes rows of an attention's `[batch, length, hidden]` output
    reshaped to `[batch, length, heads, -1]` (a constant target copying the first two axes), so that
    [`_masked_rows_zeroed_unreshaped`] may rewrite it, else `None`."""
    _, fusions = _stack()
    if where.op_type != "Where" or where.domain != "" or len(where.inputs) != 3:
        return None
    mask, fill, heads = where.inputs
    split = heads.producer() if heads is not None else None
    uses = list(where.outputs[0].uses())
    if split is None or split.op_type != "Reshape" or len(list(heads.uses())) != 1 or len(uses) != 1:
        return None
    merge, target, fill_value = uses[0][0], fusions._constant(split.inputs[1]), fusions._constant(fill)
    attended = _attention_output_shape(split.inputs[0])
    if merge.op_type != "Reshape" or merge.inputs[0] is not where.outputs[0] or attended is None \
            or target is None or list(target)[:2] != [0, 0] or len(target) != 4 \
            or split.attributes.get_int("allowzero", 0) or fill_value is None or fill_value.size != 1 \
            or mask.shape is None or merge.outputs[0].shape is None \
            or any(v.is_graph_output() for v in (mask, heads, where.outputs[0])):
        return None
    mask_shape = list(mask.shape)
    if len(mask_shape) != 4 or mask_shape[2:] != [1, 1] or list(merge.outputs[0].shape) != attended \
            or not all(m == 1 or m == a for m, a in zip(mask_shape[:2], attended[:2])):
        return None
    return merge


def _attention_output_shape(value: ir.Value) -> list[Any] | None:
    """`[batch, length, heads x head size]` of a `GroupQueryAttention`'s (or its guard's) first output, from its
    query's sizes and its past's head size; `None` for another value or sizes not known."""
    _, fusions = _stack()
    node = value.producer()
    if node is not None and node.op_type == "If" and node.name.startswith(GQA_GUARD_NAME):
        branch = list(node.attributes["then_branch"].value)
        node = branch[0] if len(branch) == 1 else None
    if node is None or node.op_type != ATTENTION or node.domain != DOMAIN or value.index() != 0:
        return None
    query, head_size = node.inputs[0].shape, fusions._static_dim(node.inputs[3], 3) if node.inputs[3] else None
    if query is None or len(query) != 3 or head_size is None:
        return None
    return [*list(query)[:2], node.attributes.get_int("num_heads") * head_size]


NORMS_WITH_STATISTICS = frozenset({"SkipSimplifiedLayerNormalization", "SkipLayerNormalization"})
STATISTICS = slice(1, 3)  # their optional mean and inverse standard deviation; the skip's sum (3) is read


def _unread_norm_statistics_dropped(model: ir.Model) -> None:
    """Leave unnamed (not asked for) the mean and inverse standard deviation outputs of ONNX Runtime's fused skip
    norms where nothing reads them: the fusion names all four outputs, and the kernel allocates and writes every
    output it is given (sixteen norms a step at eight layers; benchmarks/RESULTS.md, #51). An output a graph, a
    node or a subgraph reads keeps its name (an `If` branch's read of an outer value is one of the value's uses)."""
    for node in model.graph:
        if node.op_type not in NORMS_WITH_STATISTICS or node.domain != DOMAIN:
            continue
        for value in node.outputs[STATISTICS]:
            if value.name and not value.uses() and not value.is_graph_output():
                value.name = ""


# after the guards, the rewrites that cut a decode step's work without changing any output (#51); a test runs
# the graph without them and compares
DECODE_STEP_PASSES: tuple[Callable[[ir.Model], None], ...] = (_one_condition_for_all_guards,
                                                               _masked_rows_zeroed_unreshaped,
                                                               _unread_norm_statistics_dropped)


def _range(tape: ir.tape.Tape, end: ir.Value) -> ir.Value:
    """0 .. end - 1, `end` a one-element int64 tensor."""
    return tape.op("Range", [_constant(tape, np.array(0, dtype=np.int64)), tape.op("Squeeze", [end, _ints(tape, [0])]),
                             _constant(tape, np.array(1, dtype=np.int64))])


def _ints(tape: ir.tape.Tape, values: list[int]) -> ir.Value:
    return _constant(tape, np.array(values, dtype=np.int64))


def _constant(tape: ir.tape.Tape, array: np.ndarray) -> ir.Value:
    ir, _ = _stack()
    return tape.op("Constant", [], attributes={"value": ir.tensor(array)})
