"""The transformers.js folder layout for an ONNX target (`"layout": "transformers.js"`).

transformers.js (v3/v4) loads a decoder-only model from `onnx/model{suffix}.onnx` (`suffix` is `""` for fp32,
`"_fp16"` for fp16), its weights from `onnx/model{suffix}.onnx_data` when `config.json`'s
`transformers.js_config.use_external_data_format` says so, and runs one graph whose inputs are `input_ids`,
`attention_mask` / `position_ids` (those the graph has), and `past_key_values.{i}.key` / `.value`, and whose outputs
are `logits` and `present.{i}.key` / `.value`. It builds the first (empty) cache from the graph's input dims: a
symbolic dim becomes 0, except `batch_size`. The merged graph is rewritten here to that contract: inputs and outputs
renamed, symbolic dims named (`batch_size`, `sequence_length`, `past_sequence_length`), the external data moved to
`onnx/`, `transformers.js_config` added to `config.json` (the repo's tokenizer and processor files are copied beside
it, as into every target folder, by `exporters.export.folder_files`). The graph and its weights are not copied: the names are changed in the protobuf and the data file is moved.

Upstream's runner binds inputs by their leaf names (`cache.layers.0.keys`): `export.json` records the mapping, and
`exporters.upstream.load_exported` runs the renamed graph with upstream's ONNX runner through it (`RenamedRunner`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from exporters import fsutil
from exporters.errors import TargetPlanError
from exporters.export.onnx_names import is_renamed, renamed_proto, unnamed_inputs
from exporters.upstream import read_manifest, write_manifest

LAYOUT = "transformers.js"
SUBFOLDER = "onnx"




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
    # graph name -> upstream leaf path (a merged decoder graph already has the runtimes' names: exporters.export.onnx_names)
    inputs = entry["inputs"] if is_renamed(entry) else renamed_proto(proto)
    if unnamed_inputs(inputs):
        raise TargetPlanError(f"`layout` 'transformers.js': the graph's {unnamed_inputs(inputs)[0]!r} has no "
                              "transformers.js name (only key/value caches of decoder-only models are supported)",
                              option="layout")
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
