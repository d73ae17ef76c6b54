"""transformers.js's speech layout: a Whisper-style encoder-decoder (or Moonshine, on the raw waveform) as
transformers.js's `AutoModelForSpeechSeq2Seq` loads it, `onnx/encoder_model.onnx` + `onnx/decoder_model_merged.onnx` (written by `files.py`) with the folder's
`preprocessor_config.json`, tokenizer and `generation_config.json` beside them; proven (`speech_proof.py`) by Node
running `TRANSCRIBE` (the card's script) on the folder alone, its greedy tokens eager `generate()`'s.

```
reference(model)                                        prove(folder)
eager generate(input_features, max_new_tokens =          node script.mjs: the same features as a Tensor ─►
(Moonshine: input_values, the waveform)
min_new_tokens = n, greedy) ─► the last n tokens         AutoModelForSpeechSeq2Seq.from_pretrained(folder).generate
```

The proof feeds the spectrogram eager ran on (written to a scratch file), so the comparison is of the graphs and
transformers.js's generation loop, not of two feature extractors; the card's script makes the features with the
folder's own `AutoFeatureExtractor` from audio (a tone in the example). Moonshine (`MoonshineForConditionalGeneration`:
its `main_input_name` is `input_values`, which `generate({ inputs })` feeds the encoder) takes the waveform itself:
its extractor gives `input_values` `[1, samples]`, as long as the audio: the target's encoder is exported with the
waveform axis dynamic by default ([`waveform_kept_dynamic`]: as with `dynamic: true`, unless the recipe sets
`dynamic` or `dynamic_shapes`).

Example:
    >>> "AutoModelForSpeechSeq2Seq" in transcribe_script('"model"', '"tjs"', CARD_FEATURES, 4, "console.log(1);")
    True
"""

from __future__ import annotations

from string import Template
from typing import Any

from exporters.layouts.transformers_js.image_text import dtype_option
from exporters.recipe.layout import TRANSFORMERS_JS as LAYOUT

# Values enter only through json.dumps or as our ints and lines.
TRANSCRIBE = Template("""import { env, AutoFeatureExtractor, AutoModelForSpeechSeq2Seq, AutoTokenizer, Tensor } from '@huggingface/transformers';

env.allowRemoteModels = false;
env.localModelPath = $root;
$features
const model = await AutoModelForSpeechSeq2Seq.from_pretrained($name, { device: 'cpu'$dtype });
const output = await model.generate({ inputs: input_features, max_new_tokens: $steps, min_new_tokens: $steps, do_sample: false, num_beams: 1 });
$emit
""")
# The card's features: the folder's feature extractor on your audio (here one second of a 440 Hz tone)
CARD_FEATURES = """const extractor = await AutoFeatureExtractor.from_pretrained($name);
const rate = extractor.config.sampling_rate;
const audio = Float32Array.from({ length: rate }, (_, i) => 0.5 * Math.sin(2 * Math.PI * 440 * i / rate));  // your audio
const extracted = await extractor(audio);
const input_features = extracted.input_features ?? extracted.input_values;  // Whisper's spectrogram, Moonshine's waveform"""
# The proof's features: the spectrogram eager ran on, from the scratch file the proof wrote
PROOF_FEATURES = """import { readFileSync } from 'node:fs';
const spec = JSON.parse(process.argv[2]);
const sample = JSON.parse(readFileSync(spec.features, 'utf-8'));
const input_features = new Tensor('float32', Float32Array.from(sample.data), sample.shape);"""
# What the card prints: the transcription, the ids decoded by the folder's own tokenizer (special tokens skipped:
# the decoder prompt's start, language and task); a folder without a tokenizer (the repo ships none): the ids.
# `$name` in it is the folder's name
CARD_TEXT = """const tokenizer = await AutoTokenizer.from_pretrained($name);
console.log(tokenizer.batch_decode(output, { skip_special_tokens: true })[0]);  // the transcription"""
CARD_IDS = "console.log(JSON.stringify(Array.from(output.data, Number)));  // the folder has no tokenizer: the ids"
EMIT = ("import { writeFileSync } from 'node:fs';\n"
        "writeFileSync(JSON.parse(process.argv[2]).result, JSON.stringify(Array.from(output.data, Number)));")


def transcribe_script(root: str, name: str, features: str, steps: int, emit: str, dtype: str | None = None) -> str:
    """`TRANSCRIBE` filled: `root` and `name` JSON strings, `features` and `emit` our lines (`$name` in them is the
    folder's name), `steps` our int, `dtype` the dtype files to load (`image_text.dtype_option`)."""
    return TRANSCRIBE.substitute(root=root, name=name, features=Template(features).safe_substitute(name=name),
                                 steps=int(steps), emit=Template(emit).safe_substitute(name=name),
                                 dtype=dtype_option(dtype))


WAVEFORM_TYPES = ("moonshine",)  # speech encoder-decoders transformers.js 4.3.2 generates from the raw waveform
# speech encoder-decoders transformers.js 4.3.2 maps to a class it cannot generate from: SpeechT5ForSpeechToText names
# no `main_input_name` (Moonshine's class names `input_values`), so `generate({ inputs })` feeds the encoder `input_ids`
# and the session stops ("Missing the following inputs: input_values"); docs/upstream-gaps.md
UNFED_TYPES = ("speecht5",)
UNFED = ("transformers.js 4.3.2 cannot generate from this {model_type!r} folder: its SpeechT5ForSpeechToText class names "
         "no main input, so generate() feeds the encoder `input_ids`, never the waveform `input_values` the encoder "
         "takes (its Moonshine class names it); the folder's files are transformers.js's speech layout all the same")


WAVEFORM_KEPT = ("the encoder takes audio of any length, as transformers.js's speech pipeline feeds it (the target is "
                 "exported as with `dynamic: true`: the waveform's samples and the encoder's states that follow from "
                 "them are dynamic; set `dynamic: false` for a waveform fixed at the traced length)")


def waveform_kept_dynamic(target: Any, model_config: Any) -> str | None:
    """Give a transformers.js generation target of a waveform speech encoder-decoder (Moonshine) the encoder that
    takes audio of any length: exported as with `dynamic: true`, unless the recipe set `dynamic` or `dynamic_shapes`
    (the target's or a component's); `model_config` is the model's config or its dict. Without it the waveform axis
    keeps its traced length (one second) and transformers.js fails on audio of any other. Returns the report's note,
    or None when nothing changed.

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> plain = '{"export_format": "onnx", "mode": "generation", "layout": "transformers.js"}'
        >>> target, moonshine = parse_recipe(plain).exports[0], {"is_encoder_decoder": True, "model_type": "moonshine"}
        >>> waveform_kept_dynamic(target, moonshine) == WAVEFORM_KEPT, target.dynamic
        (True, True)
        >>> fixed = parse_recipe('{"export_format": "onnx", "mode": "generation", "layout": "transformers.js", '
        ...                      '"dynamic": false}').exports[0]
        >>> waveform_kept_dynamic(fixed, moonshine), fixed.dynamic
        (None, False)
        >>> whisper = parse_recipe(plain).exports[0]
        >>> waveform_kept_dynamic(whisper, {"is_encoder_decoder": True, "num_mel_bins": 80}), whisper.dynamic
        (None, False)
    """
    if target.export_format != "onnx" or target.mode != "generation" or getattr(target, "layout", None) != LAYOUT:
        return None
    model_config = model_config if isinstance(model_config, dict) else model_config.to_dict()  # a model's config
    if model_config.get("model_type") not in WAVEFORM_TYPES or not is_speech(model_config):
        return None
    if target.chose_shapes():
        return None
    target.dynamic = True
    return WAVEFORM_KEPT


def waveform_as_recorded(target: Any, manifest: dict[str, Any]) -> None:
    """Re-validating a saved transformers.js encoder-decoder folder: a target whose recipe leaves `dynamic` unset is
    validated with the encoder it was exported with, as its export.json records it (the encoder's
    `export_config.dynamic`), not with today's default ([`waveform_kept_dynamic`]): a Moonshine folder exported with
    the waveform fixed (before that default) is validated at its traced length.

    Example:
        >>> from exporters.recipe.load import parse_recipe
        >>> older = parse_recipe('{"export_format": "onnx", "mode": "generation", "layout": "transformers.js"}')
        >>> target = older.exports[0]
        >>> fixed = {"components": {"encoder": {"metadata": {"export_config": {"dynamic": False}}}}}
        >>> waveform_as_recorded(target, fixed)
        >>> waveform_kept_dynamic(target, {"is_encoder_decoder": True, "model_type": "moonshine"}), target.dynamic
        (None, False)
    """
    if target.export_format != "onnx" or getattr(target, "layout", None) != LAYOUT:
        return
    if target.chose_shapes():
        return
    encoder = (manifest.get("components") or {}).get("encoder") or {}
    if ((encoder.get("metadata") or {}).get("export_config") or {}).get("dynamic") is False:
        target.dynamic = False  # set, so that today's default no longer applies


def is_speech(model_config: dict[str, Any]) -> bool:
    """Whether a folder's config is a speech encoder-decoder transformers.js generates from a spectrogram (Whisper)
    or a waveform (Moonshine).

    Example:
        >>> is_speech({"is_encoder_decoder": True, "num_mel_bins": 80}), is_speech({"is_encoder_decoder": True})
        (True, False)
        >>> is_speech({"is_encoder_decoder": True, "model_type": "moonshine"})
        True
    """
    return bool(model_config.get("is_encoder_decoder")) and (
        "num_mel_bins" in model_config or model_config.get("model_type") in WAVEFORM_TYPES)

