"""ONNX Runtime GenAI's Whisper folder: the two graphs GenAI's Whisper model runs, derived from the export's encoder
and merged decoder, and their `genai_config.json`.

GenAI 0.18's Whisper model (`src/models/whisper.cpp`, `model_type.h`: type `whisper`) runs an encoder session fed
`audio_features` (`[batch, mels, 3000]`: it refuses any other frame count) that returns the encoder's hidden states
(GenAI allocates them `[batch, 1500, hidden_size]`) and, per decoder layer, the cross-attention keys and values
(`cross_present_key_names`); then a decoder session fed `input_ids`, the self-attention past (empty on the first
step) and those cross-attention keys and values at every step, returning `logits` and the self-attention presents
(`src/models/kv_cache.cpp`: `CrossCache`). Its own builder (`models/builders/whisper.py`) writes such graphs;
ours come from what the export already wrote, sharing its weights:

```
encoder_model.onnx ─────────────────────────┐
decoder_model_merged.onnx  If(else: no past) ┴─► genai_encoder.onnx   audio_features -> last_hidden_state,
                           │  its cross-attention keys and values          present.{i}.encoder.key/value
                           ├ If(else), cross K/V fed in ─┬─► genai_decoder.onnx  If(past empty: the prompt,
                           └ If(then: with past) ─────────┘    else one token): input_ids, past_key_values.{i}.
                                                                decoder/encoder.* -> logits, present.{i}.decoder.*
preprocessor_config.json (the feature extractor's settings) ─► audio_processor_config.json (GenAI's processor)
```

The encoder graph is the exported encoder with its input renamed `audio_features` (GenAI's name, which its audio
processor also gives), plus the nodes of the merged decoder's no-past branch that compute each layer's
cross-attention keys and values from `encoder_hidden_states` (fed the encoder's `last_hidden_state` instead). The
decoder graph branches on the past's length: GenAI's first step feeds the whole decoder prompt (`<|startoftranscript|>
<|en|><|transcribe|><|notimestamps|>` for a multilingual Whisper) with an empty past, which the merged decoder's
no-past branch computes (the with-past branch was traced for one token: its reshapes hold that length), reading the
cross-attention keys and values GenAI feeds instead of projecting `encoder_hidden_states`; every later step runs the
with-past branch. Both graphs hold no weights of their own: every weight stored in an external-data file is
referenced there, at its offset, from the same file the export wrote (weights stored once); only tensors small
enough to sit in the graph itself (biases, scalars) are copied.

Example:
    >>> GENAI_ENCODER, GENAI_DECODER
    ('genai_encoder.onnx', 'genai_decoder.onnx')
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import onnx

from exporters import fsutil
from exporters.capture.token_ids import special_token_ids
from exporters.errors import TargetPlanError

GENAI_ENCODER = "genai_encoder.onnx"
GENAI_DECODER = "genai_decoder.onnx"
# what GenAI's Whisper processor reads (config.h: `Speech::config_filename`'s default)
AUDIO_PROCESSOR = "audio_processor_config.json"
AUDIO_FEATURES = "audio_features"  # GenAI's name for the encoder's input (config.h: AudioFeaturesName)
_CROSS = re.compile(r"^present\.(\d+)\.encoder\.(key|value)$")
_SELF = re.compile(r"^present\.(\d+)\.decoder\.(key|value)$")
_PREFIX = "genai.cross/"  # the names the cross-attention nodes bring into the encoder graph


def _if_node(graph: onnx.GraphProto) -> onnx.NodeProto:
    nodes = [node for node in graph.node if node.op_type == "If" and node.input[:1] == ["use_cache_branch"]]
    if len(nodes) != 1:
        raise TargetPlanError("the merged decoder has no If(use_cache_branch) node")
    return nodes[0]


def _branch(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    return next(attribute.g for attribute in node.attribute if attribute.name == name)


def _needed(nodes: list[onnx.NodeProto], outputs: set[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes (in order) that compute `outputs`, and the names they read that none of them computes."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
            needed.update(_subgraph_reads(node))
    kept.reverse()
    produced = {name for node in kept for name in node.output}
    return kept, needed - produced


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Outer-scope names a node's subgraphs read (none of the graphs here has one, but a Loop or If would)."""
    reads: set[str] = set()
    for attribute in node.attribute:
        for graph in ([attribute.g] if attribute.HasField("g") else list(attribute.graphs)):
            local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            local |= {name for inner in graph.node for name in inner.output}
            reads |= {name for inner in graph.node for name in inner.input if name and name not in local}
    return reads


def _model_like(source: onnx.ModelProto, graph: onnx.GraphProto) -> onnx.ModelProto:
    model = onnx.helper.make_model(graph, opset_imports=list(source.opset_import),
                                   producer_name="export-action (ONNX Runtime GenAI layout)")
    model.ir_version = source.ir_version
    model.functions.extend(source.functions)
    return model


def _branch_graph(branch: onnx.GraphProto, wanted: list[str], renames: dict[str, str], name: str,
                  outer_names: set[str]) -> tuple[onnx.GraphProto, set[str]]:
    """One branch of the merged decoder pruned to `wanted` (its outputs, by position), the names in `renames` read
    from the outer graph instead; returns the subgraph and the outer names it reads."""
    nodes = []
    for node in branch.node:
        node = copy.deepcopy(node)
        node.input[:] = [renames.get(value, value) for value in node.input]
        nodes.append(node)
    produced = {value.name: value for value in branch.output}
    kept, reads = _needed(nodes, set(wanted))
    if "encoder_hidden_states" in reads:
        raise TargetPlanError(f"the merged decoder's {name} reads `encoder_hidden_states` beyond its cross-attention "
                              "keys and values")
    local = [t for t in branch.initializer if t.name in reads]
    missing = reads - {t.name for t in local} - outer_names
    if missing:
        raise TargetPlanError(f"the merged decoder's {name} reads values the graph does not hold: {sorted(missing)}")
    outputs = [copy.deepcopy(produced[value]) for value in wanted]
    return onnx.helper.make_graph(kept, f"genai_{name.replace(' ', '_').replace('-', '_')}", [], outputs, local), \
        reads - {t.name for t in local}


def decoder_graph(merged: onnx.ModelProto) -> onnx.ModelProto:
    """GenAI's decoder: `input_ids` and the past in, `logits` and the self-attention presents out; an empty past
    (GenAI's first step: the whole decoder prompt) runs the merged decoder's no-past branch on the cross-attention
    keys and values fed in, any other its with-past branch (see the module)."""
    outer = merged.graph
    node = _if_node(outer)
    if list(outer.node) != [node]:
        raise TargetPlanError("the merged decoder computes values outside its If(use_cache_branch) node")
    then, otherwise = _branch(node, "then_branch"), _branch(node, "else_branch")
    outputs = [value.name for value in then.output]
    wanted = [name for name in outputs if name == "logits" or _SELF.match(name)]
    if [value.name for value in otherwise.output][:len(outputs)] != outputs or "logits" not in wanted:
        raise TargetPlanError("the merged decoder's branches do not return the same logits and presents")
    cross = {value.name: value.name.replace("present.", "past_key_values.", 1)
             for value in otherwise.output if _CROSS.match(value.name)}
    if not cross:
        raise TargetPlanError("the merged decoder's no-past branch returns no cross-attention keys and values")
    outer_names = {value.name for value in outer.input} | {t.name for t in outer.initializer}
    prefill, prefill_reads = _branch_graph(otherwise, wanted, cross, "no-past branch", outer_names)
    decode, decode_reads = _branch_graph(then, wanted, {}, "with-past branch", outer_names)
    first_past = next((value.name for value in outer.input if value.name.startswith("past_key_values.")), None)
    if first_past is None or first_past not in decode_reads:
        raise TargetPlanError("the merged decoder has no past_key_values input its with-past branch reads")
    reads = prefill_reads | decode_reads | {first_past}
    empty = [onnx.helper.make_node("Shape", [first_past], ["genai.past_length"], name="genai/past_length",
                                   start=2, end=3),
             onnx.helper.make_node("Constant", [], ["genai.zero"], name="genai/zero",
                                   value=onnx.helper.make_tensor("genai.zero", onnx.TensorProto.INT64, [1], [0])),
             onnx.helper.make_node("Equal", ["genai.past_length", "genai.zero"], ["genai.first"], name="genai/first"),
             onnx.helper.make_node("Squeeze", ["genai.first"], ["genai.first_step"], name="genai/first_step"),
             onnx.helper.make_node("If", ["genai.first_step"], wanted, name="genai/prefill_or_decode",
                                   then_branch=prefill, else_branch=decode)]
    inputs = [value for value in outer.input if value.name in reads]
    initializers = [t for t in outer.initializer if t.name in reads]
    # the merged decoder's own outputs: the merge gave an axis the branches disagree on a symbol (the prompt's tokens,
    # one token with a past), which a prompt traced at a fixed length (a static prefill) has in its branch's output
    types = {value.name: value for value in outer.output}
    graph = onnx.helper.make_graph(empty, "genai_whisper_decoder", inputs,
                                   [copy.deepcopy(types[name]) for name in wanted], initializers)
    return _model_like(merged, graph)


def encoder_graph(encoder: onnx.ModelProto, merged: onnx.ModelProto) -> onnx.ModelProto:
    """The exported encoder with its input named `audio_features` and each decoder layer's cross-attention keys and
    values as outputs, computed by the merged decoder's own no-past nodes (see the module)."""
    graph = copy.deepcopy(encoder.graph)
    if len(graph.input) != 1 or [o.name for o in graph.output] != ["last_hidden_state"]:
        raise TargetPlanError("the encoder graph is not input_features -> last_hidden_state")
    feature = graph.input[0].name
    graph.input[0].name = AUDIO_FEATURES
    for node in graph.node:
        node.input[:] = [AUDIO_FEATURES if name == feature else name for name in node.input]
    outer = merged.graph
    otherwise = _branch(_if_node(outer), "else_branch")
    cross = [value for value in otherwise.output if _CROSS.match(value.name)]
    if not cross:
        raise TargetPlanError("the merged decoder's no-past branch returns no cross-attention keys and values")
    kept, reads = _needed(list(otherwise.node), {value.name for value in cross})
    kept, reads = _batch_from_hidden_states(kept, reads)
    available = {t.name: t for t in [*outer.initializer, *otherwise.initializer]}
    if reads - set(available) - {"encoder_hidden_states"}:
        raise TargetPlanError("the cross-attention keys and values read more than `encoder_hidden_states`: "
                                 f"{sorted(reads - set(available) - {'encoder_hidden_states'})}")
    keep = {value.name for value in cross}

    def renamed(name: str) -> str:
        if not name or name in keep:
            return name
        return "last_hidden_state" if name == "encoder_hidden_states" else _PREFIX + name

    for node in kept:
        node = copy.deepcopy(node)
        node.input[:] = [renamed(name) for name in node.input]
        node.output[:] = [renamed(name) for name in node.output]
        node.name = _PREFIX + node.name
        graph.node.append(node)
    for name in sorted(reads - {"encoder_hidden_states"}):
        tensor = copy.deepcopy(available[name])
        tensor.name = renamed(name)
        graph.initializer.append(tensor)
    graph.output.extend(copy.deepcopy(value) for value in cross)
    graph.name = "genai_whisper_encoder"
    return _model_like(encoder, graph)


def _batch_from_hidden_states(nodes: list[onnx.NodeProto], reads: set[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The no-past branch reads the batch size off `input_ids` (`Shape(input_ids, end=1)`), which the encoder does
    not have: the same axis of `encoder_hidden_states` is the same batch."""
    if "input_ids" not in reads:
        return nodes, reads
    nodes = [copy.deepcopy(node) for node in nodes]
    for node in nodes:
        if "input_ids" not in node.input:
            continue
        axes = {attribute.name: attribute.i for attribute in node.attribute}
        if node.op_type != "Shape" or axes.get("start", 0) != 0 or axes.get("end") != 1:
            raise TargetPlanError(f"the cross-attention keys and values read `input_ids` in a {node.op_type} node")
        node.input[:] = ["encoder_hidden_states"]
    return nodes, (reads - {"input_ids"}) | {"encoder_hidden_states"}


def write_graphs(directory: Path, encoder_file: str, merged_file: str) -> tuple[str, str]:
    """Write GenAI's two Whisper graphs beside the exported ones (same folder: their external-data references stay
    valid); returns their paths relative to `directory`. Raises `TargetPlanError` saying what the exported graphs
    lack where they do not have the shape this derivation reads."""
    encoder_path, merged_path = directory / encoder_file, directory / merged_file
    encoder = onnx.load(str(encoder_path), load_external_data=False)
    merged = onnx.load(str(merged_path), load_external_data=False)
    written = []
    for model, name in ((encoder_graph(encoder, merged), GENAI_ENCODER), (decoder_graph(merged), GENAI_DECODER)):
        path = encoder_path.parent / name
        fsutil.write_file(path, model.SerializeToString())
        written.append(path.relative_to(directory).as_posix())
    return written[0], written[1]


def audio_processor_config(extractor: dict[str, Any], mel_bins: int) -> dict[str, Any] | str:
    """`audio_processor_config.json`, the feature extraction GenAI's processor runs for Whisper (ONNX Runtime
    Extensions' `AudioDecoder`, `STFTNorm`, `LogMelSpectrum`, as GenAI's builder writes it), with the folder's
    feature extractor's settings (`preprocessor_config.json`, read as data; Whisper's where it has none); the reason
    where Extensions cannot make them (its log-mel assumes 16 kHz audio).

    Example:
        >>> steps = audio_processor_config({"feature_size": 80}, 80)["feature_extraction"]["sequence"]
        >>> [step["operation"]["type"] for step in steps]
        ['AudioDecoder', 'STFTNorm', 'LogMelSpectrum']
        >>> steps[2]["operation"]["attrs"]
        {'chunk_size': 30, 'hop_length': 160, 'n_fft': 400, 'n_mel': 80}
        >>> audio_processor_config({"sampling_rate": 24000}, 80)[:48]
        'ONNX Runtime Extensions computes log-mel feature'
    """
    def setting(name: str, default: int) -> int:
        value = extractor.get(name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    rate = extractor.get("sampling_rate", 16000)
    if rate != 16000:
        return (f"ONNX Runtime Extensions computes log-mel features of 16 kHz audio only; this feature extractor's "
                f"sampling rate is {rate!r}")
    n_fft, hop = setting("n_fft", 400), setting("hop_length", 160)
    steps = [("audio_decoder", "AudioDecoder", None),
             ("STFT", "STFTNorm", {"n_fft": n_fft, "frame_length": n_fft, "hop_length": hop}),
             ("log_mel_spectrogram", "LogMelSpectrum", {"chunk_size": setting("chunk_length", 30), "hop_length": hop,
                                                        "n_fft": n_fft, "n_mel": setting("feature_size", mel_bins)})]
    return {"feature_extraction": {"sequence": [
        {"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}
        for name, kind, attrs in steps]}}


def whisper_genai_config(config: Any, generation_config: Any, encoder_file: str, decoder_file: str) -> dict[str, Any]:
    """`genai_config.json` for the two graphs (the fields GenAI's builder writes for Whisper, our graphs' names)."""
    special = special_token_ids(generation_config, config)
    heads, d_model = int(config.decoder_attention_heads), int(config.d_model)
    session = {"log_id": "onnxruntime-genai", "provider_options": []}
    decoder = {
        "session_options": session, "filename": decoder_file, "head_size": d_model // heads, "hidden_size": d_model,
        "inputs": {"input_ids": "input_ids",
                   "past_key_names": "past_key_values.%d.decoder.key",
                   "past_value_names": "past_key_values.%d.decoder.value",
                   "cross_past_key_names": "past_key_values.%d.encoder.key",
                   "cross_past_value_names": "past_key_values.%d.encoder.value"},
        "outputs": {"logits": "logits", "present_key_names": "present.%d.decoder.key",
                    "present_value_names": "present.%d.decoder.value"},
        "num_attention_heads": heads, "num_hidden_layers": int(config.decoder_layers), "num_key_value_heads": heads,
    }
    encoder_heads = int(config.encoder_attention_heads)
    encoder = {
        "session_options": session, "filename": encoder_file, "head_size": d_model // encoder_heads,
        "hidden_size": d_model, "inputs": {"audio_features": AUDIO_FEATURES},
        "outputs": {"encoder_hidden_states": "last_hidden_state",
                    "cross_present_key_names": "present.%d.encoder.key",
                    "cross_present_value_names": "present.%d.encoder.value"},
        "num_attention_heads": encoder_heads, "num_hidden_layers": int(config.encoder_layers),
        "num_key_value_heads": encoder_heads,
    }
    context = int(config.max_target_positions)
    model = {"bos_token_id": special.bos, "context_length": context, "decoder": decoder, "encoder": encoder,
             "eos_token_id": special.eos[0] if len(special.eos) == 1 else (special.eos or None),
             "pad_token_id": special.pad, "type": "whisper", "vocab_size": int(config.vocab_size)}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # GenAI refuses a null: left out (its default)
        if model[name] is None:
            del model[name]
    search = {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
              "max_length": context, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
              "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
              "temperature": 1.0, "top_k": 1, "top_p": 1.0}
    return {"model": model, "search": search}
