"""One decoder graph for an encoder-decoder export: `decoder_model_merged.onnx`, optimum's and transformers.js's file.

```
decoder_model.onnx ─────────┐  (no past: the first step)
                            ├─► If(use_cache_branch) ─► decoder_model_merged.onnx   weights once, by content
decoder_with_past_model.onnx┘  (then: every later step)
```

The two decoders of an encoder-decoder generation export (`prefill`, `decode`, already under optimum's names:
`exporters.export.seq2seq_names`) are traced separately, so they hold the same weights under their own names. The
merged graph takes the with-past decoder's inputs plus a `use_cache_branch` bool of shape `[1]`, and one `If` node
runs the with-past decoder when it is true, the no-past one when it is false, as `optimum.onnx.merge_decoders`
builds it: each large initializer is stored once in the outer graph (deduplicated by dtype, dims and the sha256 of its
bytes, embedded or external), scalars and 1-D integer tensors stay in their branch, the outputs are the no-past
decoder's names and order (both decoders give the same outputs: the with-past one passes the cross-attention cache
through).

The runtimes feed it this way: optimum's `ORTModelForSeq2SeqLM` / `ORTModelForSpeechSeq2Seq` (optimum-onnx 0.1.0)
and transformers.js (`decoder_forward`) set `use_cache_branch` to whether a real past exists, and on the first step
feed empty past tensors (`[batch, heads, 0, head_dim]`; transformers.js sizes them from the graph's input dims: a
symbolic dim becomes 0 except `batch_size`), then on later steps the self-attention presents and the cross-attention
presents of the first step. So the past inputs' batch dim is named `batch_size` and their sequence dims are symbolic
(`past_decoder_sequence_length`, `encoder_sequence_length_out`); a dim the exporter wrote as a numeric string
(`'16'`) becomes the number it is.

Our own validation runs the merged file, both branches: `export.json` points `prefill` and `decode` at it, with
`branch` (the `use_cache_branch` each feeds); `exporters.upstream.RenamedRunner` feeds the branch and the empty past
the prefill does not have.

Example:
    >>> merged_dims(["1", "s53"], [1, "s53 + 1"], "present_sequence_length")
    [1, 'present_sequence_length']
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from exporters.export.onnx_files import _read_range, external_data_of, gather_external_data, initializers
from exporters.export.onnx_names import rename_values
from exporters.export.seq2seq_names import dim_names
from exporters.upstream import read_manifest, write_manifest

MERGED_FILE = "decoder_model_merged.onnx"
BRANCH_INPUT = "use_cache_branch"
# The two decoders' files, replaced by MERGED_FILE (exporters.export.seq2seq_names.OPTIMUM_FILES)
DECODER_FILES = {"prefill": "decoder_model.onnx", "decode": "decoder_with_past_model.onnx"}


def _dims(value) -> list[int | str]:
    """A value's dims: numbers for fixed ones (a numeric dim_param too), names for symbolic ones."""
    dims: list[int | str] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.dim_param:
            dims.append(int(dim.dim_param) if dim.dim_param.isdigit() else dim.dim_param)
        else:
            dims.append(dim.dim_value)
    return dims


def merged_dims(first: list, second: list, fresh: str) -> list[int | str]:
    """Dims that hold both graphs' values: a dim both give alike stays, one they give differently is `fresh` (a
    numeric string is the number it is)."""
    first = [int(d) if isinstance(d, str) and d.isdigit() else d for d in first]
    second = [int(d) if isinstance(d, str) and d.isdigit() else d for d in second]
    return [a if a == b else fresh for a, b in zip(first, second)]


def _value_info(name: str, elem_type: int, dims: list[int | str]):
    # onnx loads only where an ONNX file is read
    import onnx

    return onnx.helper.make_tensor_value_info(name, elem_type, dims)


def _input_dims(name: str, dims: list[int | str]) -> list[int | str]:
    """The merged graph's dims for input `name`: runtimes' names for batch and sequence axes (see the module)."""
    past = name.startswith("past_key_values.")
    wanted = dim_names(name, "decode")
    named = list(dims)
    for axis, dim in enumerate(dims):
        if axis in wanted and (isinstance(dim, str) or past and axis == 2):
            named[axis] = wanted[axis]
    return named


def _content_key(tensor, directory: Path) -> tuple:
    """What makes two initializers the same weight: dtype, dims and the sha256 of their bytes."""
    info = external_data_of(tensor)
    if info is not None:
        data = _read_range(directory / info["location"], int(info.get("offset", 0)), int(info["length"]))
    else:
        data = tensor.SerializeToString(deterministic=True) if not tensor.raw_data else tensor.raw_data
    return tensor.data_type, tuple(tensor.dims), hashlib.sha256(data).hexdigest()


def _stays_in_branch(tensor) -> bool:
    """optimum keeps scalars and 1-D integer tensors in their branch (ONNX Runtime's optimizer needs them there)."""
    return len(tensor.dims) == 0 or (len(tensor.dims) == 1 and tensor.data_type in (6, 7))


def _defined(graph) -> set[str]:
    """The names `graph` defines itself, subgraphs included: node outputs and the initializers that stay in it."""
    # onnx loads only where an ONNX file is read
    import onnx

    names = {t.name for t in graph.initializer if _stays_in_branch(t)}
    for node in graph.node:
        names.update(node.output)
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for sub in subgraphs:
                names |= _defined(sub) | {t.name for t in sub.initializer}
    return names


def merge_decoders(no_past, with_past, directory: Path):
    """The merged ModelProto of the two decoder protos (see the module); `directory` holds their external data.
    Their graphs are taken over (rewritten in place)."""
    # onnx loads only where an ONNX file is read
    import onnx

    outer: list = []
    names_by_key: dict[tuple, str] = {}
    # an outer name must be none a branch defines: a branch's own value would shadow it
    used = {name for graph in (no_past.graph, with_past.graph) for name in _defined(graph)}
    for graph in (no_past.graph, with_past.graph):
        renames: dict[str, str] = {}
        kept = []
        for tensor in graph.initializer:
            if _stays_in_branch(tensor):
                kept.append(tensor)
                continue
            key = _content_key(tensor, directory)
            if key not in names_by_key:
                name, suffix = tensor.name, 0
                while name in used:
                    suffix += 1
                    name = f"{tensor.name}_merged_{suffix}"
                names_by_key[key], copy = name, type(tensor)()
                copy.CopyFrom(tensor)
                copy.name = name
                used.add(name)
                outer.append(copy)
            if names_by_key[key] != tensor.name:
                renames[tensor.name] = names_by_key[key]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        rename_values(graph, renames)
    inputs = {v.name: v for v in no_past.graph.input}
    merged_inputs = []
    for value in with_past.graph.input:
        dims = _dims(value)
        if value.name in inputs:
            dims = merged_dims(_dims(inputs.pop(value.name)), dims, f"{value.name}_dim")
        merged_inputs.append(_value_info(value.name, value.type.tensor_type.elem_type, _input_dims(value.name, dims)))
    merged_inputs.extend(_value_info(v.name, v.type.tensor_type.elem_type, _input_dims(v.name, _dims(v)))
                         for v in inputs.values())
    merged_inputs.append(_value_info(BRANCH_INPUT, onnx.TensorProto.BOOL, [1]))
    outputs = [_value_info(a.name, a.type.tensor_type.elem_type,
                           merged_dims(_dims(a), _dims(b), f"{a.name}_dim"))
               for a, b in zip(no_past.graph.output, with_past.graph.output)]
    branches = {}
    for name, graph in (("no_past", no_past.graph), ("with_past", with_past.graph)):
        branches[name] = onnx.helper.make_graph(nodes=list(graph.node), name=name, inputs=[], outputs=list(graph.output),
                                                initializer=list(graph.initializer), value_info=list(graph.value_info))
    node = onnx.helper.make_node("If", inputs=[BRANCH_INPUT], outputs=[o.name for o in outputs], name="merged::if",
                                 then_branch=branches["with_past"], else_branch=branches["no_past"])
    graph = onnx.helper.make_graph([node], "merged", merged_inputs, outputs, initializer=outer)
    opsets = {}
    for opset in (*no_past.opset_import, *with_past.opset_import):
        opsets.setdefault(opset.domain, opset)
    model = onnx.helper.make_model(graph, opset_imports=list(opsets.values()), ir_version=no_past.ir_version,
                                   producer_name="export-action")
    for entry in no_past.metadata_props:
        model.metadata_props.add().CopyFrom(entry)
    return model


def merge_encoder_decoder(directory: Path) -> str | None:
    """Replace the two decoders of the saved encoder-decoder export in `directory` (optimum's names already) by
    `decoder_model_merged.onnx`, its weights where theirs were (the sidecar they share, or embedded), and point the
    manifest's `prefill` and `decode` at it with their `branch`. Returns None, or why the decoders stay two files
    (their outputs differ: an `If` node's branches must give the same outputs)."""
    # onnx loads only where an ONNX file is read
    import onnx

    manifest = read_manifest(directory)
    entries = manifest["components"]
    protos = {name: onnx.load(str(directory / entries[name]["file"]), load_external_data=False)
              for name in DECODER_FILES}
    outputs = {name: [o.name for o in proto.graph.output] for name, proto in protos.items()}
    if outputs["prefill"] != outputs["decode"]:
        return (f"the decoders give different outputs ({outputs['prefill']} vs {outputs['decode']}): they stay "
                f"{' + '.join(DECODER_FILES.values())}, not one {MERGED_FILE}")
    merged = merge_decoders(protos["prefill"], protos["decode"], directory)
    sidecar = f"{MERGED_FILE}.data"
    own = {f"{entries[name]['file']}.data" for name in DECODER_FILES}
    locations = {info.get("location") for tensor in initializers(merged) if (info := external_data_of(tensor))}
    if locations & own:  # weights in the decoders' own sidecars (not shared with the encoder's): gathered
        gather_external_data(merged, directory, directory / sidecar)
    onnx.save_model(merged, str(directory / MERGED_FILE))
    if not (directory / sidecar).exists():
        (directory / sidecar).write_bytes(b"")  # upstream's loader lists every component's sidecar
    for name in DECODER_FILES:
        old = directory / entries[name]["file"]
        old.unlink()
        old.with_name(old.name + ".data").unlink(missing_ok=True)
        entries[name]["file"] = MERGED_FILE
        entries[name]["branch"] = name == "decode"
    write_manifest(directory, manifest)
    return None
