"""transformers.js's audio-language layout: a Voxtral or a Granite Speech as transformers.js's
`AutoModelForAudioTextToText` loads it,
`onnx/audio_encoder.onnx` + `onnx/embed_tokens.onnx` + `onnx/decoder_model_merged.onnx` (the graphs of
`exporters.capture.image_text`, moved and named by `files.py`) with the folder's feature extractor
(`preprocessor_config.json`, naming its processor), tokenizer and `generation_config.json` beside them; proven
(`audio_text_proof.py`) by Node running `GENERATE` (the card's script) on the folder alone.

```
reference(model)                                     prove(folder)
eager generate(input_ids, input_features,            node script.mjs: AutoProcessor on a tone as long as one chunk
max_new_tokens = min_new_tokens = n, greedy)         of its extractor + the audio token and a prompt (its features'
  ─► every token                                     shape and audio tokens must be eager's sample's), then the
                                                     sample's own ids and features ─►
                                                     AutoModelForAudioTextToText.generate ─► eager's tokens
```

The proof feeds the features eager ran on, so the comparison is of the graphs and transformers.js's generation loop
(embedding, the audio features' merge, the cache), not of two feature extractors; the processor is proven to make
inputs of the same shape and audio-token count. Voxtral's audio encoder takes any number of chunks (`num_chunks`):
the proof runs the sample's one chunk, then two (the sample's features and the same rolled by half a chunk, their
audio tokens one run after another), each against eager. Granite Speech's takes features as long as the audio (its
folder's processor files written from the model's config, `files.granite_speech_processor`): the proof runs the
sample's, then features half again as long (`exporters.capture.image_text.longer_audio`; the processor's on a tone
of that length must match their shape and audio-token count), each against eager.

Example:
    >>> "AutoModelForAudioTextToText" in generate_script('"model"', '"tjs"', 4, "", "console.log(1);")
    True
"""

from __future__ import annotations

import json
from string import Template

from exporters.layouts.card import PROMPT
from exporters.layouts.transformers_js.image_text import CARD_EMIT, PROOF_EMIT, SAMPLE_IDS, dtype_option  # the same JS

AUDIO_TEXT_FILES = ("onnx/audio_encoder.onnx", "onnx/embed_tokens.onnx", "onnx/decoder_model_merged.onnx")
# VoxtralProcessor's: where the audio goes in the text (its AUDIO_TOKEN); a processor config's `audio_token` first
# (GraniteSpeechProcessor's)
AUDIO_TOKEN = "[AUDIO]"
# Values enter only through json.dumps or as our ints and lines.
GENERATE = Template("""import { env, AutoProcessor, AutoModelForAudioTextToText, Tensor } from '@huggingface/transformers';

env.allowRemoteModels = false;
env.localModelPath = $root;
const processor = await AutoProcessor.from_pretrained($name);
const model = await AutoModelForAudioTextToText.from_pretrained($name, { device: 'cpu'$dtype });
const { sampling_rate, n_samples = sampling_rate } = processor.feature_extractor.config;
const tone = (length) => Float32Array.from({ length }, (_, i) => 0.5 * Math.sin(2 * Math.PI * 440 * i / sampling_rate));
const audio = tone(n_samples);  // your audio at sampling_rate
const text = (processor.config.audio_token ?? $token) + $prompt;  // the audio, then your prompt
const inputs = await processor(text, audio);  // any length: Voxtral's in chunks of n_samples
$feed
const output = await model.generate({ ...inputs, max_new_tokens: $steps, min_new_tokens: $steps, do_sample: false });
$emit
""")
# The proof's inputs: what the processor made of as many chunks of the tone as the sample has is recorded, then the
# sample eager ran on takes its place
PROOF_FEED = """import { readFileSync, writeFileSync } from 'node:fs';
const spec = JSON.parse(process.argv[2]);
const sample = JSON.parse(readFileSync(spec.sample, 'utf-8'));
const key = 'audio_values' in inputs ? 'audio_values' : 'input_features';
const length = spec.samples ?? n_samples * sample.shape[0];  // the audio the sample's features are of
const made = length === n_samples ? inputs : await processor(text, tone(length));
const processed = { features: made[key].dims, ids: Array.from(made.input_ids.data, Number) };
""" + SAMPLE_IDS + """
inputs[key] = new Tensor('float32', Float32Array.from(sample.features), sample.shape);"""


def generate_script(root: str, name: str, steps: int, feed: str, emit: str, prompt: str = PROMPT,
                    dtype: str | None = None) -> str:
    """`GENERATE` filled: `root` and `name` JSON strings, `steps` our int, `feed` and `emit` our lines, `prompt`
    text (entered through json.dumps), `dtype` the dtype files to load (`image_text.dtype_option`)."""
    return GENERATE.substitute(root=root, name=name, steps=int(steps), feed=feed, emit=emit,
                               token=json.dumps(AUDIO_TOKEN), prompt=json.dumps(str(prompt)),
                               dtype=dtype_option(dtype))


def is_audio_text(files: set[str]) -> bool:
    """Whether a target's files are this layout's (its card shows `GENERATE`).

    Example:
        >>> is_audio_text(set(AUDIO_TEXT_FILES) | {"config.json"}), is_audio_text({"onnx/model.onnx"})
        (True, False)
    """
    return set(AUDIO_TEXT_FILES) <= files
