"""The transformers.js folder layout for an ONNX target (`"layout": "transformers.js"`).

transformers.js (v3/v4) loads a decoder-only model from `onnx/model{suffix}.onnx` (`suffix` is `""` for fp32,
`"_fp16"` for fp16, `"_q4"` / `"_q4f16"` for an `onnxruntime-int4` target, `"_quantized"` for `onnxruntime-dynamic`:
`SUFFIXES`; a target with `variants` gets every dtype file in this one folder, `dtypes.py`), its weights from `onnx/model{suffix}.onnx_data` when `config.json`'s
`transformers.js_config.use_external_data_format` says so, and runs one graph whose inputs are `input_ids`,
`attention_mask` / `position_ids` (those the graph has), and `past_key_values.{i}.key` / `.value`, and whose outputs
are `logits` and `present.{i}.key` / `.value`. It builds the first (empty) cache from the graph's input dims: a
symbolic dim becomes 0, except `batch_size`. The merged graph is rewritten here to that contract: inputs and outputs
renamed, symbolic dims named (`batch_size`, `sequence_length`, `past_sequence_length`), the external data moved to
`onnx/`, `transformers.js_config` added to `config.json` (the repo's tokenizer and processor files are copied beside
it, as into every target folder, by `exporters.export.folder_files`). The graph and its weights are not copied: the names are changed in the protobuf and the data file is moved.

An encoder-decoder generation export (Whisper, T5, BART, Marian) is written as transformers.js's `Seq2Seq` models
load it: `onnx/encoder_model{suffix}.onnx` and `onnx/decoder_model_merged{suffix}.onnx` (optimum's names and merged
decoder, `exporters.export.seq2seq_names` / `exporters.export.seq2seq_merged`), each with its own `{file}_data`.

Upstream's runner binds inputs by their leaf names (`cache.layers.0.keys`): `export.json` records the mapping, and
`exporters.upstream.load_exported` runs the renamed graph with upstream's ONNX runner through it (`RenamedRunner`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from exporters import fsutil
from exporters.errors import TargetPlanError
from exporters.export.onnx_files import gather_external_data
from exporters.capture.image_text import AUDIO_COMPONENTS, AUDIO_ENCODER, COMPONENTS as IMAGE_TEXT, DECODER, EMBED_TOKENS
from exporters.capture.image_text_models import PIXTRAL_TYPES
from exporters.capture.qwen_vl import GRID_INPUT, MROPE_TYPES, PROCESSOR_CLASS
from exporters.export.onnx_names import is_renamed, rename_io, rename_values, renamed_proto, unnamed_inputs
from exporters.export.seq2seq_merged import MERGED_FILE
from exporters.export.seq2seq_names import is_encoder_decoder_export
from exporters.layouts.base import read_json
from exporters.layouts.transformers_js import LAYOUT, SUFFIXES, layout_dtype
from exporters.layouts.transformers_js.image_text import chat_template, processor_fix
from exporters.upstream import read_manifest, write_manifest


SUBFOLDER = "onnx"


def write_transformers_js(directory: Path, target, model) -> None:
    """Rewrite the saved single-graph ONNX target in `directory` to the transformers.js layout (see the module)."""
    # onnx loads only where an ONNX file is read
    import onnx

    manifest = read_manifest(directory)
    if is_encoder_decoder_export(list(manifest["components"])):
        _write_encoder_decoder(directory, target, manifest)
        return
    if set(manifest["components"]) in (set(IMAGE_TEXT), set(AUDIO_COMPONENTS)):
        _write_image_text(directory, target, manifest)
        return
    if list(manifest["components"]) != ["model"]:
        raise TargetPlanError(f"`layout` 'transformers.js' takes one graph, or an encoder-decoder's encoder and "
                              f"decoders; this export has {list(manifest['components'])}", option="layout")
    _refuse_multi_query(directory)
    entry = manifest["components"]["model"]
    source = directory / entry["file"]
    data = source.with_name(source.name + ".data")
    dtype = layout_dtype(target.dtype, getattr(target.quantize, "method", None))  # its file's name says what it holds
    suffix = SUFFIXES[dtype]
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
    _add_config(directory, dtype, {graph_file: 1} if external else False)


def _refuse_multi_query(directory: Path) -> None:
    """`TargetPlanError` for a model whose config sets `multi_query` (Falcon's default): transformers.js 4.3.2 reads
    that key, for any model type, as GPT-BigCode's one fused `past_key_values.{i}.key_value` tensor a layer
    (`getKeyValueNames`), so it feeds none of the graph's `past_key_values.{i}.key` / `.value` and generation stops at
    its first step ("Missing the following inputs"; docs/upstream-gaps.md #63). Said before the folder is written."""
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    if config.get("multi_query"):
        raise TargetPlanError(f"`layout` 'transformers.js' cannot load this {config.get('model_type')!r} model: its "
                              "config sets `multi_query`, which transformers.js 4.3.2 reads as GPT-BigCode's fused "
                              "`past_key_values.{i}.key_value` cache, so it never feeds the graph's separate "
                              "`past_key_values.{i}.key` / `.value` inputs (an upstream gap: docs/upstream-gaps.md "
                              "#63); the default ONNX layout (ONNX Runtime GenAI, optimum) takes it", option="layout")


def _write_encoder_decoder(directory: Path, target, manifest: dict) -> None:
    """The encoder-decoder layout transformers.js's `Seq2Seq` models (Whisper, T5, BART, Marian) load:
    `onnx/encoder_model{suffix}.onnx` and `onnx/decoder_model_merged{suffix}.onnx` (optimum's names, already given by
    `exporters.export.seq2seq_names` and `exporters.export.seq2seq_merged`), each with its own `{file}_data`: the
    browser build mounts each session's external data under that name, so a graph cannot read another's file."""
    # onnx loads only where an ONNX file is read
    import onnx

    entries = manifest["components"]
    files = sorted({entry["file"] for entry in entries.values()})
    if MERGED_FILE not in files:
        raise TargetPlanError("`layout` 'transformers.js' loads an encoder-decoder's decoder from one "
                              f"{MERGED_FILE}; this export's decoders stay {files}", option="layout")
    dtype = "fp16" if target.dtype == "float16" else "fp32"
    suffix = SUFFIXES[dtype]
    (directory / SUBFOLDER).mkdir(exist_ok=True)
    external: dict[str, int] = {}
    moved: dict[str, str] = {}
    for old in files:
        graph_file = old.removesuffix(".onnx") + f"{suffix}.onnx"
        proto = onnx.load(str(directory / old), load_external_data=False)
        if old != MERGED_FILE and float_inputs(proto):  # a float16 Whisper encoder takes the extractor's float32
            # spectrogram: its entry binds its inputs by name, so the runner feeds each in the graph's declared type
            for entry in entries.values():
                if entry["file"] == old and not is_renamed(entry):
                    entry["inputs"] = {value.name: value.name for value in proto.graph.input}
        if gather_external_data(proto, directory, directory / SUBFOLDER / f"{graph_file}_data"):
            external[graph_file] = 1
        onnx.save_model(proto, str(directory / SUBFOLDER / graph_file))
        moved[old] = f"{SUBFOLDER}/{graph_file}"
    for old in files:
        (directory / old).unlink()
        (directory / f"{old}.data").unlink(missing_ok=True)
    for entry in entries.values():
        entry["file"] = moved[entry["file"]]
    manifest["layout"] = LAYOUT
    write_manifest(directory, manifest)
    _add_config(directory, dtype, external or False)


PREPROCESSOR = "preprocessor_config.json"
# what transformers.js reads and feeds: each encoder's output, and the audio's input where its processor names it
OUTPUTS = {"vision_encoder": "image_features", AUDIO_ENCODER: "audio_features", EMBED_TOKENS: "inputs_embeds"}
AUDIO_INPUT = {"voxtral": "audio_values"}  # VoxtralProcessor's output (the graph's `input_features`)
# the transformers.js processor of each audio-language model type, where the folder's preprocessor config names none
AUDIO_PROCESSOR = {"voxtral": "VoxtralProcessor", "granite_speech": "GraniteSpeechProcessor"}


def _write_image_text(directory: Path, target, manifest: dict) -> None:
    """transformers.js's vision-language layout (`exporters.capture.image_text`): each graph under `onnx/{name}.onnx`
    with its own `{file}_data`, the decoder's inputs and outputs under the runtimes' names (as a text decoder's),
    the encoders' one output under the name transformers.js reads ([`OUTPUTS`]), and the processor's image-token
    count made one both libraries read alike (`image_text.processor_fix`). An audio-language model's `audio_encoder`
    takes its features under the name its transformers.js processor gives them ([`AUDIO_INPUT`]), and the
    processor's files are written as transformers.js reads them ([`_audio_processor`])."""
    # onnx loads only where an ONNX file is read
    import onnx

    dtype = "fp16" if target.dtype == "float16" else "fp32"
    (directory / SUBFOLDER).mkdir(exist_ok=True)
    external: dict[str, int] = {}
    old = sorted({entry["file"] for entry in manifest["components"].values()})
    model_type = read_json(directory / "config.json").get("model_type")
    inputs = {"input_features": AUDIO_INPUT.get(model_type, "input_features"),
              "image_grid_thw": GRID_INPUT.get(model_type, "image_grid_thw")}
    pixels: list[int] = []  # the vision encoder's fixed `pixel_values` shape (a Qwen-VL's patches first)
    for name, entry in manifest["components"].items():
        graph_file = f"{name}{SUFFIXES[dtype]}.onnx"
        proto = onnx.load(str(directory / entry["file"]), load_external_data=False)
        if name == DECODER:
            entry["inputs"] = renamed_proto(proto)
        else:
            entry["inputs"] = rename_io(proto, lambda leaf, output, name=name: OUTPUTS[name] if output else
                                        inputs.get(leaf, leaf))
        if name not in (DECODER, EMBED_TOKENS):  # the encoder: a float16 graph takes float32 pixels or features
            float_inputs(proto)
            pixels = [dim.dim_value for dim in proto.graph.input[0].type.tensor_type.shape.dim]
        if gather_external_data(proto, directory, directory / SUBFOLDER / f"{graph_file}_data"):
            external[graph_file] = 1
        onnx.save_model(proto, str(directory / SUBFOLDER / graph_file))
        entry["file"] = f"{SUBFOLDER}/{graph_file}"
    for file in old:
        (directory / file).unlink()
        (directory / f"{file}.data").unlink(missing_ok=True)
    manifest["layout"] = LAYOUT
    write_manifest(directory, manifest)
    _add_config(directory, dtype, external or False)
    if AUDIO_ENCODER in manifest["components"]:
        if model_type == "granite_speech":
            granite_speech_processor(directory)
        _audio_processor(directory, model_type)
        return
    if model_type in MROPE_TYPES:
        qwen_vl_files(directory, model_type, pixels[0])
        return
    if model_type in PIXTRAL_TYPES:
        pixtral_files(directory, pixels[-1])
    processor = read_json(directory / "processor_config.json")
    fixed = processor_fix(processor, read_json(directory / "config.json"))
    if fixed is not None:
        fsutil.write_file(directory / "processor_config.json", json.dumps(fixed, indent=2, sort_keys=True) + "\n")
    template = chat_template(read_json(directory / "tokenizer_config.json"), read_json(directory / "chat_template.json"))
    if template is not None and not (directory / "chat_template.jinja").exists():  # Gemma3Processor loads the file
        fsutil.write_file(directory / "chat_template.jinja", template)
    image_processor = processor.get("image_processor")
    if isinstance(image_processor, dict) and not (directory / PREPROCESSOR).exists():
        # transformers 5 keeps the image processor inside processor_config.json; transformers.js reads it from here,
        # and its AutoProcessor picks the processor by the `processor_class` it finds there
        image_processor = {**image_processor, "processor_class": processor.get("processor_class")}
        fsutil.write_file(directory / PREPROCESSOR, json.dumps(image_processor, indent=2, sort_keys=True) + "\n")


# the text model's fields transformers.js 4.3.2 reads from a `qwen2_vl` config's top level (transformers 4's layout;
# transformers 5 keeps them in `text_config`, where it reads a `qwen2_5_vl`'s): configs.js's getNormalizedConfig
# Qwen2-VL's and Qwen2.5-VL's image processor's default mean and std (CLIP's), and Qwen3-VL's
CLIP = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
HALF = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
TOP_LEVEL_TEXT = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")


def qwen_vl_files(directory: Path, model_type: str, patches: int) -> None:
    """A Qwen2-VL's, Qwen2.5-VL's or Qwen3-VL's files as transformers.js reads them: `preprocessor_config.json` (the
    folder's image processor, or one from the model's config with its defaults) naming transformers.js's processor
    ([`PROCESSOR_CLASS`]) and its image processor, its pixel bounds both the traced image's (`patches` patches: the
    vision encoder is traced at that grid, `exporters.capture.qwen_vl`; a square image of any size is resized to it);
    and, for a Qwen2-VL, the text model's fields also at `config.json`'s top level ([`TOP_LEVEL_TEXT`])."""
    config = read_json(directory / "config.json")
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    if model_type == "qwen2_vl" and any(key not in config and key in text for key in TOP_LEVEL_TEXT):
        config.update({key: text[key] for key in TOP_LEVEL_TEXT if key not in config and key in text})
        fsutil.write_file(directory / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    image = read_json(directory / PREPROCESSOR) or dict(read_json(directory / "processor_config.json").get(
        "image_processor") or {})
    patch = int(image.get("patch_size") or vision.get("patch_size") or 14)
    pixels = int(patches) * patch * patch
    image.update({"image_processor_type": "Qwen2VLImageProcessor", "processor_class": PROCESSOR_CLASS[model_type],
                  "patch_size": patch, "merge_size": int(image.get("merge_size") or vision.get("spatial_merge_size", 2)),
                  "temporal_patch_size": int(image.get("temporal_patch_size") or vision.get("temporal_patch_size", 2)),
                  "min_pixels": pixels, "max_pixels": pixels, "size": {"shortest_edge": pixels, "longest_edge": pixels}})
    mean, std = HALF if model_type == "qwen3_vl" else CLIP
    for key, value in (("do_resize", True), ("do_rescale", True), ("rescale_factor", 1 / 255), ("do_normalize", True),
                       ("image_mean", mean), ("do_convert_rgb", True), ("image_std", std), ("resample", 3)):
        image.setdefault(key, value)  # the model's image processor's defaults, where the folder had none
    fsutil.write_file(directory / PREPROCESSOR, json.dumps(image, indent=2, sort_keys=True) + "\n")


PIXTRAL_TOKENS = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}


def pixtral_files(directory: Path, side: int) -> None:
    """A Mistral 3's processor files as transformers.js's `PixtralProcessor` reads them: `preprocessor_config.json`
    (the folder's image processor, or one from the model's config with Pixtral's defaults) naming that processor and
    `PixtralImageProcessor`, with the patch size a number and the spatial merge size beside it (its resize reads both
    there), and its longest edge the traced image's `side` (the vision encoder is traced at one square image,
    `exporters.capture.image_text_models`: any square image is resized to it); `processor_config.json` with the
    image, break and end tokens (the folder's, else the tokenizer's text of the model's image token and Pixtral's
    names), the patch and merge sizes, which the processor lays the prompt's rows out by."""
    config = read_json(directory / "config.json")
    processor = read_json(directory / "processor_config.json")
    patch = int((config.get("vision_config") or {}).get("patch_size") or 14)
    merge = int(config.get("spatial_merge_size") or 2)
    image = read_json(directory / PREPROCESSOR) or dict(processor.get("image_processor") or {})
    image.update({"image_processor_type": "PixtralImageProcessor", "processor_class": "PixtralProcessor",
                  "patch_size": patch, "spatial_merge_size": merge, "size": {"longest_edge": int(side)}})
    for key, value in (("do_resize", True), ("do_rescale", True), ("rescale_factor", 1 / 255), ("do_normalize", True),
                       ("image_mean", CLIP[0]), ("do_convert_rgb", True), ("image_std", CLIP[1]), ("resample", 3)):
        image.setdefault(key, value)  # Pixtral's image processor's defaults, where the folder had none
    fsutil.write_file(directory / PREPROCESSOR, json.dumps(image, indent=2, sort_keys=True) + "\n")
    tokens = {**PIXTRAL_TOKENS, "image_token": _token_text(directory, config.get("image_token_index")) or "[IMG]"}
    processor = {**tokens, **{key: value for key, value in processor.items() if key != "image_processor"},
                 "processor_class": "PixtralProcessor", "patch_size": patch, "spatial_merge_size": merge}
    fsutil.write_file(directory / "processor_config.json", json.dumps(processor, indent=2, sort_keys=True) + "\n")


def float_inputs(proto) -> list[str]:
    """A float16 encoder graph's float16 inputs taken as float32 and cast inside (transformers.js's processors make
    float32 pixels and features, and feed them as they are: its own fp16 files keep float32 inputs, `keep_io_types`);
    its output stays float16, as the embeddings it is merged into. Returns the inputs it cast."""
    # onnx loads only where an ONNX file is read
    from onnx import TensorProto, helper

    cast_inputs = []
    for value in list(proto.graph.input):
        if value.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        cast_inputs.append(value.name)
        name, cast = value.name, f"{value.name}_float16"
        rename_values(proto.graph, {name: cast})
        value.name = name
        value.type.tensor_type.elem_type = TensorProto.FLOAT
        proto.graph.node.insert(0, helper.make_node("Cast", [name], [cast], to=TensorProto.FLOAT16,
                                                    name=f"{name}_to_float16"))
    return cast_inputs


def _audio_processor(directory: Path, model_type: str | None) -> None:
    """`preprocessor_config.json` as transformers.js's `AutoProcessor` reads it for an audio-language model: the
    feature extractor (transformers 5 may keep it inside `processor_config.json`) with the `processor_class` it picks
    the processor by (the model type's transformers.js processor where the folder names none, [`AUDIO_PROCESSOR`])."""
    extractor = read_json(directory / PREPROCESSOR)
    processor = read_json(directory / "processor_config.json")
    if not extractor and isinstance(processor.get("feature_extractor"), dict):
        extractor = dict(processor["feature_extractor"])
    name = extractor.get("processor_class") or processor.get("processor_class") or AUDIO_PROCESSOR.get(model_type)
    if extractor and name and extractor.get("processor_class") != name:
        fsutil.write_file(directory / PREPROCESSOR,
                          json.dumps({**extractor, "processor_class": name}, indent=2, sort_keys=True) + "\n")


def granite_speech_processor(directory: Path) -> None:
    """Granite Speech's processor files where the folder has none (its Python feature extractor needs torchaudio, so
    a repo may ship none): `preprocessor_config.json` from the model's config as `GraniteSpeechFeatureExtractor`
    writes it (its log-mel's `melspec_kwargs`: 16 kHz, 512-point FFT, 400-sample windows, 10 ms hops, half the speech
    encoder's `input_dim` mel bins, stacked in pairs; the projector's windows, which count the audio tokens), and
    `processor_config.json` naming the audio token (the tokenizer's token of `audio_token_index`), which
    transformers.js's `GraniteSpeechProcessor` requires."""
    config = read_json(directory / "config.json")
    bins = int((config.get("encoder_config") or {}).get("input_dim", 160)) // 2
    if not (directory / PREPROCESSOR).exists():
        melspec = {"sample_rate": 16000, "n_fft": 512, "win_length": 400, "hop_length": 160, "n_mels": bins}
        extractor = {"feature_extractor_type": "GraniteSpeechFeatureExtractor", "sampling_rate": 16000,
                     "feature_size": bins, "padding_value": 0.0, "melspec_kwargs": melspec,
                     **{key: melspec[key] for key in ("n_fft", "win_length", "hop_length", "n_mels")},
                     "projector_window_size": int(config.get("window_size", 15)),
                     "projector_downsample_rate": int(config.get("downsample_rate", 5))}
        fsutil.write_file(directory / PREPROCESSOR, json.dumps(extractor, indent=2, sort_keys=True) + "\n")
    processor = read_json(directory / "processor_config.json")
    if "audio_token" not in processor:
        token = _token_text(directory, config.get("audio_token_index", config.get("audio_token_id")))
        processor = {**processor, "processor_class": "GraniteSpeechProcessor", "audio_token": token or "<|audio|>"}
        fsutil.write_file(directory / "processor_config.json", json.dumps(processor, indent=2, sort_keys=True) + "\n")


def _token_text(directory: Path, token_id) -> str | None:
    """The text of the tokenizer's added token `token_id` (`tokenizer.json`), else None."""
    added = read_json(directory / "tokenizer.json").get("added_tokens") or []
    return next((row.get("content") for row in added if row.get("id") == token_id), None)


def _add_config(directory: Path, dtype: str, external: dict[str, int] | bool) -> None:
    """`config.json`'s `transformers.js_config`: the dtype of the graphs and which of them have external data."""
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["transformers.js_config"] = {"dtype": dtype, "use_external_data_format": external}
    fsutil.write_file(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
