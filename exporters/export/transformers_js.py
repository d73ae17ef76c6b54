"""The transformers.js folder layout for an ONNX target (`"layout": "transformers.js"`).

transformers.js (v3/v4) loads a decoder-only model from `onnx/model{suffix}.onnx` (`suffix` is `""` for fp32,
`"_fp16"` for fp16), its weights from `onnx/model{suffix}.onnx_data` when `config.json`'s
`transformers.js_config.use_external_data_format` says so, and runs one graph whose inputs are `input_ids`,
`attention_mask` / `position_ids` (those the graph has), and `past_key_values.{i}.key` / `.value`, and whose outputs
are `logits` and `present.{i}.key` / `.value`. It builds the first (empty) cache from the graph's input dims: a
symbolic dim becomes 0, except `batch_size`. The merged graph is rewritten here to that contract: inputs and outputs
renamed, symbolic dims named (`batch_size`, `sequence_length`, `past_sequence_length`), the external data moved to
`onnx/`, `transformers.js_config` added to `config.json` (the repo's tokenizer and processor files are copied beside it, as into
every target folder, by `exporters.export.folder_files`). The graph
and its weights are not copied: the names are changed in the protobuf and the data file is moved.

Upstream's runner binds inputs by their leaf names (`cache.layers.0.keys`): `export.json` records the mapping, and
`exporters.upstream.load_exported` runs the renamed graph with upstream's ONNX runner through it (`RenamedRunner`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from exporters import fsutil
from exporters.errors import TargetPlanError
from exporters.upstream import read_manifest, write_manifest

LAYOUT = "transformers.js"
SUBFOLDER = "onnx"
_CACHE = re.compile(r"^(?:input\.|output\.)?(?:cache|past_key_values)\.layers\.(\d+)\.(keys|values)$")
_SYMBOL = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
# Input name -> {axis: dim name} for the dims transformers.js reads or users see.
_DIM_NAMES = {"input_ids": {0: "batch_size", 1: "sequence_length"},
              "position_ids": {0: "batch_size", 1: "sequence_length"},
              "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
              "token_type_ids": {0: "batch_size", 1: "sequence_length"}}


def graph_name(name: str, output: bool) -> str:
    """The transformers.js name of an upstream graph input or output: `input.cache.layers.0.keys` →
    `past_key_values.0.key`, `output.cache.layers.0.values` → `present.0.value`; other names are kept.

    Example:
        >>> graph_name("input.cache.layers.3.values", output=False)
        'past_key_values.3.value'
    """
    match = _CACHE.match(name)
    if match:
        kind = "key" if match[2] == "keys" else "value"
        return f"{'present' if output else 'past_key_values'}.{match[1]}.{kind}"
    if name.startswith(("input.", "output.")):
        raise TargetPlanError(f"`layout` 'transformers.js': the graph's {name!r} has no transformers.js name (only "
                              "key/value caches of decoder-only models are supported)", option="layout")
    return name


def _rename_values(graph, names: dict[str, str]) -> None:
    """Rename values everywhere in `graph` and its subgraphs (which can read outer values by name)."""
    # onnx loads only where an ONNX file is read
    import onnx

    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = names.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_values(attribute.g, names)
            for sub in attribute.graphs:
                _rename_values(sub, names)


def _dim_symbols(model) -> dict[str, str]:
    """Readable names for the graph's symbolic dims (`s53` → `past_sequence_length`), from the input they size."""
    symbols: dict[str, str] = {}
    for value in model.graph.input:
        wanted = _DIM_NAMES.get(value.name, {})
        if value.name.startswith("past_key_values."):
            wanted = {0: "batch_size", 2: "past_sequence_length"}
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and axis in wanted:
                symbols.setdefault(dim.dim_param, wanted[axis])
            elif dim.dim_param and value.name.startswith("past_key_values."):
                raise TargetPlanError(
                    f"`layout` 'transformers.js': '{value.name}' axis {axis} is symbolic ({dim.dim_param}); "
                    "transformers.js sizes the empty cache from the graph and would make it 0: only the batch and "
                    "the past sequence axes may be dynamic (drop 'auto' on the other cache axes of "
                    "`dynamic_shapes`)", option="dynamic_shapes")
    return symbols


def _rename_dims(model, symbols: dict[str, str]) -> None:
    def rename(text: str) -> str:
        return _SYMBOL.sub(lambda m: symbols.get(m[0], m[0]), text)

    for value in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = rename(dim.dim_param)


def write_transformers_js(directory: Path, target, model) -> None:
    """Rewrite the saved single-graph ONNX target in `directory` to the transformers.js layout (see the module)."""
    # onnx loads only where an ONNX file is read
    import onnx

    manifest = read_manifest(directory)
    if list(manifest["components"]) != ["model"]:
        raise TargetPlanError(f"`layout` 'transformers.js' takes one graph; this export has "
                              f"{list(manifest['components'])}", option="layout")
    entry = manifest["components"]["model"]
    source = directory / entry["file"]
    data = source.with_name(source.name + ".data")
    suffix = "_fp16" if target.dtype == "float16" else ""
    (directory / SUBFOLDER).mkdir(exist_ok=True)
    graph_file = f"model{suffix}.onnx"
    data_file = f"{graph_file}_data"
    proto = onnx.load(str(source), load_external_data=False)
    names = {v.name: graph_name(v.name, False) for v in proto.graph.input}
    inputs = {new: old.removeprefix("input.") for old, new in names.items()}  # graph name -> upstream leaf path
    names.update({v.name: graph_name(v.name, True) for v in proto.graph.output})
    _rename_values(proto.graph, names)
    _rename_dims(proto, _dim_symbols(proto))
    external = False
    for tensor in proto.graph.initializer:
        for item in tensor.external_data:
            if item.key == "location":
                item.value, external = data_file, True
    onnx.save_model(proto, str(directory / SUBFOLDER / graph_file))
    if external:
        os.replace(data, directory / SUBFOLDER / data_file)
    else:
        data.unlink(missing_ok=True)
    source.unlink()
    entry["file"] = f"{SUBFOLDER}/{graph_file}"
    entry["inputs"] = inputs
    manifest["layout"] = LAYOUT
    write_manifest(directory, manifest)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["transformers.js_config"] = {"dtype": "fp16" if suffix else "fp32",
                                        "use_external_data_format": {graph_file: 1} if external else False}
    fsutil.write_file(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
