"""An encoder-decoder generation export (`encoder`, `prefill`, `decode`) in optimum's files and names.

optimum's `ORTModelForSeq2SeqLM` / `ORTModelForSpeechSeq2Seq` (optimum-onnx 0.1.0) load `encoder_model.onnx`,
`decoder_model.onnx` (the first step, no past) and `decoder_with_past_model.onnx` (every later step) from a folder
and bind their inputs and outputs by name:

| component | upstream                                           | optimum                            |
|-----------|----------------------------------------------------|------------------------------------|
| all       | `decoder_input_ids`                                | `input_ids`                        |
| decoders  | `encoder_outputs.last_hidden_state`                | `encoder_hidden_states`            |
| decoders  | `attention_mask` (the encoder's padding mask)      | `encoder_attention_mask`           |
| decode    | `input.cache.self_attention_cache.layers.{i}.keys` | `past_key_values.{i}.decoder.key`  |
| decode    | `input.cache.cross_attention_cache.layers.{i}.keys`| `past_key_values.{i}.encoder.key`  |
| decoders  | `(output.)cache.self_attention_cache.layers.{i}.keys` | `present.{i}.decoder.key`       |
| decoders  | `(output.)cache.cross_attention_cache.layers.{i}.keys` | `present.{i}.encoder.key`      |

(values likewise). optimum feeds the past by position, per layer `decoder.key, decoder.value, encoder.key,
encoder.value`, so the decode graph's cache inputs are put in that order (upstream lists every self-attention layer
before the cross-attention ones); outputs keep their order (upstream unflattens them by position, optimum splits
them by name). The encoder's inputs (`input_features`, `input_ids`, `attention_mask`) and output (`last_hidden_state`)
already have optimum's names.

The protobufs are rewritten in place (weights untouched, the external-data file renamed with its graph) and
`export.json` records, for each component, its new file and which upstream leaf each graph input is, so
`exporters.upstream.load_exported` still validates the renamed graphs (`RenamedRunner`). The component names
(`encoder`, `prefill`, `decode`) stay: they are the report's. `exporters.export.seq2seq_merged` then merges the two
decoders into `decoder_model_merged.onnx`, the one decoder file the folder keeps.

Example:
    >>> optimum_name("input.cache.cross_attention_cache.layers.1.values", output=False)
    'past_key_values.1.encoder.value'
    >>> optimum_name("cache.self_attention_cache.layers.0.keys", output=True)
    'present.0.decoder.key'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from exporters.errors import TargetPlanError
from exporters.export.onnx_files import initializers
from exporters.export.onnx_names import rename_io, substitute_dims, symbols_named
from exporters.upstream import read_manifest, write_manifest

# component -> optimum's file name
OPTIMUM_FILES = {"encoder": "encoder_model.onnx", "prefill": "decoder_model.onnx",
                 "decode": "decoder_with_past_model.onnx"}
_CACHE = re.compile(r"^(?:input\.|output\.)?cache\.(self|cross)_attention_cache\.layers\.(\d+)\.(keys|values)$")
_DECODER_INPUTS = {"decoder_input_ids": "input_ids", "encoder_outputs.last_hidden_state": "encoder_hidden_states",
                   "attention_mask": "encoder_attention_mask"}
_CACHE_ORDER = {"decoder.key": 0, "decoder.value": 1, "encoder.key": 2, "encoder.value": 3}
# optimum's dim names (its Seq2Seq OnnxConfigs), by graph input and axis: the encoder's, then the decoders'
ENCODER_DIMS = {"input_ids": {0: "batch_size", 1: "encoder_sequence_length"},
                "attention_mask": {0: "batch_size", 1: "encoder_sequence_length"},
                "input_features": {0: "batch_size", 1: "feature_size", 2: "encoder_sequence_length"}}
DECODER_DIMS = {"input_ids": {0: "batch_size", 1: "decoder_sequence_length"},
                # the hidden axis is symbolic only where the graph never reads it (a decode step's cross-attention
                # comes from the cache): named, not left as torch's symbol
                "encoder_hidden_states": {0: "batch_size", 1: "encoder_sequence_length", 2: "encoder_hidden_size"},
                "encoder_attention_mask": {0: "batch_size", 1: "encoder_sequence_length"}}
PAST_DIMS = {"decoder": "past_decoder_sequence_length", "encoder": "encoder_sequence_length_out"}
_PAST = re.compile(r"^past_key_values\.\d+\.(decoder|encoder)\.(key|value)$")
WINDOW_LEAF = "._sliding_window_tensor"
# what the runtimes feed a decoder besides its past (`use_cache_branch`: the merged decoder's)
RUNTIME_DECODER_INPUTS = ("input_ids", "encoder_hidden_states", "encoder_attention_mask", "use_cache_branch")


def is_encoder_decoder_export(components: list[str]) -> bool:
    """Whether a saved ONNX export's components are the encoder-decoder generation set optimum loads.

    Example:
        >>> is_encoder_decoder_export(["encoder", "prefill", "decode"])
        True
        >>> is_encoder_decoder_export(["prefill", "decode"])
        False
    """
    return sorted(components) == sorted(OPTIMUM_FILES)


def optimum_name(name: str, output: bool, component: str = "decode") -> str:
    """optimum's name of a decoder graph's upstream input or output (see the module); other names are kept."""
    match = _CACHE.match(name)
    if match:
        side = "decoder" if match[1] == "self" else "encoder"
        kind = "key" if match[3] == "keys" else "value"
        return f"{'present' if output else 'past_key_values'}.{match[2]}.{side}.{kind}"
    if not output and component != "encoder":
        return _DECODER_INPUTS.get(name, name)
    return name


def _cache_position(name: str) -> tuple[int, int]:
    """Where optimum expects a past input: layer, then decoder key/value, encoder key/value."""
    _, layer, side, kind = name.split(".")
    return int(layer), _CACHE_ORDER[f"{side}.{kind}"]


def fold_window_inputs(proto, window: int | None) -> list[str]:
    """Make each `..._sliding_window_tensor` graph input of `proto` (a sliding-window cache layer's window, a 0-d
    int64 upstream flattens out of the cache: T5Gemma's decoder) the constant `window` it always is, in place: no
    runtime feeds it. Returns the inputs folded (none when `window` is None: such an input then stays, and
    [`foreign_inputs`] names it).

    Example:
        >>> import onnx
        >>> graph = onnx.helper.make_graph([], "g", [onnx.helper.make_tensor_value_info(
        ...     "input.cache.self_attention_cache.layers.0._sliding_window_tensor", onnx.TensorProto.INT64, [])], [])
        >>> proto = onnx.helper.make_model(graph)
        >>> fold_window_inputs(proto, 12), [t.int64_data for t in proto.graph.initializer], len(proto.graph.input)
        (['input.cache.self_attention_cache.layers.0._sliding_window_tensor'], [[12]], 0)
    """
    import onnx  # heavy runtime, deferred

    if window is None:
        return []
    folded = [value for value in proto.graph.input if value.name.endswith(WINDOW_LEAF)]
    for value in folded:
        proto.graph.input.remove(value)
        proto.graph.initializer.append(onnx.helper.make_tensor(value.name, onnx.TensorProto.INT64, [], [window]))
    return [value.name for value in folded]


def foreign_inputs(proto) -> list[str]:
    """The inputs of a decoder graph (optimum's names already) that optimum, ONNX Runtime and transformers.js do not
    feed: anything but `input_ids`, `encoder_hidden_states`, `encoder_attention_mask`, `use_cache_branch` (a merged
    decoder) and `past_key_values.{i}.{decoder,encoder}.{key,value}`.

    Example:
        >>> import onnx
        >>> graph = onnx.helper.make_graph([], "g", [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT64, [])
        ...     for n in ("input_ids", "past_key_values.0.decoder.key", "input.cache.layers.0.cumulative_length")], [])
        >>> foreign_inputs(onnx.helper.make_model(graph))
        ['input.cache.layers.0.cumulative_length']
    """
    return [value.name for value in proto.graph.input
            if value.name not in RUNTIME_DECODER_INPUTS and not _PAST.match(value.name)]


def _renamed_graph(proto, component: str, window: int | None = None) -> dict[str, str]:
    """Rename `proto`'s inputs and outputs in place, the past inputs in optimum's order, a sliding-window layer's
    window folded into a constant ([`fold_window_inputs`]); returns graph input name → upstream leaf path."""
    folded = set(fold_window_inputs(proto, window)) if component != "encoder" else set()
    inputs = {name: leaf for name, leaf in rename_io(proto, lambda name, output: optimum_name(name, output, component)
                                                     ).items() if name not in folded}
    past = sorted((v for v in proto.graph.input if v.name.startswith("past_key_values.")),
                  key=lambda v: _cache_position(v.name))
    if past:
        others = [v for v in proto.graph.input if not v.name.startswith("past_key_values.")]
        ordered = [type(v)() for v in (*others, *past)]
        for copy, value in zip(ordered, (*others, *past)):
            copy.CopyFrom(value)
        del proto.graph.input[:]
        proto.graph.input.extend(ordered)
    return inputs


def dim_names(name: str, component: str) -> dict[int, str]:
    """optimum's names for the axes of graph input `name` of `component` (after renaming): batch and sequence axes.

    Example:
        >>> dim_names("attention_mask", "encoder"), dim_names("past_key_values.0.encoder.key", "decode")
        ({0: 'batch_size', 1: 'encoder_sequence_length'}, {0: 'batch_size', 2: 'encoder_sequence_length_out'})
    """
    if component == "encoder":
        return ENCODER_DIMS.get(name, {})
    past = _PAST.match(name)
    return {0: "batch_size", 2: PAST_DIMS[past[1]]} if past else DECODER_DIMS.get(name, {})


def fixed_past(directory: Path) -> str | None:
    """Why optimum cannot run the saved decode graph (its self-attention cache has a fixed length, where optimum feeds
    a past that grows by one token a step), or None. Such an export keeps upstream's files and names."""
    # onnx loads only where an ONNX file is read
    import onnx

    entry = read_manifest(directory)["components"]["decode"]
    proto = onnx.load(str(directory / entry["file"]), load_external_data=False)
    for value in proto.graph.input:
        match = _CACHE.match(value.name)
        dims = value.type.tensor_type.shape.dim
        if match and match[1] == "self" and len(dims) > 2 and not dims[2].dim_param:
            return (f"the decode graph's {value.name!r} has a fixed length ({dims[2].dim_value}): optimum's "
                    "ORTModelForSeq2SeqLM / ORTModelForSpeechSeq2Seq feed a past that grows each step, so the "
                    "encoder-decoder graphs keep upstream's files and names (`dynamic: true` and a dynamic cache give "
                    "optimum's layout)")
    return None


def rename_encoder_decoder(directory: Path, window: int | None = None) -> dict[str, str]:
    """Rewrite the saved encoder-decoder ONNX export in `directory` to optimum's files and names (see the module),
    a sliding-window decoder's window (`window`) a constant, and record the mapping in `export.json`. Returns
    component → its new file. Raises `TargetPlanError` when a decoder keeps an input the runtimes do not feed."""
    # onnx loads only where an ONNX file is read
    import onnx

    manifest = read_manifest(directory)
    entries = manifest["components"]
    sidecars = {f"{entries[name]['file']}.data": f"{OPTIMUM_FILES[name]}.data" for name in OPTIMUM_FILES}
    for name, new_file in OPTIMUM_FILES.items():
        proto = onnx.load(str(directory / entries[name]["file"]), load_external_data=False)
        before = sorted(v.name for v in proto.graph.input)
        inputs = _renamed_graph(proto, name, window)
        foreign = foreign_inputs(proto) if name != "encoder" else []
        if foreign:
            raise TargetPlanError(f"the {name} graph takes {foreign}, which optimum, ONNX Runtime and "
                                  "transformers.js do not feed: no runtime could run this encoder-decoder export",
                                  option="merged")
        # torch's symbols (`s97`; T5's ids and mask each get one) under optimum's names, one per axis it names
        substitute_dims(proto, symbols_named(proto, lambda value, component=name: dim_names(value, component)))
        for tensor in initializers(proto):
            for item in tensor.external_data:
                if item.key == "location":
                    item.value = sidecars.get(item.value, item.value)
        onnx.save_model(proto, str(directory / new_file))
        if sorted(inputs) != before:  # renamed: our loader binds the graph names to upstream's leaves
            entries[name]["inputs"] = inputs
    for name, new_file in OPTIMUM_FILES.items():
        old_file = entries[name]["file"]
        old_data = directory / f"{old_file}.data"
        if old_data.exists():
            os.replace(old_data, directory / f"{new_file}.data")
        if old_file != new_file:
            (directory / old_file).unlink()
        entries[name]["file"] = new_file
    write_manifest(directory, manifest)
    return {name: entries[name]["file"] for name in OPTIMUM_FILES}

