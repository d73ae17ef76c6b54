"""transformers.js's vision-language layout: a LLaVA, Idefics3, SmolVLM, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3,
PaliGemma or Mistral 3 model as transformers.js's `AutoModelForImageTextToText` loads it, `onnx/vision_encoder.onnx` + `onnx/embed_tokens.onnx` +
`onnx/decoder_model_merged.onnx` (the graphs of
`exporters.capture.image_text`, moved and named by `files.py`) with the folder's processor, tokenizer and
`generation_config.json` beside them; proven (`image_text_proof.py`) by Node running `GENERATE` (the card's script)
on the folder alone.

```
reference(model)                                     prove(folder)
eager generate(input_ids, pixel_values,              node script.mjs: AutoProcessor on an image of the processor's
max_new_tokens = min_new_tokens = n, greedy)         size + the image token and a prompt (its pixels' shape and image
  ─► every token                                     tokens must be eager's sample's), then the sample's own ids and
                                                     pixels ─► AutoModelForImageTextToText.generate ─► eager's tokens
```

The proof feeds the pixels eager ran on, so the comparison is of the graphs and transformers.js's generation loop
(embedding, the image features' merge, the cache), not of two image resizers; the processor is proven to make inputs
of the same shape and image-token count. LLaVA's processor counts its image tokens from `num_additional_image_tokens`
alone in transformers.js and minus the class token (`vision_feature_select_strategy` "default") in transformers: the
layout writes the folder's `processor_config.json` with the count both read alike ([`processor_fix`]).

A Qwen2-VL, Qwen2.5-VL or Qwen3-VL (`Qwen2VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration`,
`Qwen3VLForConditionalGeneration`; a Qwen3-VL's DeepStack features in the rows: `exporters.capture.qwen_vl.widened`): the prompt is
`<|vision_start|><|image_pad|><|vision_end|>` and the text (its processor expands the image token to the grid's
count); the proof also feeds the sample's `image_grid_thw` and checks the processor's grid; transformers.js computes
the 3-D positions itself (its `get_rope_index`). The folder's `preprocessor_config.json` pins the processor's pixel
bounds to the traced image's (`files.qwen_vl_files`): the card's square image, and any square image, becomes the grid
the vision encoder was traced at. One image a prompt: the vision encoder is traced for one image's grid, and
transformers.js 4.3.2's `Qwen2VLImageProcessor` stacks two images of one size as one image's two frames
(docs/upstream-gaps.md).

A Gemma 3 (`Gemma3ForConditionalGeneration`, transformers.js's LLaVA class: its decoder is fed embeddings, a mask and
positions counted from 1, no token types): the prompt is the processor's begin-of-image token, which its
`Gemma3Processor` expands to the image's tokens; transformers attends both ways among them (from the processor's
`token_type_ids`), which the graphs hold by marking the image's rows in one channel more than the hidden size
(`exporters.capture.image_text.marked`); the eager reference is given the sample's `token_type_ids`, as transformers
runs Gemma 3. transformers.js's `Gemma3Processor` loads the folder's `chat_template.jinja` and fails without it: the
layout writes it from the model's `tokenizer_config.json` or `chat_template.json` where the model has none
([`chat_template`]).

A PaliGemma (`PaliGemmaForConditionalGeneration`, transformers.js's LLaVA class too): its `PaliGemmaProcessor` takes
the image first and `<image>` (its constant) in the text; its decoder reads each call's rows both ways
(`exporters.capture.image_text.EmbedsDecoder`), as transformers reads PaliGemma's prompt, its prefix.

A Mistral 3 (`Mistral3ForConditionalGeneration`, transformers.js's LLaVA class too): its `PixtralProcessor` takes the
image first and lays its tokens out in rows, `[IMG]` x cols then `[IMG_BREAK]`, the last row ending `[IMG_END]`;
transformers.js puts the image's features at the `[IMG]` tokens alone, the break rows being the prompt's own
embeddings, as the model's forward does. Its vision encoder takes one image's pixels at the traced size (its
`image_sizes` baked in: `exporters.upstream.fixed_image.PixtralVision`); the folder's processor files name
`PixtralProcessor` with the patch and merge sizes its resize reads and the traced image's longest edge, so any
square image becomes that size (`files.pixtral_files`). The proof also checks that the processor lays the image's
tokens out in the rows of eager's prompt.

Example:
    >>> "AutoModelForImageTextToText" in generate_script('"model"', '"tjs"', 4, "", "console.log(1);")
    True
"""

from __future__ import annotations

import json
from string import Template
from typing import Any

from exporters.layouts.card import PROMPT
from exporters.recipe.variants import TRANSFORMERS_JS_DTYPES

IMAGE_TEXT_FILES = ("onnx/vision_encoder.onnx", "onnx/embed_tokens.onnx", "onnx/decoder_model_merged.onnx")
# Values enter only through json.dumps or as our ints and lines.
GENERATE = Template("""import { env, AutoProcessor, AutoModelForImageTextToText, LlavaProcessor, PaliGemmaProcessor, PixtralProcessor, Qwen2VLProcessor, RawImage, Tensor } from '@huggingface/transformers';

env.allowRemoteModels = false;
env.localModelPath = $root;
const processor = await AutoProcessor.from_pretrained($name);
const model = await AutoModelForImageTextToText.from_pretrained($name, { device: 'cpu'$dtype });
const config = processor.image_processor.config;
const pinned = config.max_pixels && Math.round(Math.sqrt(config.max_pixels));  // Qwen-VL: the traced image's pixels
const side = config.crop_size?.height ?? config.size?.height ?? pinned ?? config.size?.shortest_edge ?? config.size?.longest_edge;
const image = new RawImage(new Uint8ClampedArray(side * side * 3).fill(128), side, side, 3);  // your image: await RawImage.read(path)
const token = processor.image_token ?? processor.config.image_token ?? processor.constructor.image_token ?? '<image>';  // PaliGemma's
const marked = processor instanceof Qwen2VLProcessor ? `<|vision_start|>$${token}<|vision_end|>` : processor.boi_token ?? token;  // Gemma 3's expands its boi token
const text = marked + $prompt;  // the image, then your prompt
const inputs = [LlavaProcessor, PaliGemmaProcessor, PixtralProcessor].some((kind) => processor instanceof kind) ? await processor(image, text) : await processor(text, image);  // image first
$feed
const output = await model.generate({ ...inputs, max_new_tokens: $steps, min_new_tokens: $steps, do_sample: false });
$emit
""")
CARD_EMIT = "console.log(processor.batch_decode(output, { skip_special_tokens: true })[0]);"
# The prompt's ids eager ran on, in place of the processor's (both multimodal proofs)
SAMPLE_IDS = """inputs.input_ids = new Tensor('int64', BigInt64Array.from(sample.ids.map(BigInt)), [1, sample.ids.length]);
inputs.attention_mask = new Tensor('int64', BigInt64Array.from(sample.ids.map(() => 1n)), [1, sample.ids.length]);"""
# The proof's inputs: what the processor made is recorded, then the sample eager ran on takes its place
PROOF_FEED = """import { readFileSync, writeFileSync } from 'node:fs';
const spec = JSON.parse(process.argv[2]);
const sample = JSON.parse(readFileSync(spec.sample, 'utf-8'));
const processed = { pixels: inputs.pixel_values.dims, ids: Array.from(inputs.input_ids.data, Number),
                    grid: inputs.image_grid_thw ? Array.from(inputs.image_grid_thw.data, Number) : null };
""" + SAMPLE_IDS + """
inputs.pixel_values = new Tensor('float32', Float32Array.from(sample.pixels), sample.shape);
if (sample.grid) inputs.image_grid_thw = new Tensor('int64', BigInt64Array.from(sample.grid.map(BigInt)), [1, 3]);
if (sample.mask) inputs.pixel_attention_mask = new Tensor('bool', Uint8Array.from(sample.mask), sample.mask_shape);"""
PROOF_EMIT = ("writeFileSync(spec.result, JSON.stringify({ tokens: Array.from(output.data, Number), "
              "processed }));")


def generate_script(root: str, name: str, steps: int, feed: str, emit: str, prompt: str = PROMPT,
                    dtype: str | None = None) -> str:
    """`GENERATE` filled: `root` and `name` JSON strings, `steps` our int, `feed` and `emit` our lines, `prompt`
    text (entered through json.dumps), `dtype` the dtype files to load (`dtype_option`)."""
    return GENERATE.substitute(root=root, name=name, steps=int(steps), feed=feed, emit=emit,
                               prompt=json.dumps(str(prompt)), dtype=dtype_option(dtype))


def dtype_option(dtype: str | None) -> str:
    """The `from_pretrained` option that loads a folder's dtype files (`, dtype: "q4"`), or none where `dtype` is
    None (the dtype `config.json` names); a dtype enters code only as one of transformers.js's that we write.

    Example:
        >>> dtype_option("q4"), dtype_option(None)
        (', dtype: "q4"', '')
    """
    if dtype is None:
        return ""
    if dtype not in {row[0] for row in TRANSFORMERS_JS_DTYPES.values()}:
        raise ValueError(f"unknown transformers.js dtype {dtype!r}")
    return f", dtype: {json.dumps(dtype)}"


def processor_fix(processor: dict[str, Any], model_config: dict[str, Any]) -> dict[str, Any] | None:
    """A LLaVA `processor_config.json` whose image-token count transformers.js and transformers read alike, where
    they differ (see the module): the class token dropped from `num_additional_image_tokens` and the strategy
    "full" in the processor's file (the model's config keeps its own); None where they agree already.

    Example:
        >>> processor_fix({"num_additional_image_tokens": 1, "vision_feature_select_strategy": "default"}, {})
        {'num_additional_image_tokens': 0, 'vision_feature_select_strategy': 'full'}
        >>> processor_fix({"num_additional_image_tokens": 0, "vision_feature_select_strategy": "full"}, {}) is None
        True
    """
    strategy = processor.get("vision_feature_select_strategy", model_config.get("vision_feature_select_strategy"))
    extra = processor.get("num_additional_image_tokens")
    if strategy != "default" or not isinstance(extra, int) or extra < 1:
        return None
    return {**processor, "num_additional_image_tokens": extra - 1, "vision_feature_select_strategy": "full"}


def chat_template(tokenizer_config: dict[str, Any], chat_template_json: dict[str, Any]) -> str | None:
    """The model's chat template as text, for the folder's `chat_template.jinja` where the model holds it only in
    `tokenizer_config.json` or `chat_template.json`: transformers.js's `Gemma3Processor` loads the `.jinja` file and
    will not load without it. None where the model has no template as one string.

    Example:
        >>> chat_template({"chat_template": "{{ bos_token }}"}, {}), chat_template({}, {"chat_template": ["x"]})
        ('{{ bos_token }}', None)
    """
    for source in (chat_template_json, tokenizer_config):
        if isinstance(source.get("chat_template"), str):
            return source["chat_template"]
    return None


def is_image_text(files: set[str]) -> bool:
    """Whether a target's files are this layout's (its card shows `GENERATE`).

    Example:
        >>> is_image_text(set(IMAGE_TEXT_FILES) | {"config.json"}), is_image_text({"onnx/model.onnx"})
        (True, False)
    """
    return set(IMAGE_TEXT_FILES) <= files
