"""The merged decoder graph under the names ONNX runtimes bind: optimum's, ONNX Runtime GenAI's and transformers.js's.

Upstream names a graph's inputs and outputs by their pytree leaf paths (`input.cache.layers.0.keys`,
`output.cache.layers.0.values`) and its symbolic dims by torch's symbols (`s53`). The runtimes that load a decoder-only
folder bind by other names, the same in all three:

| upstream                       | runtimes                    | dims                                            |
|--------------------------------|-----------------------------|-------------------------------------------------|
| `input_ids`, `position_ids`    | same                        | `[batch_size, sequence_length]`                 |
| `attention_mask`               | same                        | `[batch_size, total_sequence_length]`           |
| `input.cache.layers.{i}.keys`  | `past_key_values.{i}.key`   | `[batch_size, heads, past_sequence_length, d]`  |
| `logits`                       | same                        | `[batch_size, sequence_length, vocab]`          |
| `output.cache.layers.{i}.keys` | `present.{i}.key`           | `[batch_size, heads, total_sequence_length, d]` |

(values likewise, in layer order k0, v0, k1, v1: optimum pairs cache inputs and outputs by position). transformers.js
builds the first, empty cache from the graph's input dims and resolves only the symbol `batch_size` (every other
symbol becomes 0), so the names are part of the contract, not cosmetics.

[`rename_merged_graph`] rewrites the protobuf in place (the weights are not read) and records in `export.json` which
upstream leaf each graph input is (`components.model.inputs`), so `exporters.upstream.load_exported` still runs the
graph with upstream's runner (`RenamedRunner`).

Example:
    >>> graph_name("input.cache.layers.3.values", output=False)
    'past_key_values.3.value'
    >>> graph_name("output.cache.layers.0.keys", output=True)
    'present.0.key'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from exporters.errors import TargetPlanError
from exporters.upstream import read_manifest, write_manifest

_CACHE = re.compile(r"^(?:input\.|output\.)?(?:cache|past_key_values)\.layers\.(\d+)\.(keys|values)$")
_SYMBOL = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
TOTAL_DIM = "total_sequence_length"
# Input name -> {axis: dim name} for the dims runtimes read or users see.
_DIM_NAMES = {"input_ids": {0: "batch_size", 1: "sequence_length"},
              "inputs_embeds": {0: "batch_size", 1: "sequence_length"},
              "position_ids": {0: "batch_size", 1: "sequence_length"},
              "attention_mask": {0: "batch_size", 1: TOTAL_DIM},
              "token_type_ids": {0: "batch_size", 1: "sequence_length"}}


def graph_name(name: str, output: bool, option: str | None = "layout") -> str:
    """The runtimes' name of an upstream graph input or output: `input.cache.layers.0.keys` →
    `past_key_values.0.key`, `output.cache.layers.0.values` → `present.0.value`; other names are kept. A leaf the
    runtimes have no name for (`input.cache.layers.0._sliding_window_tensor`) raises, or keeps its name when
    `option` is None."""
    match = _CACHE.match(name)
    if match:
        kind = "key" if match[2] == "keys" else "value"
        return f"{'present' if output else 'past_key_values'}.{match[1]}.{kind}"
    if name.startswith(("input.", "output.")) and option is not None:
        raise TargetPlanError(f"the merged decoder graph's {name!r} has no name in optimum / ONNX Runtime GenAI / "
                              "transformers.js (only key/value caches of decoder-only models are supported)",
                              option=option)
    return name


def rename_values(graph, names: dict[str, str]) -> None:
    """Rename values everywhere in `graph` and its subgraphs (which can read outer values by name)."""
    import onnx  # heavy runtime, deferred

    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = names.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                rename_values(attribute.g, names)
            for sub in attribute.graphs:
                rename_values(sub, names)


def dim_symbols(model, option: str = "layout") -> dict[str, str]:
    """Readable names for the graph's symbolic dims (`s53` → `past_sequence_length`), from the input they size."""
    symbols: dict[str, str] = {}
    for value in model.graph.input:
        wanted = _DIM_NAMES.get(value.name, {})
        if value.name.startswith("past_key_values."):
            wanted = {0: "batch_size", 2: "past_sequence_length"}
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and axis in wanted and _SYMBOL.fullmatch(dim.dim_param):
                symbols.setdefault(dim.dim_param, wanted[axis])
            elif dim.dim_param and value.name.startswith("past_key_values.") and axis not in wanted:
                raise TargetPlanError(
                    f"the merged decoder graph's '{value.name}' axis {axis} is symbolic ({dim.dim_param}); "
                    "transformers.js sizes the empty cache from the graph and would make it 0: only the batch and "
                    "the past sequence axes may be dynamic (drop 'auto' on the other cache axes of "
                    "`dynamic_shapes`)", option=option)
    return symbols


def substitute_dims(model, symbols: dict[str, str]) -> None:
    """Every symbolic dim of the graph's inputs, outputs and value infos with each torch symbol in it under its
    readable name (`s53 + 1` → `past_sequence_length + 1`); several symbols may take one name (equal sizes)."""

    def rename(text: str) -> str:
        return _SYMBOL.sub(lambda m: symbols.get(m[0], m[0]), text)

    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = rename(dim.dim_param)


def symbols_named(model, wanted: Callable[[str], dict[int, str]]) -> dict[str, str]:
    """torch symbol → readable name, from the graph inputs whose axes `wanted(input name)` names (the first input
    that names a symbol wins).

    Example:
        >>> import onnx
        >>> graph = onnx.helper.make_graph([], "g", [onnx.helper.make_tensor_value_info("x", 1, ["s7", "s9"])], [])
        >>> symbols_named(onnx.helper.make_model(graph), lambda name: {0: "batch_size"})
        {'s7': 'batch_size'}
    """
    symbols: dict[str, str] = {}
    for value in model.graph.input:
        names = wanted(value.name)
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and axis in names and _SYMBOL.fullmatch(dim.dim_param):
                symbols.setdefault(dim.dim_param, names[axis])
    return symbols


def rename_dims(model, symbols: dict[str, str]) -> None:
    """Every symbolic dim of the graph's inputs, outputs and value infos under its readable name; the mask's length
    and the present caches' length (past + query) are `total_sequence_length`."""
    substitute_dims(model, symbols)
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        total_axis = 1 if value.name == "attention_mask" else 2 if value.name.startswith("present.") else None
        if total_axis is not None and len(dims) > total_axis and not dims[total_axis].HasField("dim_value"):
            dims[total_axis].dim_param = TOTAL_DIM


def rename_io(proto, runtime_name: Callable[[str, bool], str]) -> dict[str, str]:
    """Rename `proto`'s inputs and outputs in place to `runtime_name(upstream name, output)`, everywhere the graph
    and its subgraphs read them; returns graph input name → upstream leaf path (the mapping `export.json` records
    for `RenamedRunner`). Shared by the decoder-only names here and the encoder-decoder ones
    (`exporters.export.seq2seq_names`)."""
    names = {v.name: runtime_name(v.name, False) for v in proto.graph.input}
    inputs = {new: old.removeprefix("input.") for old, new in names.items()}
    names.update({v.name: runtime_name(v.name, True) for v in proto.graph.output})
    rename_values(proto.graph, names)
    return inputs


def renamed_proto(proto, option: str | None = "layout") -> dict[str, str]:
    """Rename `proto`'s inputs, outputs and dims in place; returns graph input name → upstream leaf path (`option`
    None: leaves without a runtime name keep theirs, see [`unnamed_inputs`])."""
    inputs = rename_io(proto, lambda name, output: graph_name(name, output, option))
    rename_dims(proto, dim_symbols(proto, option))
    return inputs


def rename_merged_graph(directory: Path, component: str = "model") -> dict[str, str]:
    """Rename the saved merged graph of `directory` in place (the weights, embedded or in the sidecar, are
    untouched) and record the input mapping in `export.json`. Returns graph input name → upstream leaf path. A graph
    with an input the runtimes have no name for (they cannot run it) is left as upstream wrote it; the returned
    mapping then lists that input ([`unnamed_inputs`])."""
    import onnx  # heavy runtime, deferred

    manifest = read_manifest(directory)
    entry = manifest["components"][component]
    path = directory / entry["file"]
    proto = onnx.load(str(path), load_external_data=False)
    names = {v.name: graph_name(v.name, False, None) for v in proto.graph.input}
    if unnamed_inputs({new: old for old, new in names.items()}):  # a runtime name kept upstream's `input.` name
        return {new: old for old, new in names.items()}
    inputs = renamed_proto(proto, option=None)
    onnx.save_model(proto, str(path))
    entry["inputs"] = inputs
    write_manifest(directory, manifest)
    return inputs


def unnamed_inputs(inputs: dict[str, str]) -> list[str]:
    """The graph inputs that kept upstream's name because the runtimes have none for them (they do not feed them).

    Example:
        >>> unnamed_inputs({"input_ids": "input_ids", "input.cache.layers.0._sliding_window_tensor": "x"})
        ['input.cache.layers.0._sliding_window_tensor']
    """
    return [name for name in inputs if name.startswith("input.")]


def is_renamed(entry: dict) -> bool:
    """Whether a manifest component's graph inputs were renamed (it records their upstream leaves)."""
    return isinstance(entry.get("inputs"), dict)
