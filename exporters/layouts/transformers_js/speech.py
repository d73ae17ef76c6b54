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
its extractor gives `input_values` `[1, samples]`, as long as the audio where the target's encoder was exported
with the waveform axis dynamic (`dynamic: true`).

Example:
    >>> "AutoModelForSpeechSeq2Seq" in transcribe_script('"model"', '"tjs"', CARD_FEATURES, 4, "console.log(1);")
    True
"""

from __future__ import annotations

from string import Template
from typing import Any

from exporters.layouts.transformers_js.image_text import dtype_option

# Values enter only through json.dumps or as our ints and lines.
TRANSCRIBE = Template("""import { env, AutoFeatureExtractor, AutoModelForSpeechSeq2Seq, Tensor } from '@huggingface/transformers';

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
EMIT = ("import { writeFileSync } from 'node:fs';\n"
        "writeFileSync(JSON.parse(process.argv[2]).result, JSON.stringify(Array.from(output.data, Number)));")


def transcribe_script(root: str, name: str, features: str, steps: int, emit: str, dtype: str | None = None) -> str:
    """`TRANSCRIBE` filled: `root` and `name` JSON strings, `features` our lines (`$name` in them is the folder's
    name), `steps` our int, `emit` our line, `dtype` the dtype files to load (`image_text.dtype_option`)."""
    return TRANSCRIBE.substitute(root=root, name=name, features=Template(features).safe_substitute(name=name),
                                 steps=int(steps), emit=emit, dtype=dtype_option(dtype))


WAVEFORM_TYPES = ("moonshine",)  # speech encoder-decoders transformers.js 4.3.2 generates from the raw waveform


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

