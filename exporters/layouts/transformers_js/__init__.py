"""transformers.js's layout: `onnx/model{suffix}.onnx` (or an encoder-decoder's `onnx/encoder_model` and
`onnx/decoder_model_merged`; a vision- or audio-language model's `onnx/vision_encoder` or `onnx/audio_encoder`,
`onnx/embed_tokens` and `onnx/decoder_model_merged`) with `transformers.js_config` in `config.json`, loaded by
transformers.js on Node.js.

| module       | what it holds                                                                                    |
|--------------|--------------------------------------------------------------------------------------------------|
| `__init__`   | [`TransformersJs`]: when it applies (`"layout": "transformers.js"`), where the runtime is installed, the generation script its proof runs and its card shows (`HEADER` + `BODY`, one template) |
| `files.py`   | the folder rewritten to the layout transformers.js loads                                          |
| `dtypes.py`  | the variants as transformers.js's dtype files (`onnx/model_q4.onnx`, ...) in the one folder      |
| `proof.py`   | Node.js runs the script on the folder alone with every dtype file, against eager greedy           |
| `speech.py`  | a speech encoder-decoder (Whisper; Moonshine on the waveform): `TRANSCRIBE`, the card's script and the proof's |
| `speech_proof.py` | Node.js runs `TRANSCRIBE` on the folder alone, token for token against eager `generate()`    |
| `image_text.py` | a vision-language model (LLaVA, Idefics3, SmolVLM, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, PaliGemma, Mistral 3): `GENERATE`, the card's script and the proof's; the processor fix |
| `image_text_proof.py` | Node.js runs `GENERATE` on the folder alone, token for token against eager `generate()`  |
| `audio_text.py` | an audio-language model (Voxtral): `GENERATE`, the card's script and the proof's                  |
| `audio_text_proof.py` | Node.js runs its `GENERATE` on the folder alone, token for token against eager `generate()` |

The pinned transformers.js is looked up in `HF_EXPORT_TRANSFORMERS_JS` (a folder holding
`node_modules/@huggingface/transformers`), else the project's `.cache/transformers-js` (`make test-deps` installs it).

Example:
    >>> print(generate_script('"model/exports"', '"tjs"', [1, 2, 3], 4, "console.log(ids);", dtype="q4")[-40:])
    do_sample: false });
    console.log(ids);
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from string import Template
from typing import Any

from exporters.files import EXPORTS_DIR
from exporters.layouts.base import Layout, components_in, read_json
from exporters.layouts.card import file_names, has_tokenizer
from exporters.layouts.transformers_js import audio_text, speech
from exporters.layouts.transformers_js.image_text import CARD_EMIT, generate_script as image_text_script, is_image_text
from exporters.layouts.transformers_js.speech import CARD_FEATURES, transcribe_script
from exporters.recipe.layout import TRANSFORMERS_JS
from exporters.recipe.variants import keeps_variants

LAYOUT = TRANSFORMERS_JS  # the recipe's `layout` value
# the vision-language layout's graphs and the model types it takes (exporters.capture.image_text's and
# image_text_models', which load torch)
IMAGE_TEXT_COMPONENTS = ("vision_encoder", "embed_tokens", "decoder_model_merged")
IMAGE_TEXT_TYPES = ("llava", "idefics3", "smolvlm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "paligemma",
                    "mistral3")
AUDIO_TEXT_COMPONENTS = ("audio_encoder", "embed_tokens", "decoder_model_merged")  # the audio-language layout's
AUDIO_TEXT_TYPES = ("voxtral",)
VERSION = "4.3.2"  # the pinned @huggingface/transformers (Makefile's TJS_VERSION)
HOME_SETTING = "HF_EXPORT_TRANSFORMERS_JS"
DEFAULT_HOME = Path(__file__).resolve().parents[3] / ".cache" / "transformers-js"
# Greedy generation from a folder: the proof runs it on the target folder with eager's prompt (once per dtype file, each
# in its own block: `proof_script`), the card shows it with the published folder. Values enter only through json.dumps.
HEADER = Template("""import { env, AutoModelForCausalLM, Tensor } from '@huggingface/transformers';

env.allowRemoteModels = false;
env.localModelPath = $root;
""")
BODY = Template("""const model = await AutoModelForCausalLM.from_pretrained($name, { device: 'cpu', dtype: $dtype });
const ids = $ids;$comment
const input_ids = new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]);
const attention_mask = new Tensor('int64', BigInt64Array.from(ids.map(() => 1n)), [1, ids.length]);
const output = await model.generate({ input_ids, attention_mask, max_new_tokens: $steps, min_new_tokens: $steps, do_sample: false });
$emit
""")
DTYPES = ("fp32", "fp16", "q8", "q4", "q4f16")  # the dtypes this layout writes (exporters.recipe.variants)


def _body(name: str, ids: list[int], steps: int, emit: str, comment: str, dtype: str) -> str:
    if dtype not in DTYPES:  # a dtype read from a report enters code only as one of ours
        raise ValueError(f"unknown transformers.js dtype {dtype!r}; this layout writes {list(DTYPES)}")
    return BODY.substitute(name=name, ids=json.dumps([int(i) for i in ids]), steps=int(steps), emit=emit,
                           comment=comment, dtype=json.dumps(dtype))


def layout_dtype(dtype: str | None, method: str | None) -> str:
    """The transformers.js dtype of a single-variant target's graph: its precision and quantize method.

    Example:
        >>> layout_dtype("float16", "onnxruntime-int4"), layout_dtype(None, "onnxruntime-dynamic")
        ('q4f16', 'q8')
    """
    if method == "onnxruntime-int4":
        return "q4f16" if dtype == "float16" else "q4"
    if method == "onnxruntime-dynamic":
        return "q8"
    return "fp16" if dtype == "float16" else "fp32"


SUFFIXES = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "q4": "_q4", "q4f16": "_q4f16"}  # transformers.js's


def graph_names(files: set[str]) -> set[str]:
    """`files` with each `onnx/` dtype file also under its graph's plain name (a dtype's suffix cut).

    Example:
        >>> sorted(graph_names({"onnx/encoder_model_fp16.onnx", "config.json"}))
        ['config.json', 'onnx/encoder_model.onnx', 'onnx/encoder_model_fp16.onnx']
    """
    plain = set(files)
    for name in files:
        for suffix in filter(None, SUFFIXES.values()):
            if name.startswith("onnx/") and name.endswith(f"{suffix}.onnx"):
                plain.add(name.removesuffix(f"{suffix}.onnx") + ".onnx")
    return plain


def generate_script(root: str, name: str, ids: list[int], steps: int, emit: str, comment: str = "",
                    dtype: str = "fp32") -> str:
    """The header and one `BODY` filled: `root` and `name` already JSON strings, `ids` and `steps` our ints, `emit`
    our line, `dtype` one of `DTYPES`."""
    return HEADER.substitute(root=root) + _body(name, ids, steps, emit, comment, dtype)


def proof_script(root: str, name: str, ids: list[int], steps: int, dtypes: list[str], emit: str) -> str:
    """One Node script that generates with every dtype file in turn (each `BODY` in its own block, `emit` given the
    `dtype` variable and the `output`), then runs `emit`'s final line `DONE`.

    Example:
        >>> script = proof_script('"/m"', '"tjs"', [1], 2, ["fp32", "q4"], "results[dtype] = output;")
        >>> script.count("from_pretrained"), 'dtype: "q4"' in script
        (2, True)
    """
    blocks = [f"{{\nconst dtype = {json.dumps(dtype)};\n" + _body(name, ids, steps, emit, "", dtype) + "}\n"
              for dtype in dtypes]
    return HEADER.substitute(root=root) + "const results = {};\n" + "".join(blocks)


def home() -> Path:
    """Where the pinned transformers.js is installed: `HF_EXPORT_TRANSFORMERS_JS`, else `.cache/transformers-js`."""
    return Path(os.environ.get(HOME_SETTING) or DEFAULT_HOME)


class TransformersJs(Layout):
    """transformers.js generating from a folder in its layout, on Node.js."""

    runtime = "transformers.js"  # the runtime's name (the recipe's layout value is the same word)
    install = (f"install Node.js and @huggingface/transformers {VERSION} (`make test-deps` puts it in "
               f".cache/transformers-js; or set {HOME_SETTING} to a folder holding node_modules/@huggingface/"
               "transformers)")

    def may_apply(self, target: Any, components: list[str]) -> bool:
        return target.export_format == "onnx" and getattr(target, "layout", None) == LAYOUT

    def declines(self, target: Any, directory: Path) -> str | None:
        if getattr(target, "mode", None) != "generation":  # one graph (CLIP's towers too): files.py
            return None
        config = read_json(Path(directory) / "config.json")
        components = set(components_in(directory))
        # an audio encoder's config: `audio_config`, or Granite Speech's `encoder_config` beside its `text_config`
        hears = bool(config.get("audio_config")) or bool(config.get("encoder_config") and config.get("text_config"))
        if hears and not config.get("vision_config") and components != set(AUDIO_TEXT_COMPONENTS):
            return (f"transformers.js's audio-language layout takes Voxtral (model types {list(AUDIO_TEXT_TYPES)}, "
                    f"375 audio tokens a chunk, a dynamic cache); this {config.get('model_type')!r} export keeps its "
                    "audio-language components (the findings say why)")
        if is_image_text({str(p.relative_to(directory)) for p in Path(directory).glob("onnx/*.onnx")}) and \
                not (Path(directory) / "preprocessor_config.json").is_file():
            # the folder written (`files.py`) from a repo that ships no image processor: nothing for its processor
            return (f"transformers.js's AutoProcessor loads the image processor from the folder's "
                    f"preprocessor_config.json, and this {config.get('model_type')!r} repo ships none (no "
                    "preprocessor_config.json, no image_processor in processor_config.json): add the model's "
                    "processor (`processor.save_pretrained`) to the repo")
        if "vision_config" not in config or components == set(IMAGE_TEXT_COMPONENTS):
            return None
        return (f"transformers.js's vision-language layout takes LLaVA-style and Qwen2-VL-style models (model types "
                f"{list(IMAGE_TEXT_TYPES)}, one image's pixels, a dynamic cache); this {config.get('model_type')!r} "
                "export keeps its vision-language components (the findings say why)")

    def write_files(self, directory: Path, target: Any, model: Any, notes: list[str]) -> None:
        if self.may_apply(target, []) and not self.declines(target, directory):
            self.part("files").write_transformers_js(directory, target, model)
            if keeps_variants(target):
                self.part("dtypes").write_dtype_files(directory, target)

    def snippet(self, repo_id: str, target: dict[str, Any], revision: str | None) -> tuple[str, str]:
        sub = f"{EXPORTS_DIR}/{target['name']}"
        pinned = f" --revision {json.dumps(revision)}" if revision else ""
        download = f"// after: hf download {json.dumps(repo_id)}{pinned} --include {json.dumps(sub + '/*')} --local-dir model\n"
        names = graph_names(file_names(target))  # a float16 target's `_fp16` files name the same layout
        files = [row for row in target.get("dtype_files") or [] if row.get("dtype") in DTYPES]
        listing = "".join(f"//   dtype {json.dumps(row['dtype'])}: {_megabytes(row.get('bytes'))}, {_quality(row)}\n"
                          for row in files)
        if listing:
            listing = "// dtype files in onnx/ (pass one as `dtype`):\n" + listing
        default = [row["dtype"] for row in files if row.get("default") is True]  # the folder's own (config.json)
        chosen = (default or [files[0]["dtype"]])[0] if files else None  # None: no dtype files (the config's)
        root, name = json.dumps(f"model/{EXPORTS_DIR}"), json.dumps(str(target["name"]))
        if {"onnx/encoder_model.onnx", "preprocessor_config.json"} <= names:  # Whisper: speech.py
            return "js", download + listing + transcribe_script(
                root, name, CARD_FEATURES, 32, speech.CARD_TEXT if has_tokenizer(target) else speech.CARD_IDS, chosen)
        if is_image_text(names):  # a vision-language model: image_text.py
            return "js", download + listing + image_text_script(root, name, 32, "", CARD_EMIT, dtype=chosen)
        if audio_text.is_audio_text(names):  # an audio-language model: audio_text.py
            return "js", download + listing + audio_text.generate_script(root, name, 32, "", audio_text.CARD_EMIT,
                                                                         dtype=chosen)
        quantization = target.get("quantization") or {}
        dtype = chosen or layout_dtype(target.get("dtype"), quantization.get("method"))
        return "js", download + listing + generate_script(
            root, name, [1, 2, 3], 32, "console.log(Array.from(output.data, Number));", "  // your prompt's token ids",
            dtype if dtype in DTYPES else "fp32")


def _megabytes(size: Any) -> str:
    """A file's size for the card (the graph and its data), from the report's byte count."""
    return f"{size / 1e6:.2f} MB" if isinstance(size, int) and not isinstance(size, bool) else "size unknown"


def _quality(row: dict[str, Any]) -> str:
    """A dtype file's quality for the card's listing: numbers formatted here, nothing else from the report."""
    quality = row.get("quality") or {}
    metrics = quality.get("metrics") or {}
    words = [f"{label} {float(metrics[key]):{form}}" for key, label, form in (
        ("top1_agreement", "top-1", ".3f"), ("kl", "KL", ".2g"), ("greedy_match", "greedy", ".0f"))
        if isinstance(metrics.get(key), (int, float)) and not isinstance(metrics.get(key), bool)]
    if quality.get("judged_by") == "tolerance" or row.get("dtype") == "fp32":
        return "within atol/rtol of eager" if row.get("status") == "passed" else "not passed"
    return ", ".join(words) or "quality not measured"
